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
check "mpi_bench: -o: unknown operation ''; $valid" -o ,pingpong 8
check "mpi_bench: unknown option '-x'; use -n ITERS, -w WARMUP, -o OP,..." \
  -x 1 8
check "mpi_bench: unknown option '-x'; use -n ITERS, -w WARMUP, -o OP,..." -x
check "mpi_bench: -n needs a value; use -n ITERS, -w WARMUP, -o OP,..." -n
iters="give a whole number of iterations, 1 or more"
check "mpi_bench: -n: bad value '5x'; $iters" -n 5x 8
check "mpi_bench: -n: bad value '0'; $iters" -n 0 8
warm="give a whole number of warm-ups, 0 or more"
check "mpi_bench: -w: bad value ''; $warm" -w '' 8
check "mpi_bench: -w: bad value '-1'; $warm" -w -1 8
check "mpi_bench: bad SIZE '1k'; give whole numbers of bytes" 1k
check "mpi_bench: bad SIZE '-x'; give whole numbers of bytes" 8 -x
check "mpi_bench: no SIZE given; give one or more sizes in bytes" -o pingpong
# Under mpirun only rank 0 says it: OpenMPI's, MPICH's (PMI) and PMIx's
# rank variables.
for var in OMPI_COMM_WORLD_RANK PMI_RANK PMIX_RANK; do
  err=$(env "$var=1" "$bench" -x 2>&1)
  rc=$?
  if [ "$rc:$err" != "2:" ]; then
    echo "$var=1 mpi_bench -x: exit $rc, output: $err (wanted exit 2, silent)"
    exit 1
  fi
done
echo "ok: every bad command line exits 2 naming the fix"
