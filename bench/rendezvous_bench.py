#!/usr/bin/env python3
"""Rendezvous and failure-detection times of dlaunch's c10d backend, next to
torchrun's c10d (docs/performance.md, "Rendezvous").

  rendezvous: N agents on this machine (each its own 127.0.0.x), one worker
    each that stamps its start time and exits: from the last agent's start
    to every worker running.
  detection: --nnodes 2:4 on 3 nodes whose workers block; one non-hosting
    agent SIGKILLed (or SIGSTOPped, keep-alive 1 s x 2): from the signal to
    every survivor's worker running again in the new round.

Every run prints its time and the 1-minute load average; the end prints the
docs table (medians of --repeat runs). Run from the repository root:

  python3 bench/rendezvous_bench.py --build build
  python3 bench/rendezvous_bench.py --build build --counts 16,64,256 \\
      --torch-counts 16,64 --repeat 5
"""
import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load():
    return os.getloadavg()[0]


def wait_lines(path, n, timeout):
    """The lines of `path` once it has `n`; polls (this is a benchmark)."""
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
    # Start time and group world size of each worker, one line each; with
    # BLOCK_AT set, the workers of a round that size stay up.
    return ["sh", "-c",
            f'echo "$(date +%s.%N) $GROUP_WORLD_SIZE" >> {stamps}; '
            'if [ -n "$BLOCK_AT" ] && [ "$GROUP_WORLD_SIZE" = "$BLOCK_AT" ]; '
            'then exec sleep 300; fi']


def dlaunch_agent(build, i, n, port, run_id, stamps, conf=""):
    return [f"{build}/bin/dlaunch", "--nnodes", n, "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
            "--local-addr", f"127.0.0.{2 + i % 250}", "--rdzv-conf",
            f"is_host={'true' if i == 0 else 'false'},last_call_timeout=1"
            + conf, *worker(stamps)]


def torchrun_agent(i, n, port, run_id, stamps, logs):
    # Python 3.11 needs -r/-t/--log_dir with torch 1.13 (docs: DESIGN.md).
    return [PYTHON, "-m", "torch.distributed.run", "--nnodes", n,
            "--nproc_per_node", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", run_id,
            "--rdzv_conf", f"is_host={'true' if i == 0 else 'false'}",
            "-r", "1", "-t", "1", "--log_dir", f"{logs}/{i}", "--no_python",
            *worker(stamps)]


def agent_name(i, p):
    """'agent 3 (127.0.0.5, pid 123)': its index, --local-addr and pid."""
    args = p.args
    addr = f"{args[args.index('--local-addr') + 1]}, " \
        if "--local-addr" in args else ""
    return f"agent {i} ({addr}pid {p.pid})"


def stop_all(procs, timeout, what):
    """Waits up to `timeout` s for `procs` (the agents of `what`) to exit,
    saying so, then SIGKILLs the groups of those still alive; returns their
    names."""
    alive = [(i, p) for i, p in enumerate(procs) if p.poll() is None]
    if alive and timeout > 0:
        print(f"  {what}: waiting up to {timeout} s for {len(alive)} "
              "agent(s) to exit", flush=True)
    end = time.time() + timeout
    left = []
    for i, p in alive:
        try:
            p.wait(max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            left.append(agent_name(i, p))
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return left


def fail_if_left(left, timeout, what):
    """Raises TimeoutError naming the agents in `left` (the first ten)."""
    if left:
        more = f" and {len(left) - 10} more" if len(left) > 10 else ""
        raise TimeoutError(f"{what}: {len(left)} agent(s) still alive {timeout}"
                           f" s after the end, killed: {', '.join(left[:10])}"
                           f"{more}")


def rendezvous_time(cmds, stamps, n, timeout, env=None):
    """Seconds from the last agent's start to the last stamp; `env`: the
    agents' environment (None: this one's)."""
    procs = []
    try:
        for c in cmds:
            procs.append(subprocess.Popen(c, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL,
                                          start_new_session=True, env=env))
        last_start = time.time()
        lines = wait_lines(stamps, n, timeout)
    except BaseException:
        # After a timeout (or Ctrl-C) the agents are stopped at once.
        stop_all(procs, 0, f"{n} agents")
        raise
    took = max(float(l.split()[0]) for l in lines) - last_start
    fail_if_left(stop_all(procs, timeout, f"{n} agents"), timeout,
                 f"{n} agents")
    return took


def rendezvous(build, n, k, torch):
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        stamps = f"{d}/stamps"
        if torch:
            cmds = [torchrun_agent(i, str(n), port, f"t{n}_{k}", stamps, d)
                    for i in range(n)]
        else:
            cmds = [dlaunch_agent(build, i, str(n), port, f"b{n}_{k}", stamps)
                    for i in range(n)]
        return rendezvous_time(cmds, stamps, n, 600 if torch else 300)


def detection(build, sig, conf):
    with tempfile.TemporaryDirectory() as d:
        stamps = f"{d}/stamps"
        port = free_port()
        env = dict(os.environ, BLOCK_AT="3")
        agents = [subprocess.Popen(
            dlaunch_agent(build, i, "2:4", port, "det", stamps, conf=conf),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
            for i in range(3)]
        try:
            wait_lines(stamps, 3, 60)
            t0 = time.time()
            os.kill(agents[2].pid, sig)
            lines = wait_lines(stamps, 5, 120)
        except BaseException:
            stop_all(agents, 0, "detection")
            raise
        finally:
            if sig == signal.SIGSTOP and agents[2].poll() is None:
                os.killpg(agents[2].pid, signal.SIGKILL)
        took = max(float(l.split()[0]) for l in lines[3:]) - t0
        fail_if_left(stop_all(agents, 60, "detection"), 60, "detection")
        return took


def measure(label, fn, repeat):
    runs = []
    for k in range(repeat):
        before = load()
        try:
            t = fn(k)
        except TimeoutError as e:
            print(f"{label} run {k + 1}: did not finish ({e}; load "
                  f"{before:.1f})", flush=True)
            return runs + [(None, before)]
        runs.append((t, before))
        print(f"{label} run {k + 1}: {t:.3f} s (load {before:.1f})",
              flush=True)
    return runs


def cell(runs):
    if not runs:
        return "not measured"
    ls = [l for _, l in runs]
    if runs[-1][0] is None:
        return f"did not finish within the timeout (load {ls[-1]:.1f})"
    ts = [t for t, _ in runs]
    spread = f"{min(ts):.2f}–{max(ts):.2f}, " if len(ts) > 1 else ""
    return (f"{statistics.median(ts):.2f} s ({spread}n={len(ts)}; "
            f"load {min(ls):.1f}–{max(ls):.1f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--counts", default="16,64,256")
    ap.add_argument("--torch-counts", default="16,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--torch-repeat", type=int, default=None,
                    help="runs for torchrun (default --repeat)")
    ap.add_argument("--no-detection", action="store_true")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    counts = [int(c) for c in args.counts.split(",") if c]
    torch_counts = [int(c) for c in args.torch_counts.split(",") if c]
    torch_repeat = args.torch_repeat or args.repeat
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    ours = {n: measure(f"dlaunch c10d {n} agents",
                       lambda k, n=n: rendezvous(build, n, k, False),
                       args.repeat) for n in counts}
    theirs = {n: measure(f"torchrun c10d {n} agents",
                         lambda k, n=n: rendezvous(build, n, k, True),
                         torch_repeat) for n in torch_counts}
    detect = {}
    if not args.no_detection:
        for name, sig, conf in [
                ("SIGKILL", signal.SIGKILL, ""),
                ("SIGSTOP", signal.SIGSTOP,
                 ",keep_alive_interval=1,keep_alive_max_attempt=2")]:
            detect[name] = measure(f"detection {name}",
                                   lambda k, s=sig, c=conf: detection(
                                       build, s, c), args.repeat)

    print(f"\nMedians of runs ({start}; {os.cpu_count()} cores; load = "
          "1-minute load average before each run):\n")
    print("| measurement | dlaunch c10d | torchrun c10d | target |")
    print("| --- | --- | --- | --- |")
    for n in sorted(set(counts) | set(torch_counts)):
        target = "under 2 s" if n == 256 else ""
        print(f"| {n} agents, last start to every worker running | "
              f"{cell(ours.get(n, []))} | {cell(theirs.get(n, []))} | "
              f"{target} |")
    if detect:
        print("| SIGKILL of a non-hosting agent (2:4 on 3 nodes) to the "
              f"survivors' workers restarted | {cell(detect['SIGKILL'])} | "
              "not measured | under 1 s |")
        print("| SIGSTOP of one, keep-alive 1 s x 2 | "
              f"{cell(detect['SIGSTOP'])} | not measured | under 2.5 s |")


if __name__ == "__main__":
    sys.exit(main())
