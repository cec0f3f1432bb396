"""Every collective and the ping-pong on one host: dl-bench under dlaunch
next to OpenMPI (bench/mpi_bench.c under mpirun, its shared-memory
transport) and torch gloo (bench/onehost_torch.py, Debian's python3-torch),
run back to back at each size of each round, in one sitting.

    python3 bench/onehost_compare.py --build build [--ranks 2,4] [--rounds 5]
        [--write-docs docs/performance.md]

Builds bench/mpi_bench.c with mpicc (Debian's libopenmpi-dev) and runs the
three `rounds` times at 4 KiB, 1 MiB and 64 MiB (8 B too for the
ping-pong; 10000 calls after 100 at 8 B and 4 KiB, as osu_latency, 200 at
1 MiB, 10 at 64 MiB; torch gloo fewer). Prints, per rank count, a markdown table of medians over rounds
with the path dl-bench reported; the ratios are medians of each round's
back-to-back ratio, which a machine whose load moves between rounds
disturbs less than a ratio of medians. The load average is read before and
after every round and reported with the tables. --write-docs replaces the
tables between the "onehost-table" markers in that file.
"""
import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [4096, 1 << 20, 64 << 20]
OPS = ["pingpong", "all_reduce", "broadcast", "reduce", "all_gather",
       "gather", "scatter", "reduce_scatter", "all_to_all"]
MEMCPY = ("memcpy", 64 << 20)  # dl-bench's one-process rate, GB/s
BEGIN = "<!-- onehost-table:begin (bench/onehost_compare.py --write-docs) -->"
END = "<!-- onehost-table:end -->"


def counts(nbytes):
    """(iterations, warm-up) for dl-bench and OpenMPI at a size: OSU's
    osu_latency counts for small messages (10000 after 100), since a 8 B
    ping-pong of 0.2 us timed over a few hundred calls is mostly noise."""
    if nbytes <= 8 << 10:
        return 10000, 100
    return (10, 3) if nbytes >= 64 << 20 else (200, 10)


def dl_bench(build, ranks, nbytes, iters, warm):
    cmd = [os.path.join(build, "bin", "dlaunch"), "--nproc-per-node",
           str(ranks), os.path.join(build, "bin", "dl-bench"), "-b",
           str(nbytes), "-e", str(nbytes), "-n", str(iters), "-w",
           str(warm), "-c", "0", "-o", ",".join(OPS)]
    out = subprocess.run(cmd, check=True, capture_output=True,
                         text=True).stdout
    rows, op, path = {}, None, ""
    for line in out.splitlines():
        line = line.split("]:", 1)[-1].strip()
        if line.startswith("# ") and ":" in line and "ranks" in line:
            op = line[2:line.index(":")]
        elif line.startswith("#  path:"):
            path = line.split(":", 1)[1].strip()
        elif line.startswith("# memcpy:"):  # rank 0's, at 64 MiB runs
            rows[MEMCPY] = (float(line.split(" at ")[1].split()[0]), "")
        elif line and not line.startswith("#") and op:
            f = line.split()
            rows[(op, int(f[0]))] = (float(f[5]), path)
    return rows


def parse_op_lines(out):
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] in OPS:
            rows[(f[0], int(f[1]))] = float(f[2])
    return rows


def mpi_bench(exe, ranks, nbytes, iters, warm):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
           str(ranks), exe, "-n", str(iters), "-w", str(warm), str(nbytes)]
    return parse_op_lines(subprocess.run(cmd, check=True, capture_output=True,
                                         text=True).stdout)


def torch_bench(ranks, nbytes, iters):
    cmd = ["/usr/bin/python3", os.path.join(HERE, "onehost_torch.py"),
           "--ranks", str(ranks), "-n", str(iters), "-w", "3", str(nbytes)]
    return parse_op_lines(subprocess.run(cmd, check=True, capture_output=True,
                                         text=True).stdout)


def fmt(us):
    """Three significant digits or more: below 10 us two decimals, so that
    0.18 and 0.25 us (8 B ping-pongs) do not both read 0.2 us."""
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} us" if us >= 10 else f"{us:.2f} us"


def label(nbytes):
    return (f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else
            f"{nbytes >> 10} KiB" if nbytes >= 1024 else f"{nbytes} B")


def measure(build, mpi_exe, ranks, rounds, loads):
    """{impl: {(op, bytes): [time per round]}}, paths by (op, bytes)."""
    times = {"dl": {}, "mpi": {}, "torch": {}}
    paths = {}
    for r in range(rounds):
        before = os.getloadavg()[0]
        for nbytes in [8] + SIZES:
            iters, warm = counts(nbytes)
            for k, (t, path) in dl_bench(build, ranks, nbytes, iters,
                                         warm).items():
                times["dl"].setdefault(k, []).append(t)
                paths[k] = path
            for k, t in mpi_bench(mpi_exe, ranks, nbytes, iters,
                                  warm).items():
                times["mpi"].setdefault(k, []).append(t)
            # torch gloo's large sizes take seconds an iteration: fewer.
            for k, t in torch_bench(ranks, nbytes,
                                    3 if nbytes >= 64 << 20 else
                                    20 if nbytes >= 1 << 20 else 200).items():
                times["torch"].setdefault(k, []).append(t)
        loads.extend([before, os.getloadavg()[0]])
        print(f"{ranks} ranks: round {r + 1}/{rounds} done (load "
              f"{before:.1f} -> {os.getloadavg()[0]:.1f})", file=sys.stderr)
    return times, paths


def table(ranks, times, paths):
    lines = [f"| op, {ranks} ranks | size | dlaunch::comm | path | OpenMPI "
             "| torch gloo | dlaunch / OpenMPI | dlaunch / torch |",
             "|---|---|---|---|---|---|---|---|"]

    def ratio(k, other):
        pairs = list(zip(times["dl"].get(k, []), times[other].get(k, [])))
        return (f"{statistics.median(o / t for o, t in pairs):.2f}x"
                if pairs else "n/a")

    def med(impl, k):
        v = times[impl].get(k)
        return fmt(statistics.median(v)) if v else "n/a"

    for op in OPS:
        for nbytes in [8] + SIZES:
            k = (op, nbytes)
            if k not in times["dl"] or (nbytes == 8 and op != "pingpong"):
                continue
            lines.append(f"| {op} | {label(nbytes)} | {med('dl', k)} | "
                         f"{paths[k]} | {med('mpi', k)} | {med('torch', k)} | "
                         f"{ratio(k, 'mpi')} | {ratio(k, 'torch')} |")
    return lines + memcpy_line(times)


def memcpy_line(times):
    """The 64 MiB all_reduce's rate against one process's 64 MiB memcpy
    measured by the same dl-bench run (issue #15: at least 0.4x)."""
    k = ("all_reduce", 64 << 20)
    pairs = list(zip(times["dl"].get(k, []), times["dl"].get(MEMCPY, [])))
    if not pairs:
        return []
    rates = [k[1] / (t * 1e3) for t, _ in pairs]  # GB/s (t in us)
    ratios = [r / m for r, (_, m) in zip(rates, pairs)]
    return ["", f"all_reduce 64 MiB: {statistics.median(rates):.2f} GB/s "
            f"(bytes / time), {statistics.median(ratios):.2f}x one "
            f"process's 64 MiB memcpy in the same runs "
            f"({statistics.median(m for _, m in pairs):.2f} GB/s; medians "
            "over rounds; target at 2 ranks: 0.4x)."]


def write_docs(path, text):
    with open(path) as f:
        doc = f.read()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        sys.exit(f"{path} has no '{BEGIN}' ... '{END}' markers")
    doc = pattern.sub(lambda _: BEGIN + "\n" + text + "\n" + END, doc)
    with open(path, "w") as f:
        f.write(doc)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--ranks", default="2",
                   help="comma list of rank counts (default 2)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--write-docs", metavar="FILE",
                   help="replace the tables between the markers in FILE")
    a = p.parse_args()
    for tool in ("mpicc", "mpirun"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found: install libopenmpi-dev and "
                     "openmpi-bin (scripts/setup does)")
    exe = os.path.join(a.build, "mpi_bench")
    subprocess.run(["mpicc", "-O2", "-o", exe,
                    os.path.join(HERE, "mpi_bench.c")], check=True)
    start = datetime.datetime.now(datetime.timezone.utc)
    loads, out = [], []
    for ranks in [int(x) for x in a.ranks.split(",")]:
        times, paths = measure(a.build, exe, ranks, a.rounds, loads)
        lines = table(ranks, times, paths)
        # Each rank count's table as soon as it is measured (stderr).
        print("\n".join(lines), file=sys.stderr)
        out += lines + [""]
    nproc = os.cpu_count()
    head = (f"Sitting of {start:%Y-%m-%d, %H:%M} UTC, {a.rounds} round(s), "
            f"{nproc} cores; load average (1 min) before and after each "
            f"round: {min(loads):.1f} to {max(loads):.1f}. Generated by "
            f"`python3 bench/onehost_compare.py --build {a.build} --ranks "
            f"{a.ranks} --rounds {a.rounds} --write-docs FILE`.")
    text = "\n".join([head, ""] + out).rstrip()
    print(text)
    if a.write_docs:
        write_docs(a.write_docs, text)


if __name__ == "__main__":
    main()
