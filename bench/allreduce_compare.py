"""All-reduce on 2 ranks: dlaunch::comm (gloo backend, under dlaunch) next to
torch.distributed gloo (Debian python3-torch), in one sitting.

    python3 bench/allreduce_compare.py --build build [--rounds 3]

Runs the two benchmarks alternately `rounds` times and prints a markdown
table of medians across rounds (docs/performance.md, "Collectives").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        line = line.strip()
        # dlaunch prefixes worker lines ("[rank0]: ..." style); take the JSON.
        if "{" in line:
            rows.append(json.loads(line[line.index("{"):]))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    ours = [os.path.join(a.build, "bin", "dlaunch"), "--nproc-per-node", "2",
            os.path.join(a.build, "bin", "allreduce_bench"), "--json"]
    theirs = ["/usr/bin/python3", os.path.join(HERE, "allreduce_torch.py"),
              "--ranks", "2", "--json"]
    results = {}
    for r in range(a.rounds):
        for name, cmd in (("dlaunch", ours), ("torch", theirs)):
            for row in run(cmd):
                results.setdefault((name, row["bytes"]), []).append(row)
            print(f"round {r + 1}/{a.rounds}: {name} done", file=sys.stderr)

    def med(name, nbytes, key):
        return statistics.median(x[key] for x in results[(name, nbytes)])

    print("| size | dlaunch::comm time | dlaunch::comm busbw | torch gloo time "
          "| torch gloo busbw | busbw ratio | best time, dlaunch / torch |")
    print("|---|---|---|---|---|---|---|")
    for nbytes in sorted({b for (_, b) in results}):
        label = (f"{nbytes >> 20} MiB" if nbytes >= 1 << 20
                 else f"{nbytes >> 10} KiB")
        ot, ob = med("dlaunch", nbytes, "time_us"), med("dlaunch", nbytes,
                                                         "busbw_gbs")
        tt, tb = med("torch", nbytes, "time_us"), med("torch", nbytes,
                                                       "busbw_gbs")
        obest = min(x["best_us"] for x in results[("dlaunch", nbytes)])
        tbest = min(x["best_us"] for x in results[("torch", nbytes)])
        print(f"| {label} | {fmt(ot)} | {ob:.3f} GB/s | {fmt(tt)} | "
              f"{tb:.3f} GB/s | {ob / tb:.2f}x | {fmt(obest)} / {fmt(tbest)} |")


def fmt(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} us"


if __name__ == "__main__":
    main()
