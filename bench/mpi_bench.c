/* OpenMPI's side of the collectives comparison (docs/performance.md,
 * "One host, side by side"): the operations and sizes dl-bench measures,
 * with nccl-tests' size convention (the size of the whole buffer; the
 * splitting ops move size / ranks per rank), and OSU's one-way ping-pong
 * latency between ranks 0 and 1.
 *
 *   mpicc -O2 -o mpi_bench bench/mpi_bench.c
 *   mpirun -np 2 ./mpi_bench [-n ITERS] [-w WARMUP] [-o OP,...] SIZE...
 *
 * An unknown option or op exits 2 with one line naming it and the valid
 * ones, before MPI starts.
 *
 * Prints one line per op and size: "op bytes time_us", OSU's statistic and
 * dl-bench's: each rank's mean time per call over the iterations, averaged
 * over the ranks (a rank that leaves a call early, as an eager sender of a
 * gather does, counts as much as the root that waits for it). The
 * ping-pong's is rank 0's half round trip, as osu_latency's. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char* kOps[] = {"pingpong", "all_reduce",     "broadcast",
                             "reduce",   "all_gather",     "gather",
                             "scatter",  "reduce_scatter", "all_to_all"};

/* The first item of the comma list `only` that is no op, or NULL. */
static const char* unknown_op(const char* only) {
  for (const char* p = only; p; p = strchr(p, ',')) {
    if (*p == ',') ++p;
    const size_t n = strcspn(p, ",");
    int found = 0;
    for (size_t o = 0; o < sizeof(kOps) / sizeof(kOps[0]); ++o) {
      found |= strlen(kOps[o]) == n && strncmp(p, kOps[o], n) == 0;
    }
    if (!found) return p;
  }
  return NULL;
}

/* A bad command line: one line naming it and the fix (from rank 0 alone
 * under mpirun), exit 2, before MPI starts. */
static int usage_error(const char* what, const char* fix) {
  const char* rank = getenv("OMPI_COMM_WORLD_RANK");
  if (rank == NULL || strcmp(rank, "0") == 0) {
    fprintf(stderr, "mpi_bench: %s; %s\n", what, fix);
  }
  return 2;
}

/* Whether `op` is in the comma list `only` (NULL: every op). */
static int wanted(const char* only, const char* op) {
  const size_t n = strlen(op);
  for (const char* p = only; p; p = strchr(p, ',')) {
    if (*p == ',') ++p;
    if (strncmp(p, op, n) == 0 && (p[n] == ',' || p[n] == 0)) return 1;
  }
  return only == NULL;
}

static void run(const char* op, float* in, float* out, size_t bytes, int rank,
                int n) {
  const int count = (int)(bytes / sizeof(float));
  const int part = count / n;
  if (strcmp(op, "pingpong") == 0) {
    if (rank == 0) {
      MPI_Send(in, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(out, count, MPI_FLOAT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(out, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(out, count, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
    }
  } else if (strcmp(op, "all_reduce") == 0) {
    MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (strcmp(op, "broadcast") == 0) {
    MPI_Bcast(in, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (strcmp(op, "reduce") == 0) {
    MPI_Reduce(in, out, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
  } else if (strcmp(op, "all_gather") == 0) {
    MPI_Allgather(in, part, MPI_FLOAT, out, part, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (strcmp(op, "gather") == 0) {
    MPI_Gather(in, part, MPI_FLOAT, out, part, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (strcmp(op, "scatter") == 0) {
    MPI_Scatter(in, part, MPI_FLOAT, out, part, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (strcmp(op, "reduce_scatter") == 0) {
    MPI_Reduce_scatter_block(in, out, part, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (strcmp(op, "all_to_all") == 0) {
    MPI_Alltoall(in, part, MPI_FLOAT, out, part, MPI_FLOAT, MPI_COMM_WORLD);
  }
}

int main(int argc, char** argv) {
  int iters = 20, warmup = 5, first = 1;
  const char* only = NULL;
  while (first + 1 < argc && argv[first][0] == '-') {
    if (strcmp(argv[first], "-n") == 0) {
      iters = atoi(argv[first + 1]);
    } else if (strcmp(argv[first], "-w") == 0) {
      warmup = atoi(argv[first + 1]);
    } else if (strcmp(argv[first], "-o") == 0) {
      only = argv[first + 1];
    } else {
      char what[256];
      snprintf(what, sizeof what, "unknown option '%.200s'", argv[first]);
      return usage_error(what, "use -n ITERS, -w WARMUP, -o OP,...");
    }
    first += 2;
  }
  /* A misspelt op would measure nothing and exit 0. */
  if (only != NULL && unknown_op(only) != NULL) {
    const char* bad = unknown_op(only);
    int len = (int)strcspn(bad, ",");
    if (len > 200) len = 200;
    char what[256], fix[256];
    snprintf(what, sizeof what, "-o: unknown operation '%.*s'", len, bad);
    size_t used = (size_t)snprintf(fix, sizeof fix, "valid: ");
    for (size_t o = 0; o < sizeof(kOps) / sizeof(kOps[0]); ++o) {
      used += (size_t)snprintf(fix + used, sizeof fix - used, "%s%s",
                               o ? ", " : "", kOps[o]);
    }
    snprintf(fix + used, sizeof fix - used, " (comma-separated)");
    return usage_error(what, fix);
  }
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (size_t o = 0; o < sizeof(kOps) / sizeof(kOps[0]); ++o) {
    if (!wanted(only, kOps[o])) continue;
    for (int a = first; a < argc; ++a) {
      const size_t bytes = strtoull(argv[a], NULL, 10);
      const size_t count = bytes / sizeof(float) + 1;
      float* in = malloc(count * sizeof(float));
      float* out = malloc(count * sizeof(float));
      /* Real data, as dl-bench and torch's side have: a calloc'd buffer
       * that is only read stays mapped to the kernel's one zero page, so
       * every source read would hit the cache (64 MiB gather, scatter,
       * broadcast: 1.5-2.5x faster than with data). */
      for (size_t i = 0; i < count; ++i) in[i] = out[i] = 1.0f;
      for (int i = 0; i < warmup; ++i) run(kOps[o], in, out, bytes, rank, n);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i) run(kOps[o], in, out, bytes, rank, n);
      double us = (MPI_Wtime() - t0) * 1e6 / iters;
      const int pingpong = strcmp(kOps[o], "pingpong") == 0;
      if (pingpong) us = rank == 0 ? us / 2 : 0;
      double sum = 0;
      MPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        printf("%s %zu %.3f\n", kOps[o], bytes, pingpong ? sum : sum / n);
      }
      fflush(stdout);
      free(in);
      free(out);
    }
  }
  MPI_Finalize();
  return 0;
}
