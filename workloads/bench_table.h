#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/tensor.h"

namespace dlaunch::workloads {

// The operations dl-bench measures, in the order `-o all` runs them.
enum class BenchOp : uint8_t {
  kAllReduce,
  kAllGather,
  kBroadcast,
  kReduce,
  kReduceScatter,
  kAllToAll,
  kSendRecv,
  kScatter,
  kGather,
  kPingPong,  // ranks 0 and 1 only, not in "all" (OSU's osu_latency)
};

// "all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter",
// "all_to_all", "sendrecv", "scatter", "gather" (nccl-tests' binary names
// without _perf).
std::string_view bench_op_name(BenchOp op);
// "all" (every operation but pingpong) or a comma-separated list of names,
// pingpong included; throws std::invalid_argument
// naming the bad entry and the valid names.
std::vector<BenchOp> parse_bench_ops(std::string_view s);
// nccl-tests' bus-bandwidth factor for `op` over `nranks`: 2(n-1)/n for
// all-reduce; (n-1)/n for all-gather, reduce-scatter, all-to-all; 1 for
// broadcast, reduce, send/recv and pingpong.
double bus_factor(BenchOp op, int nranks);
// Whether the operation reduces (prints its redop) or has a root.
bool op_reduces(BenchOp op);
bool op_has_root(BenchOp op);
// Whether `count` elements are split in nranks equal chunks (all-gather,
// reduce-scatter, all-to-all, scatter, gather), so the count is rounded down
// to a multiple.
bool op_splits(BenchOp op);

// A byte count with an optional K, M or G suffix (powers of 1024, as
// nccl-tests): "8", "1K", "64M", "1G". Throws std::invalid_argument naming
// `flag`, the value and the valid forms.
size_t parse_size(std::string_view s, std::string_view flag = "size");

// nccl-tests' type names: float, double, half, bfloat16, int8, uint8, int32,
// int64. Throws std::invalid_argument listing them.
comm::DType parse_nccl_dtype(std::string_view s);
std::string_view nccl_dtype_name(comm::DType t);
// sum, prod, min, max, avg. Throws std::invalid_argument listing them.
comm::ReduceOp parse_redop(std::string_view s);

// Sizes from `min_bytes` to `max_bytes`: multiplied by `factor` when it is
// above 1, else stepped by `increment` bytes (nccl-tests' -f and -i).
// Throws std::invalid_argument when min > max or neither grows the size.
std::vector<size_t> size_sweep(size_t min_bytes, size_t max_bytes,
                               double factor, size_t increment);

// One measured row: nccl-tests' out-of-place columns.
struct BenchRow {
  size_t bytes = 0;  // size (B)
  size_t count = 0;  // elements
  comm::DType dtype = comm::DType::kF32;
  std::string redop;   // "sum", ... or "none"
  int root = -1;       // -1 when the op has no root
  double time_us = 0;  // mean per iteration, averaged over ranks
  double algbw = 0;    // GB/s (1e9 bytes), bytes / time
  double busbw = 0;    // algbw * bus_factor
  int64_t wrong = -1;  // elements wrong over all ranks; -1: not checked
  std::string path;    // the comm path rank 0 took (gloo::last_path)
};

// Fills algbw and busbw from bytes and time_us.
void compute_bandwidth(BenchRow& row, BenchOp op, int nranks);

// nccl-tests' four header lines (comment lines start with '#').
std::string format_header();
// One row in nccl-tests' column widths and number formats.
std::string format_row(const BenchRow& row);

}  // namespace dlaunch::workloads
