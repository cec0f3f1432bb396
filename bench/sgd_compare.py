#!/usr/bin/env python3
"""dl-sgd under dlaunch vs the seeds' method in PyTorch under torchrun.

Runs both with 2 ranks on this machine in the same sitting, alternating,
and prints per-run epoch times, the medians and the final test accuracy.
Usage (from the repository root, after scripts/build):
  python3 bench/sgd_compare.py [--epochs 10] [--runs 3] [--build build]
PyTorch comes from Debian's python3-torch (/usr/bin/python3).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"epoch (\d+)/(\d+) loss ([\d.]+) test_acc ([\d.]+) "
                  r"samples/s (\d+) time ([\d.]+)s")


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n"
                 f"{p.stderr}")
    epochs = [m.groups() for m in map(LINE.search, p.stdout.splitlines()) if m]
    if not epochs:
        sys.exit(f"no epoch lines from: {' '.join(cmd)}\n{p.stdout}")
    return [(int(e), float(loss), float(acc), float(t))
            for e, _, loss, acc, _, t in epochs]


def print_run(i, name, epochs):
    """One run's line: its epoch times and final test accuracy."""
    print(f"run {i + 1} {name}: epoch times "
          f"{' '.join(f'{t:.2f}' for *_, t in epochs)} s, final "
          f"test_acc {epochs[-1][2]:.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dlaunch = os.path.join(root, args.build, "bin", "dlaunch")
    dlsgd = os.path.join(root, args.build, "bin", "dl-sgd")
    torch_script = os.path.join(root, "bench", "sgd_torch.py")
    results = {"dl-sgd": [], "torch": []}
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            results["dl-sgd"].append(run(
                [dlaunch, "--nproc-per-node", "2", dlsgd, "--epochs",
                 str(args.epochs), "--no-checkpoint"]))
            results["torch"].append(run(
                ["/usr/bin/python3", "-m", "torch.distributed.run", "-r", "1",
                 "-t", "1", "--log_dir", d, "--nproc_per_node", "2",
                 torch_script, "--epochs", str(args.epochs)]))
        for name, runs in results.items():
            print_run(i, name, runs[-1])
    print()
    med = {}
    for name, runs in results.items():
        times = [t for ep in runs for *_, t in ep]
        accs = [ep[-1][2] for ep in runs]
        med[name] = statistics.median(times)
        print(f"{name}: median epoch {med[name]:.2f} s over {len(times)} "
              f"epochs, final test_acc {statistics.median(accs):.4f} "
              f"(runs: {' '.join(f'{a:.4f}' for a in accs)})")
    print(f"dl-sgd / torch epoch time: {med['dl-sgd'] / med['torch']:.3f}")


if __name__ == "__main__":
    main()
