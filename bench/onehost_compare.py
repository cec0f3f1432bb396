"""Every collective and the ping-pong on one host: dl-bench under dlaunch
next to OpenMPI (bench/mpi_bench.c under mpirun, its shared-memory
transport), alternating, in one sitting.

    python3 bench/onehost_compare.py --build build [--ranks 2] [--rounds 5]

Builds bench/mpi_bench.c with mpicc (Debian's libopenmpi-dev), runs both
`rounds` times at 4 KiB, 1 MiB and 64 MiB (8 B too for the ping-pong) and
prints a markdown table of medians over rounds (docs/performance.md, "One
host, side by side"), with the path dl-bench reported.
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [4096, 1 << 20, 64 << 20]
OPS = ["pingpong", "all_reduce", "broadcast", "reduce", "all_gather",
       "gather", "scatter", "reduce_scatter", "all_to_all"]


def dl_bench(build, ranks, nbytes, iters):
    cmd = [os.path.join(build, "bin", "dlaunch"), "--nproc-per-node",
           str(ranks), os.path.join(build, "bin", "dl-bench"), "-b",
           str(nbytes), "-e", str(nbytes), "-n", str(iters), "-w", "3", "-c",
           "0", "-o", ",".join(OPS)]
    out = subprocess.run(cmd, check=True, capture_output=True,
                         text=True).stdout
    rows, op, path = {}, None, ""
    for line in out.splitlines():
        line = line.split("]:", 1)[-1].strip()
        if line.startswith("# ") and ":" in line and "ranks" in line:
            op = line[2:line.index(":")]
        elif line.startswith("#  path:"):
            path = line.split(":", 1)[1].strip()
        elif line and not line.startswith("#") and op:
            f = line.split()
            rows[(op, int(f[0]))] = (float(f[5]), path)
    return rows


def mpi_bench(exe, ranks, nbytes, iters):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
           str(ranks), exe, "-n", str(iters), "-w", "3", str(nbytes)]
    out = subprocess.run(cmd, check=True, capture_output=True,
                         text=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] in OPS:
            rows[(f[0], int(f[1]))] = float(f[2])
    return rows


def fmt(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    exe = os.path.join(a.build, "mpi_bench")
    subprocess.run(["mpicc", "-O2", "-o", exe,
                    os.path.join(HERE, "mpi_bench.c")], check=True)
    ours, theirs, paths = {}, {}, {}
    for r in range(a.rounds):
        for nbytes in [8] + SIZES:
            iters = 10 if nbytes >= 64 << 20 else 200
            for k, (t, path) in dl_bench(a.build, a.ranks, nbytes,
                                         iters).items():
                ours.setdefault(k, []).append(t)
                paths[k] = path
            for k, t in mpi_bench(exe, a.ranks, nbytes, iters).items():
                theirs.setdefault(k, []).append(t)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"| op, {a.ranks} ranks | size | dlaunch::comm | path | OpenMPI "
          "| dlaunch / OpenMPI |")
    print("|---|---|---|---|---|---|")
    for op in OPS:
        for nbytes in [8] + SIZES:
            k = (op, nbytes)
            if k not in ours or k not in theirs:
                continue
            if nbytes == 8 and op != "pingpong":
                continue
            o = statistics.median(ours[k])
            t = statistics.median(theirs[k])
            label = (f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else
                     f"{nbytes >> 10} KiB" if nbytes >= 1024 else
                     f"{nbytes} B")
            print(f"| {op} | {label} | {fmt(o)} | {paths[k]} | {fmt(t)} "
                  f"| {o / t:.2f}x |")


if __name__ == "__main__":
    main()
