#pragma once

#include <cstddef>
#include <ostream>
#include <vector>

#include "comm/process_group.h"
#include "workloads/bench_table.h"

namespace dlaunch::workloads {

// memcpy_gbs()'s default number of timed copies.
inline constexpr int kMemcpyReps = 7;

struct BenchOptions {
  size_t min_bytes = 32;        // -b: first size; default 32 B
  size_t max_bytes = 32 << 20;  // -e: last size; default 32 MiB
  double factor = 2;            // -f: size multiplier; default 2
  size_t increment = 0;         // -i: size step when -f is 1; default 0
  std::vector<BenchOp> ops = parse_bench_ops("all");  // -o; default all
  comm::DType dtype = comm::DType::kF32;              // -d; default float
  comm::ReduceOp redop = comm::ReduceOp::kSum;        // --redop; default sum
  int root = 0;       // -r: root of rooted ops; default 0
  int iters = 20;     // -n: timed iterations; default 20
  int warmup = 5;     // -w: untimed iterations first; default 5
  bool check = true;  // -c: check results (#wrong); default on
};

// Measures one operation at one size over `pg`: warm-up, a barrier, `iters`
// timed runs (time averaged over ranks), then one checked run from freshly
// filled buffers. Every rank must call it with the same arguments.
BenchRow bench_one(comm::ProcessGroup& pg, BenchOp op, size_t bytes,
                   const BenchOptions& options);

// The whole sweep: for each op, a title line and one row per size. Rank 0
// writes the table to `out` (others may pass any stream; nothing is written
// there). Returns the total #wrong over all rows and ranks.
int64_t run_bench(comm::ProcessGroup& pg, const BenchOptions& options,
                  std::ostream& out);

// One process's memcpy rate for `bytes` in GB/s: the median of `reps`
// timed copies (at least 1) after an untimed one that touches every page,
// the statistic OSU and nccl-tests report (robust on a loaded machine). The
// yardstick for the shared-memory collectives (a 64 MiB all_reduce on 2
// ranks should reach 0.4x of it, issue #15), printed by dl-bench and
// allreduce_bench.
double memcpy_gbs(size_t bytes, int reps = kMemcpyReps);

}  // namespace dlaunch::workloads
