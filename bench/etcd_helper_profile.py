#!/usr/bin/env python3
"""Where the etcd backend's rendezvous time goes (docs/performance.md,
"Rendezvous on etcd"): drives N dlaunch-rdzv-etcd helpers directly over
their socket pairs, as N agents would, against a 1-member etcd on tmpfs,
and prints per phase the wall time of the last helper and the CPU time of
all helpers and of etcd:

  open:  spawn to "ready" (process start, gRPC channel, lease grant)
  round: "next" to "round" for every helper (join, watch, close)
  watch: "watch" to the watch being set up (measured by the next step)
  leave: end-of-file to exit (revoke)

Run: python3 bench/etcd_helper_profile.py --build build [--counts 1,16,64]
"""
import argparse
import os
import resource
import selectors
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_rendezvous_bench import etcd_on_tmpfs  # noqa


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def settings(n, endpoint, run_id, i, protocol):
    s = {"protocol": protocol, "backend": "etcd", "min_nodes": n, "max_nodes": n,
         "node_rank": -1, "endpoints": endpoint, "cacert": "", "cert": "",
         "key": "", "user": "", "password_file": "",
         "join_timeout_ms": 60000, "last_call_timeout_ms": 1000,
         "close_timeout_ms": 2000, "keep_alive_interval_ms": 5000,
         "keep_alive_max_attempt": 3, "read_timeout_ms": 60000,
         "run_id": run_id, "node_addr": f"127.0.0.{2 + i % 250}",
         "master_port": 29500}
    return ("open " + " ".join(f"{k}={v}" for k, v in s.items()) +
            "\n").encode()


def wait_all(socks, verb, timeout=120):
    """Reads each socket until a line starting with `verb`; the time the
    last one came."""
    sel = selectors.DefaultSelector()
    bufs = {}
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
        bufs[s] = b""
    left = set(socks)
    end = time.time() + timeout
    while left:
        if time.time() > end:
            raise TimeoutError(f"{len(left)} helpers sent no '{verb}'")
        for key, _ in sel.select(1):
            s = key.fileobj
            data = s.recv(65536)
            if not data:
                raise RuntimeError("a helper exited: " + bufs[s].decode())
            bufs[s] += data
            for line in bufs[s].split(b"\n")[:-1]:
                if line.startswith(verb.encode()):
                    left.discard(s)
                    sel.unregister(s)
                    break
                if line.startswith(b"error"):
                    raise RuntimeError(line.decode())
            else:
                bufs[s] = bufs[s].rsplit(b"\n", 1)[-1]
    return time.perf_counter()


def profile(helper, n, endpoint, etcd_pid, run_id, protocol):
    row = {}
    c0, e0 = children_cpu(), cpu_of(etcd_pid)
    t0 = time.perf_counter()
    socks, procs = [], []
    for i in range(n):
        a, b = socket.socketpair()
        procs.append(subprocess.Popen([helper], stdin=b, stdout=b,
                                      start_new_session=True))
        b.close()
        a.sendall(settings(n, endpoint, run_id, i, protocol))
        socks.append(a)
    t_spawned = time.perf_counter()
    t1 = wait_all(socks, "ready")
    row["open"] = (t1 - t0, t_spawned - t0)
    e1 = cpu_of(etcd_pid)
    for s in socks:
        s.sendall(b"next 1 0 60000\n")
    t2 = wait_all(socks, "round")
    row["round"] = (t2 - t1,)
    e2 = cpu_of(etcd_pid)
    t3 = time.perf_counter()
    for s in socks:
        s.shutdown(socket.SHUT_WR)
    for p in procs:
        p.wait(60)
    t4 = time.perf_counter()
    for s in socks:
        s.close()
    c1, e3 = children_cpu(), cpu_of(etcd_pid)
    print(f"{n:3d} helpers: open {row['open'][0]:.3f} s (spawning "
          f"{row['open'][1]:.3f} s), round {row['round'][0]:.3f} s, leave "
          f"{t4 - t3:.3f} s; CPU: helpers {c1 - c0:.3f} s "
          f"({(c1 - c0) / n * 1000:.1f} ms each), etcd open {e1 - e0:.3f} s, "
          f"round {e2 - e1:.3f} s, leave {e3 - e2:.3f} s; load "
          f"{os.getloadavg()[0]:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--counts", default="1,16,64")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--protocol", default="2",
                    help="the helper's protocol version (1 before the cut "
                    "fault)")
    args = ap.parse_args()
    helper = os.path.abspath(f"{args.build}/bin/dlaunch-rdzv-etcd")
    with etcd_on_tmpfs() as (etcd, endpoint):
        for n in [int(c) for c in args.counts.split(",") if c]:
            for k in range(args.repeat):
                profile(helper, n, endpoint, etcd.pid, f"p{n}_{k}",
                        args.protocol)


if __name__ == "__main__":
    sys.exit(main())
