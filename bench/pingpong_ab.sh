#!/usr/bin/env bash
# One size of the 2-rank ping-pong, dl-bench under dlaunch against
# bench/mpi_bench.c under mpirun, in alternating order for ROUNDS rounds
# (issue 15's method); prints both medians and their ratio. For the 8 B
# target, whose OpenMPI side moves between about 0.16 and 0.45 us with the
# machine's state: run it when OpenMPI shows near 0.16 us.
# Usage: bench/pingpong_ab.sh [BYTES] [ROUNDS] [BUILD_DIR]   (8, 9, build)
set -euo pipefail
cd "$(dirname "$0")/.."
bytes="${1:-8}"
rounds="${2:-9}"
bin="${3:-build}/bin"
for b in dlaunch dl-bench mpi_bench; do
  [ -x "$bin/$b" ] || { echo "pingpong_ab: $bin/$b missing; build first" >&2; exit 2; }
done
iters=10000 warm=100  # OSU's osu_latency counts for small messages
if [ "$bytes" -gt 8192 ]; then iters=200 warm=10; fi
dl() {
  OMP_NUM_THREADS=1 "$bin/dlaunch" --nproc-per-node 2 "$bin/dl-bench" -b "$bytes" -e "$bytes" \
    -n "$iters" -w "$warm" -c 0 -o pingpong |
    sed 's/.*]://' | awk '/^ *[0-9]/ && NF > 5 { print $6; exit }'
}
mpi() {
  mpirun --allow-run-as-root --oversubscribe -np 2 "$bin/mpi_bench" \
    -n "$iters" -w "$warm" "$bytes" | awk '$1 == "pingpong" { print $3 }'
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then d=$(dl); m=$(mpi); else m=$(mpi); d=$(dl); fi
  echo "$d $m"
done | python3 -c '
import statistics, sys
rows = [tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
d = statistics.median(r[0] for r in rows)
m = statistics.median(r[1] for r in rows)
print(f"{len(rows)} rounds, one-way us: dlaunch {d:.3f}, OpenMPI {m:.3f}, "
      f"ratio {d / m:.3f}")'
