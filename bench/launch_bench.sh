#!/usr/bin/env bash
# Launch and restart cost, side by side in one hyperfine run (results in
# docs/performance.md, "Launch and restart"):
#   forkexec8        bare C fork/exec/wait of 8 `true` (the floor)
#   dlaunch          dlaunch --nproc-per-node 8 true
#   torchrun         Debian python3-torch's torchrun, 8 x true
#   mpirun           Open MPI's mpirun -np 8 true
#   dlaunch-ok       dlaunch, 8 x launch-fail-once told not to fail
#   dlaunch-restart  dlaunch, 8 x launch-fail-once failing on attempt 0
# "restart adds" = dlaunch-restart - dlaunch-ok.
# Usage: bench/launch_bench.sh [BUILD_DIR] [RUNS]   (default build, 30)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
runs="${2:-30}"
bin="$build/bin"
for b in dlaunch forkexec8 launch-fail-once; do
  [ -x "$bin/$b" ] || { echo "launch_bench: $bin/$b missing; build first" >&2; exit 2; }
done
command -v hyperfine >/dev/null || { echo "launch_bench: hyperfine missing (scripts/setup)" >&2; exit 2; }
out="$(mktemp -d /tmp/launch-bench-XXXXXX)"
trap 'rm -rf "$out"' EXIT
fail_once="$(realpath "$bin/launch-fail-once")"

hyperfine -N --warmup 3 --runs "$runs" --export-json "$out/results.json" \
  -n forkexec8 "$bin/forkexec8 8 true" \
  -n dlaunch "$bin/dlaunch --nproc-per-node 8 true" \
  -n torchrun "/usr/bin/python3 -m torch.distributed.run -r 1 -t 1 --log_dir $out/torchrun --monitor_interval 0.1 --nproc_per_node 8 --no_python true" \
  -n mpirun "mpirun --allow-run-as-root --oversubscribe -np 8 true" \
  -n dlaunch-ok "env LAUNCH_BENCH_FAIL=0 $bin/dlaunch --nproc-per-node 8 --max-restarts 1 $fail_once" \
  -n dlaunch-restart "env LAUNCH_BENCH_FAIL=1 $bin/dlaunch --nproc-per-node 8 --max-restarts 1 $fail_once" \
  >&2

python3 - "$out/results.json" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
med = {k: v["median"] * 1e3 for k, v in r.items()}
base = med["forkexec8"]
print("| command | median (ms) | vs fork/exec loop |")
print("| --- | ---: | ---: |")
for k in ["forkexec8", "dlaunch", "torchrun", "mpirun", "dlaunch-ok", "dlaunch-restart"]:
    print(f"| {k} | {med[k]:.1f} | {med[k] / base:.2f}x |")
print()
print(f"restart adds: {med['dlaunch-restart'] - med['dlaunch-ok']:.1f} ms "
      f"(dlaunch-restart - dlaunch-ok); dlaunch-ok itself {med['dlaunch-ok']:.1f} ms")
PY
