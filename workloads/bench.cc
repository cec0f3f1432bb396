#include "workloads/bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "comm/gloo/process_group.h"
#include "workloads/op_buffer.h"
#include "workloads/op_runner.h"

namespace dlaunch::workloads {

BenchRow bench_one(comm::ProcessGroup& pg, BenchOp op, size_t bytes,
                   const BenchOptions& options) {
  size_t count = bytes / comm::dtype_size(options.dtype);
  OpRunner runner(pg, op, count, options.dtype, options.redop, options.root);
  runner.fill();
  for (int i = 0; i < options.warmup; ++i) runner.run();
  pg.barrier();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < options.iters; ++i) runner.run();
  double us = std::chrono::duration<double, std::micro>(
                  std::chrono::steady_clock::now() - t0)
                  .count() /
              std::max(options.iters, 1);
  const std::string path = comm::gloo::last_path(pg);

  // nccl-tests averages the time over ranks; #wrong is summed. A ping-pong
  // reports rank 0's one-way time: half its round trip.
  const bool pingpong = op == BenchOp::kPingPong;
  if (pingpong) us = pg.rank() == 0 ? us / 2 : 0;
  std::vector<double> totals = {us, 0};
  if (options.check) {
    runner.fill();
    runner.run();
    totals[1] = static_cast<double>(runner.wrong());
  }
  all_reduce_host(pg, comm::Tensor::of(totals));

  BenchRow row;
  row.bytes = runner.bytes();
  row.count = runner.count();
  row.dtype = options.dtype;
  row.redop = op_reduces(op) ? std::string(comm::reduce_op_name(options.redop))
                             : "none";
  row.root = op_has_root(op) ? options.root : -1;
  row.time_us = pingpong ? totals[0] : totals[0] / pg.size();
  row.path = path;
  row.wrong = options.check ? static_cast<int64_t>(totals[1]) : -1;
  compute_bandwidth(row, op, pg.size());
  return row;
}

double memcpy_gbs(size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);  // both touched
  std::memcpy(dst.data(), src.data(), bytes);
  std::vector<double> seconds;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
    src[i % bytes] = dst[bytes - 1];  // keeps the copies
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  return median > 0 ? static_cast<double>(bytes) / 1e9 / median : 0;
}

int64_t run_bench(comm::ProcessGroup& pg, const BenchOptions& options,
                  std::ostream& out) {
  std::vector<size_t> sizes = size_sweep(options.min_bytes, options.max_bytes,
                                         options.factor, options.increment);
  const bool print = pg.rank() == 0;
  int64_t wrong = 0;
  for (BenchOp op : options.ops) {
    if (print) {
      out << "# " << bench_op_name(op) << ": " << pg.size() << " ranks, "
          << options.iters << " iterations, " << options.warmup << " warm-up\n"
          << format_header() << std::flush;
    }
    std::string path;  // printed whenever it changes
    for (size_t bytes : sizes) {
      if ((op == BenchOp::kSendRecv || op == BenchOp::kPingPong) &&
          pg.size() == 1) {
        break;
      }
      size_t elems = bytes / comm::dtype_size(options.dtype);
      if (op_splits(op) && elems < static_cast<size_t>(pg.size())) continue;
      BenchRow row = bench_one(pg, op, bytes, options);
      if (row.wrong > 0) wrong += row.wrong;
      if (print && row.path != path) {
        path = row.path;
        out << "#  path: " << path << "\n";
      }
      if (print) out << format_row(row) << "\n" << std::flush;
    }
  }
  return wrong;
}

}  // namespace dlaunch::workloads
