#!/usr/bin/env python3
"""Rendezvous and failure-detection times of dlaunch's c10d backend, next to
torchrun's c10d (docs/performance.md, "Rendezvous").

  rendezvous: N agents on this machine (each its own 127.0.0.x), one `true`
    worker each: from the last agent's start to every worker running (each
    worker appends its start time to a file).
  detection: --nnodes 2:4 on 3 nodes whose workers block; one non-hosting
    agent SIGKILLed (or SIGSTOPped): from the signal to every survivor's
    worker running again in the new round.

Run: python3 bench/rendezvous_bench.py --build build [--counts 16,64,256]
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_lines(path, n, timeout):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with open(path) as f:
                lines = [l for l in f.read().splitlines() if l]
            if len(lines) >= n:
                return lines
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    raise TimeoutError(f"{path}: fewer than {n} lines after {timeout} s")


def worker(stamps):
    # Start time and world size of each worker, one line each.
    return ["sh", "-c",
            f'echo "$(date +%s.%N) $GROUP_WORLD_SIZE" >> {stamps}; '
            'if [ -n "$BLOCK_AT" ] && [ "$GROUP_WORLD_SIZE" = "$BLOCK_AT" ]; '
            'then exec sleep 300; fi']


def dlaunch_agent(build, i, n, port, run_id, stamps, extra=(), conf=""):
    return [f"{build}/bin/dlaunch", "--nnodes", n, "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
            "--local-addr", f"127.0.0.{2 + i % 250}", "--rdzv-conf",
            f"is_host={'true' if i == 0 else 'false'},last_call_timeout=1"
            + conf, *extra, *worker(stamps)]


def torchrun_agent(i, n, port, run_id, stamps, logs):
    return ["torchrun", "--nnodes", n, "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", run_id, "--rdzv-conf",
            f"is_host={'true' if i == 0 else 'false'}",
            "-r", "1", "-t", "1", "--log_dir", f"{logs}/{i}", "--no-python",
            *worker(stamps)]


def rendezvous_time(cmds, stamps, n, timeout):
    procs = []
    for c in cmds:
        procs.append(subprocess.Popen(c, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        last_start = time.time()
    try:
        lines = wait_lines(stamps, n, timeout)
        latest = max(float(l.split()[0]) for l in lines)
        return latest - last_start
    finally:
        for p in procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()


def detection(build, sig, conf):
    with tempfile.TemporaryDirectory() as d:
        stamps = f"{d}/stamps"
        port = free_port()
        env = dict(os.environ, BLOCK_AT="3")
        agents = [subprocess.Popen(
            dlaunch_agent(build, i, "2:4", port, "det", stamps, conf=conf),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            for i in range(3)]
        try:
            wait_lines(stamps, 3, 60)
            t0 = time.time()
            os.kill(agents[2].pid, sig)
            lines = wait_lines(stamps, 5, 120)
            restarted = max(float(l.split()[0]) for l in lines[3:])
            return restarted - t0
        finally:
            for a in agents:
                if sig == signal.SIGSTOP and a is agents[2]:
                    a.send_signal(signal.SIGCONT)
            for a in agents:
                try:
                    a.wait(60)
                except subprocess.TimeoutExpired:
                    a.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--counts", default="16,64,256")
    ap.add_argument("--torch-counts", default="16,64")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    for n in [int(c) for c in args.counts.split(",") if c]:
        times = []
        for k in range(args.repeat):
            with tempfile.TemporaryDirectory() as d:
                port = free_port()
                cmds = [dlaunch_agent(build, i, str(n), port, f"b{n}_{k}",
                                      f"{d}/stamps") for i in range(n)]
                times.append(rendezvous_time(cmds, f"{d}/stamps", n, 300))
        print(f"dlaunch c10d  {n:4d} agents: "
              + " ".join(f"{t:.3f}" for t in times) + " s", flush=True)
    for n in [int(c) for c in args.torch_counts.split(",") if c]:
        times = []
        for k in range(args.repeat):
            with tempfile.TemporaryDirectory() as d:
                port = free_port()
                cmds = [torchrun_agent(i, str(n), port, f"t{n}_{k}",
                                       f"{d}/stamps", d) for i in range(n)]
                times.append(rendezvous_time(cmds, f"{d}/stamps", n, 600))
        print(f"torchrun c10d {n:4d} agents: "
              + " ".join(f"{t:.3f}" for t in times) + " s", flush=True)
    for name, sig, conf in [
            ("SIGKILL", signal.SIGKILL, ""),
            ("SIGSTOP (keep_alive 1 s x 2)", signal.SIGSTOP,
             ",keep_alive_interval=1,keep_alive_max_attempt=2")]:
        times = [detection(build, sig, conf) for _ in range(args.repeat)]
        print(f"detection {name}: "
              + " ".join(f"{t:.3f}" for t in times) + " s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
