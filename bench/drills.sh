#!/usr/bin/env bash
# Reliability figures for docs/reliability.md: each drill run RUNS times
# with `dlaunch --drill`, printing the verdict rows' times (fired -> the
# failure detected, fired -> the group running again):
#   kill-N     SIGKILL to rank 1 of N `sh` workers (kill:rank=1:after=0.3)
#   freeze-N   SIGSTOP to rank 1 of N workers that touch their heartbeat
#              file every 10 ms, --hang-timeout 1 (stop:rank=1:after=0.3)
#   sgd        configs/drill_sgd.yaml (dl-sgd: a kill, then a freeze)
# "running again" is when the restarted group's workers were spawned; the
# program's own start (dl-sgd loads its data) comes on top.
# Usage: bench/drills.sh [BUILD_DIR] [RUNS]   (default build, 5)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
runs="${2:-5}"
dl="$build/bin/dlaunch"
[ -x "$dl" ] || { echo "drills: $dl missing; build first" >&2; exit 2; }
tmp="$(mktemp -d /tmp/dlaunch-drills-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

job() {  # NAME NPROC FAULT HANG SCRIPT
  cat > "$tmp/$1.yaml" <<YAML
program: sh
args: [-c, '$5']
nproc_per_node: $2
max_restarts: 1
${4:+hang_timeout: $4}
faults: [$3]
YAML
}
once='if [ "$TORCHELASTIC_RESTART_COUNT" = 1 ]; then exit 0; fi; '
for n in 2 8; do
  job "kill-$n" "$n" "kill:rank=1:after=0.3" "" "${once}exec sleep 60"
  job "freeze-$n" "$n" "stop:rank=1:after=0.3" 1 \
    "${once}while :; do touch \"\$DLAUNCH_HEARTBEAT_FILE\"; sleep 0.01; done"
done

echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
printf '%-10s %-36s %14s %20s\n' drill fault "detected after" "running again after"
for name in kill-2 kill-8 freeze-2 freeze-8 sgd; do
  file="$tmp/$name.yaml"
  [ "$name" = sgd ] && file=configs/drill_sgd.yaml
  for ((i = 0; i < runs; i++)); do
    DLAUNCH_BIN="$(realpath "$build/bin")" "$dl" --drill "$file" 2>/dev/null |
      awk -v d="$name" '$2 ~ /s$/ || $3 == "s" {
        if ($1 ~ /:/ && $NF == "ok") printf "%-10s %-36s %12s s %18s s\n", d, $1, $4, $6 }'
  done
done
