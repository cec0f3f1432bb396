#!/usr/bin/env python3
"""dl-sgd --device cuda under dlaunch vs PyTorch DDP (bench/sgd_ddp.py) under
torchrun: same model, data, batch and GPUs, in the same sitting.

Also runs dl-sgd --device cpu once for the accuracy bar: the GPU run's final
test accuracy must be within 0.5 points of the CPU's (exit status 1
otherwise). The epoch-time target (dl-sgd at most DDP's) is printed, MET or
MISSED. Epoch times are medians over epochs 2..N (the first warms up).
Usage (from the repository root, after a build with CUDA):
  python3 bench/sgd_gpu_compare.py [--epochs 3] [--runs 1] [--nproc 1]
      [--build build] [--data DIR]
PyTorch (with CUDA) comes from the running python3; scripts/gpu-check runs
this with --build build-gpu.
"""

import argparse
import os
import statistics
import sys

from sgd_compare import print_run, run


def epoch_median(epochs):
    times = [t for *_, t in epochs]
    return statistics.median(times[1:] if len(times) > 1 else times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--nproc", type=int, default=1, help="GPUs (ranks)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.join(root, args.build)
    dlaunch = os.path.join(build, "bin", "dlaunch")
    dlsgd = os.path.join(build, "bin", "dl-sgd")
    ddp = os.path.join(root, "bench", "sgd_ddp.py")
    common = ["--epochs", str(args.epochs), "--data", args.data]
    launch = [dlaunch, "--nproc-per-node", str(args.nproc)]

    cpu = run(launch + [dlsgd, "--device", "cpu", "--no-checkpoint"] + common)
    print(f"dl-sgd --device cpu: epoch times "
          f"{' '.join(f'{t:.2f}' for *_, t in cpu)} s, final test_acc "
          f"{cpu[-1][2]:.4f}", flush=True)
    results = {"dl-sgd --device cuda": [], "PyTorch DDP": []}
    for i in range(args.runs):
        results["dl-sgd --device cuda"].append(run(
            launch + ["--gpu-binding", "per-rank", dlsgd, "--device", "cuda",
                      "--no-checkpoint"] + common))
        results["PyTorch DDP"].append(run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", str(args.nproc), ddp] + common))
        for name, runs in results.items():
            print_run(i, name, runs[-1])
    print()
    med = {}
    for name, runs in results.items():
        med[name] = statistics.median(epoch_median(r) for r in runs)
        print(f"{name}: median epoch {med[name]:.3f} s, final test_acc "
              f"{runs[-1][-1][2]:.4f}")
    gpu_acc = results["dl-sgd --device cuda"][-1][-1][2]
    diff = abs(gpu_acc - cpu[-1][2]) * 100
    ok = diff <= 0.5
    print(f"accuracy: dl-sgd cuda {gpu_acc:.4f} vs cpu {cpu[-1][2]:.4f}, "
          f"{diff:.2f} points apart (bar 0.5): {'OK' if ok else 'FAIL'}")
    ours, theirs = med["dl-sgd --device cuda"], med["PyTorch DDP"]
    print(f"epoch time: dl-sgd cuda {ours:.3f} s vs DDP {theirs:.3f} s "
          f"({ours / theirs:.2f}x): target "
          f"{'MET' if ours <= theirs else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
