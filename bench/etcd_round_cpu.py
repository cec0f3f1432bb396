#!/usr/bin/env python3
"""CPU of an etcd rendezvous round, all of it (docs/performance.md,
"Rendezvous on etcd"): N agents on this machine, one `true` worker each,
against a 1-member etcd on tmpfs, as bench/etcd_rendezvous_bench.py runs
them; per run the CPU of the agents with their helpers and workers
(RUSAGE_CHILDREN: each agent waits for its children) per agent, etcd's
CPU (/proc), the rendezvous time, and from etcd's /metrics the watch
events it sent and the watch streams it served per agent. CPU is steadier
than wall time on a loaded machine.

Each VARIANT is LABEL=HELPER (a dlaunch-rdzv-etcd, run through
$DLAUNCH_RDZV_ETCD by the same dlaunch) or LABEL=c10d; the variants
alternate within each of --rounds rounds, and the medians close.

Run: python3 bench/etcd_round_cpu.py --build build --n 64 --rounds 4 \
       before=/work/before-s8/bin/dlaunch-rdzv-etcd \
       after=build/bin/dlaunch-rdzv-etcd c10d=c10d
"""
import argparse
import os
import re
import statistics
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_rendezvous_bench import etcd_agent, etcd_on_tmpfs  # noqa
from rendezvous_bench import dlaunch_agent, free_port, rendezvous_time  # noqa
from etcd_helper_profile import children_cpu, cpu_of  # noqa


def metrics(endpoint):
    """etcd's watch events sent and watch streams started so far."""
    text = urllib.request.urlopen(f"http://{endpoint}/metrics",
                                  timeout=10).read().decode()

    def total(pattern):
        return sum(float(m) for m in re.findall(
            "^" + pattern + r"\S* (\S+)$", text, re.MULTILINE))
    return (total(r"etcd_debugging_mvcc_events_total"),
            total(r'grpc_server_started_total\{grpc_method="Watch"'))


def one_run(build, n, helper, endpoint, etcd_pid, run_id):
    with tempfile.TemporaryDirectory() as d:
        stamps = f"{d}/stamps"
        if helper == "c10d":
            port = free_port()
            cmds = [dlaunch_agent(build, i, str(n), port, run_id, stamps)
                    for i in range(n)]
            env = None
        else:
            cmds = [etcd_agent(build, i, str(n), endpoint, run_id, stamps)
                    for i in range(n)]
            env = dict(os.environ, DLAUNCH_RDZV_ETCD=helper)
        m0 = metrics(endpoint)
        c0, e0 = children_cpu(), cpu_of(etcd_pid)
        took = rendezvous_time(cmds, stamps, n, 300, env)
        c1, e1 = children_cpu(), cpu_of(etcd_pid)
        m1 = metrics(endpoint)
    return ((c1 - c0) / n * 1000, e1 - e0, took, (m1[0] - m0[0]) / n,
            (m1[1] - m0[1]) / n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build",
                    help="the dlaunch build whose bin/dlaunch runs")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("variants", nargs="+", help="LABEL=HELPER or LABEL=c10d")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    variants = []
    for v in args.variants:
        label, _, helper = v.partition("=")
        variants.append((label, helper if helper == "c10d"
                         else os.path.abspath(helper)))
    results = {label: [] for label, _ in variants}
    with etcd_on_tmpfs() as (etcd, endpoint):
        for k in range(args.rounds):
            for label, helper in variants:
                load = os.getloadavg()[0]
                r = one_run(build, args.n, helper, endpoint, etcd.pid,
                            f"cpu{args.n}_{label}_{k}")
                results[label].append(r)
                print(f"{label:>8} {args.n} agents: {r[0]:.2f} ms/agent, "
                      f"etcd {r[1]:.3f} s, rendezvous {r[2]:.3f} s, per "
                      f"agent {r[3]:.1f} watch events, {r[4]:.2f} "
                      f"watch streams; load {load:.1f}", flush=True)
    for label, _ in variants:
        rs = results[label]
        print(f"median {label:>8}: "
              f"{statistics.median(r[0] for r in rs):.2f} ms/agent, etcd "
              f"{statistics.median(r[1] for r in rs):.3f} s, rendezvous "
              f"{statistics.median(r[2] for r in rs):.3f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
