/* OpenMPI's side of the collectives comparison (docs/performance.md,
 * "One host, side by side"): the operations and sizes dl-bench measures,
 * with nccl-tests' size convention (the size of the whole buffer; the
 * splitting ops move size / ranks per rank), and OSU's one-way ping-pong
 * latency between ranks 0 and 1.
 *
 *   mpicc -O2 -o mpi_bench bench/mpi_bench.c
 *   mpirun -np 2 ./mpi_bench [-n ITERS] [-w WARMUP] [-o OP,...] SIZE...
 *
 * A bad command line (an unknown option or op, a count or SIZE that is no
 * whole number, no SIZE) exits 2 with one line naming it and the fix,
 * before MPI starts.
 *
 * Prints one line per op and size: "op bytes time_us", OSU's statistic and
 * dl-bench's: each rank's mean time per call over the iterations, averaged
 * over the ranks (a rank that leaves a call early, as an eager sender of a
 * gather does, counts as much as the root that waits for it). The
 * ping-pong's is rank 0's half round trip, as osu_latency's. */
#include <errno.h>
#include <limits.h>
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
    if (p != only) ++p; /* past the comma; a leading one is an empty item */
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
 * under mpirun: OpenMPI's, MPICH's hydra (PMI) or a PMIx launcher's rank
 * variable), exit 2, before MPI starts. */
static int usage_error(const char* what, const char* fix) {
  static const char* kRankVars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                    "PMIX_RANK"};
  for (size_t v = 0; v < sizeof(kRankVars) / sizeof(kRankVars[0]); ++v) {
    const char* rank = getenv(kRankVars[v]);
    if (rank != NULL && strcmp(rank, "0") != 0) return 2;
  }
  fprintf(stderr, "mpi_bench: %s; %s\n", what, fix);
  return 2;
}

/* `text` as a whole decimal number in [min, max] into `out`; 0 when it is
 * not one (garbage, a sign where none is allowed, out of range). */
static int parse_number(const char* text, unsigned long long min,
                        unsigned long long max, unsigned long long* out) {
  if (text[0] < '0' || text[0] > '9') return 0; /* no sign, no space */
  char* end = NULL;
  errno = 0;
  const unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != 0 || v < min || v > max) return 0;
  *out = v;
  return 1;
}

/* Whether `op` is in the comma list `only` (NULL: every op). */
static int wanted(const char* only, const char* op) {
  const size_t n = strlen(op);
  for (const char* p = only; p; p = strchr(p, ',')) {
    if (p != only) ++p;
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
  static const char* kOptions = "use -n ITERS, -w WARMUP, -o OP,...";
  int iters = 20, warmup = 5, first = 1;
  const char* only = NULL;
  char what[256];
  for (; first < argc && argv[first][0] == '-'; first += 2) {
    const char* flag = argv[first];
    if (strcmp(flag, "-n") != 0 && strcmp(flag, "-w") != 0 &&
        strcmp(flag, "-o") != 0) {
      snprintf(what, sizeof what, "unknown option '%.200s'", flag);
      return usage_error(what, kOptions);
    }
    if (first + 1 == argc) {
      snprintf(what, sizeof what, "%s needs a value", flag);
      return usage_error(what, kOptions);
    }
    const char* value = argv[first + 1];
    unsigned long long v = 0;
    if (flag[1] == 'o') {
      only = value;
    } else if (!parse_number(value, flag[1] == 'n', INT_MAX, &v)) {
      snprintf(what, sizeof what, "%s: bad value '%.200s'", flag, value);
      return usage_error(what, flag[1] == 'n'
                                   ? "give a whole number of iterations, 1 "
                                     "or more"
                                   : "give a whole number of warm-ups, 0 or "
                                     "more");
    } else {
      *(flag[1] == 'n' ? &iters : &warmup) = (int)v;
    }
  }
  if (first == argc) {
    return usage_error("no SIZE given", "give one or more sizes in bytes");
  }
  for (int a = first; a < argc; ++a) {
    unsigned long long bytes = 0;
    if (!parse_number(argv[a], 0, (unsigned long long)INT_MAX * sizeof(float),
                      &bytes)) {
      snprintf(what, sizeof what, "bad SIZE '%.200s'", argv[a]);
      return usage_error(what,
                         "give whole numbers of bytes (options go before "
                         "them)");
    }
  }
  /* A misspelt op would measure nothing and exit 0. */
  if (only != NULL && unknown_op(only) != NULL) {
    const char* bad = unknown_op(only);
    int len = (int)strcspn(bad, ",");
    if (len > 200) len = 200;
    char fix[256];
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
      if (!in || !out) {
        fprintf(stderr,
                "mpi_bench: cannot allocate 2 x %zu bytes for SIZE %s; "
                "give a smaller SIZE\n",
                count * sizeof(float), argv[a]);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
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
