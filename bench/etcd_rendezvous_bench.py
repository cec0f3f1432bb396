#!/usr/bin/env python3
"""The etcd rendezvous backend next to c10d (docs/performance.md,
"Rendezvous on etcd"): starts a 1-member etcd 3.4 with its data directory
on tmpfs (/dev/shm) and measures

  rendezvous: N agents on this machine (each its own 127.0.0.x), one `true`
    worker each, from the last agent's start to every worker running; etcd
    and c10d alternate, same machine, same moment.
  detection: --nnodes 2:3 on 3 nodes whose workers block, lease TTL 2 s
    (keep_alive_interval=1, keep_alive_max_attempt=2): from the signal to
    every survivor's worker running again in the new round, when
      - the agent is SIGKILLed (its helper revokes the lease at once),
      - the agent and its helper are SIGKILLed (the lease must expire),
      - the agent and its helper are SIGSTOPped (the lease must expire).

Each count prints every run (etcd and c10d alternate, one of each per
repeat), the medians, their ratio and the load average before and after.

Run: python3 bench/etcd_rendezvous_bench.py --build build [--counts 16,64]
       [--repeat 5] [--no-detection]
"""
import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rendezvous_bench import (dlaunch_agent, fail_if_left, free_port,  # noqa
                              rendezvous_time, stop_all, wait_lines, worker)


def start_etcd(d):
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(
        ["etcd", "--data-dir", f"{d}/data",
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 30
    while time.time() < end:
        if subprocess.run(["etcdctl", "--endpoints", f"127.0.0.1:{client}",
                           "endpoint", "health"], capture_output=True
                          ).returncode == 0:
            return proc, f"127.0.0.1:{client}"
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError("etcd did not become healthy in 30 s")


@contextlib.contextmanager
def etcd_on_tmpfs():
    """A 1-member etcd with its data directory on tmpfs (/dev/shm where
    there is one), killed at the end: yields (its process, its endpoint)."""
    tmpfs = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=tmpfs) as d:
        etcd, endpoint = start_etcd(d)
        try:
            yield etcd, endpoint
        finally:
            etcd.kill()
            etcd.wait()


def etcd_agent(build, i, n, endpoint, run_id, stamps, conf=""):
    return [f"{build}/bin/dlaunch", "--nnodes", n, "--rdzv-backend", "etcd",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
            "--local-addr", f"127.0.0.{2 + i % 250}", "--rdzv-conf",
            "last_call_timeout=1,close_timeout=2" + conf, *worker(stamps)]


def helper_of(pid):
    """The agent's dlaunch-rdzv-etcd child."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for c in f.read().split():
                with open(f"/proc/{c}/comm") as g:
                    if g.read().startswith("dlaunch-rdzv"):
                        return int(c)
    raise RuntimeError(f"agent {pid} has no dlaunch-rdzv-etcd child")


def detection(build, endpoint, sig, with_helper, run_id):
    conf = ",keep_alive_interval=1,keep_alive_max_attempt=2"
    with tempfile.TemporaryDirectory() as d:
        stamps = f"{d}/stamps"
        env = dict(os.environ, BLOCK_AT="3")
        agents = [subprocess.Popen(
            etcd_agent(build, i, "2:3", endpoint, run_id, stamps, conf),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
            for i in range(3)]
        victims = [agents[2].pid]
        try:
            wait_lines(stamps, 3, 60)
            if with_helper:
                # The helper first: killed after the agent, it could see
                # the agent's end and revoke the lease in between.
                victims.insert(0, helper_of(agents[2].pid))
            t0 = time.time()
            for v in victims:
                os.kill(v, sig)
            lines = wait_lines(stamps, 5, 120)
            restarted = max(float(l.split()[0]) for l in lines[3:])
            return restarted - t0
        finally:
            for v in victims:
                if sig == signal.SIGSTOP:
                    os.kill(v, signal.SIGCONT)
            fail_if_left(stop_all(agents, 60, "detection"), 60, "detection")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--counts", default="16,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-detection", action="store_true",
                    help="only the rendezvous times")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    with etcd_on_tmpfs() as (_, endpoint):
        for n in [int(c) for c in args.counts.split(",") if c]:
            te, tc = [], []
            load0 = os.getloadavg()[0]
            for k in range(args.repeat):
                with tempfile.TemporaryDirectory() as d:
                    cmds = [etcd_agent(build, i, str(n), endpoint,
                                       f"e{n}_{k}", f"{d}/stamps")
                            for i in range(n)]
                    te.append(rendezvous_time(cmds, f"{d}/stamps", n, 300))
                with tempfile.TemporaryDirectory() as d:
                    port = free_port()
                    cmds = [dlaunch_agent(build, i, str(n), port,
                                          f"c{n}_{k}", f"{d}/stamps")
                            for i in range(n)]
                    tc.append(rendezvous_time(cmds, f"{d}/stamps", n, 300))
            me, mc = statistics.median(te), statistics.median(tc)
            print(f"etcd {n:4d} agents: "
                  + " ".join(f"{t:.3f}" for t in te) + " s; c10d: "
                  + " ".join(f"{t:.3f}" for t in tc) + " s; medians "
                  f"{me:.3f} / {mc:.3f} s = {me / mc:.2f}x; load "
                  f"{load0:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
        if args.no_detection:
            return
        for name, sig, helper in [
                ("SIGKILL agent", signal.SIGKILL, False),
                ("SIGKILL agent+helper (lease TTL 2 s)", signal.SIGKILL,
                 True),
                ("SIGSTOP agent+helper (lease TTL 2 s)", signal.SIGSTOP,
                 True)]:
            times = [detection(build, endpoint, sig, helper,
                               f"det{int(sig)}{int(helper)}_{k}")
                     for k in range(args.repeat)]
            print(f"detection {name}: "
                  + " ".join(f"{t:.3f}" for t in times) + " s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
