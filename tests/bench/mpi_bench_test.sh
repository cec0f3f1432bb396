#!/bin/sh
# bench/mpi_bench's bad command lines: exit 2 and one line on stderr that
# names the mistake and the valid choices. $1: the mpi_bench binary.
bench=$1
check() {  # WANT ARGS...
  want=$1
  shift
  err=$("$bench" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | wc -l)
  case "$rc:$lines:$err" in
    "2:1:"*"$want"*) ;;
    *)
      echo "mpi_bench $*: exit $rc, stderr: $err (wanted exit 2 and: $want)"
      exit 1
      ;;
  esac
}
valid="valid: pingpong, all_reduce, broadcast, reduce, all_gather, gather,"
valid="$valid scatter, reduce_scatter, all_to_all (comma-separated)"
check "mpi_bench: -o: unknown operation 'allreduce'; $valid" -o allreduce 8
check "mpi_bench: -o: unknown operation 'nosuch'; $valid" \
  -o all_reduce,nosuch 8
check "mpi_bench: -o: unknown operation ''; $valid" -o all_reduce, 8
check "mpi_bench: unknown option '-x'; use -n ITERS, -w WARMUP, -o OP,..." \
  -x 1 8
echo "ok: every bad command line exits 2 naming the fix"
