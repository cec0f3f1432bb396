#!/usr/bin/env bash
# Compares dl-store with Debian's redis-server on this machine, in one sitting:
# redis-benchmark and dl-store-bench take turns (3 runs each, interleaved, so
# background load hits both alike), each server in its own process on
# loopback. dl-store-bench runs with both drivers: "loop" (one epoll thread
# drives all connections, as redis-benchmark does) and "threads" (one
# TcpStore per client thread, as ranks use the store). Prints the medians as
# the markdown table in docs/performance.md.
#
# Usage: bench/store_vs_redis.sh [BIN_DIR]   (default build/bin; run
# scripts/build first). Env: RUNS (3), CLIENTS (64), REQUESTS (200000),
# BARRIER_CLIENTS (1024).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build/bin}"
runs="${RUNS:-3}"
clients="${CLIENTS:-64}"
requests="${REQUESTS:-200000}"
barrier_clients="${BARRIER_CLIENTS:-1024}"
for tool in redis-server redis-benchmark redis-cli "$bin/dl-store" "$bin/dl-store-bench"; do
  command -v "$tool" >/dev/null || {
    echo "store_vs_redis: $tool not found (scripts/setup installs redis-server; scripts/build builds $bin)" >&2
    exit 1
  }
done

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# redis-server on a free loopback port, without persistence.
redis_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
  --logfile "$work/redis.log" &
pids+=($!)
for _ in $(seq 100); do
  [ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && break
  sleep 0.05
done
[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] || {
  echo "store_vs_redis: redis-server did not start on port $redis_port" >&2
  cat "$work/redis.log" >&2
  exit 1
}

# dl-store on port 0; its first line names the port it got.
mkfifo "$work/dl-store.out"
"$bin/dl-store" --host 127.0.0.1 --port 0 >"$work/dl-store.out" &
pids+=($!)
read -r -t 10 line <"$work/dl-store.out" || true
store_addr="${line##* }"
case "$line" in
  "dl-store listening on 127.0.0.1:"*) ;;
  *) echo "store_vs_redis: dl-store did not start (got '$line')" >&2; exit 1 ;;
esac

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

: >"$work/redis_set"; : >"$work/redis_get"
: >"$work/redis_set_p50"; : >"$work/redis_get_p50"
: >"$work/barrier"
for d in loop threads; do for op in set get; do for f in "" _p50 _p99; do
  : >"$work/${d}_${op}${f}"
done; done; done
for run in $(seq "$runs"); do
  out="$(redis-benchmark -t set,get -c "$clients" -n "$requests" -p "$redis_port" -q | tr '\r' '\n')"
  echo "$out" | grep -E '^(SET|GET): [0-9.]+ requests per second' | sed 's/^/  redis /' >&2
  echo "$out" | sed -nE 's/^SET: ([0-9.]+) requests per second.*/\1/p' >>"$work/redis_set"
  echo "$out" | sed -nE 's/^GET: ([0-9.]+) requests per second.*/\1/p' >>"$work/redis_get"
  for op in SET GET; do
    lower="$(echo "$op" | tr A-Z a-z)"
    echo "$out" | sed -nE "s/^$op: .*p50=([0-9.]+) msec.*/\1/p" |
      awk '{print $1 * 1000}' >>"$work/redis_${lower}_p50"
  done
  for d in loop threads; do
    for op in set get; do
      line="$("$bin/dl-store-bench" --addr "$store_addr" --clients "$clients" --requests "$requests" --op "$op" --driver "$d")"
      echo "  dl-store ($d) $line" >&2
      echo "$line" | sed -nE 's/^[a-z]+: ([0-9.]+) req\/s.*/\1/p' >>"$work/${d}_$op"
      echo "$line" | sed -nE 's/.*p50 ([0-9.]+) us.*/\1/p' >>"$work/${d}_${op}_p50"
      echo "$line" | sed -nE 's/.*p99 ([0-9.]+) us.*/\1/p' >>"$work/${d}_${op}_p99"
    done
  done
  line="$("$bin/dl-store-bench" --addr "$store_addr" --clients "$barrier_clients" --op barrier --rounds 5)"
  echo "  dl-store $line" >&2
  echo "$line" | sed -nE 's/^barrier: [0-9]+ clients in ([0-9.]+) ms.*/\1/p' >>"$work/barrier"
done

printf '| %s | %s | %s | %s |\n' "$clients clients, $requests requests" \
  "redis-server req/s (p50 us)" "dl-store req/s, loop driver (p50 / p99 us)" \
  "dl-store req/s, $clients TcpStore threads (p50 / p99 us)"
printf '| --- | --- | --- | --- |\n'
for op in set get; do
  printf '| %s | %.0f (%s) | %.0f (%s / %s) | %.0f (%s / %s) |\n' "$op" \
    "$(median <"$work/redis_$op")" "$(median <"$work/redis_${op}_p50")" \
    "$(median <"$work/loop_$op")" "$(median <"$work/loop_${op}_p50")" "$(median <"$work/loop_${op}_p99")" \
    "$(median <"$work/threads_$op")" "$(median <"$work/threads_${op}_p50")" "$(median <"$work/threads_${op}_p99")"
done
printf '\nbarrier, %s clients: %s ms (median of %s runs, each the median of 5 rounds)\n' \
  "$barrier_clients" "$(median <"$work/barrier")" "$runs"
