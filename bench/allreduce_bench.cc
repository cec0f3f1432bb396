// allreduce_bench: all_reduce latency and bus bandwidth (nccl-tests
// convention: busbw = bytes / time * 2(n-1)/n) of dlaunch::comm's gloo
// backend. Run one copy per rank under a launcher:
//
//   dlaunch --nproc-per-node 2 build/bin/allreduce_bench [--json]
//
// Rank 0 prints one line per size: the median over repetitions of the mean
// time of `iters` back-to-back all_reduces of float32 (SUM).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/init.h"
#include "workloads/bench.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Size {
  size_t bytes;
  int iters;  // per repetition
  int reps;
};

}  // namespace

int main(int argc, char** argv) {
  bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  auto pg = dlaunch::comm::init_process_group("gloo");
  const int n = pg->size();
  const Size sizes[] = {
      {4 << 10, 2000, 7}, {1 << 20, 100, 7}, {64 << 20, 6, 7}};
  for (const Size& s : sizes) {
    std::vector<float> v(s.bytes / sizeof(float), 1.0f);
    auto t = dlaunch::comm::Tensor::of(v);
    for (int i = 0; i < std::max(3, s.iters / 10); ++i) pg->all_reduce(t);
    std::vector<double> per_op;
    for (int r = 0; r < s.reps; ++r) {
      pg->barrier();
      auto start = Clock::now();
      for (int i = 0; i < s.iters; ++i) pg->all_reduce(t);
      std::chrono::duration<double> d = Clock::now() - start;
      per_op.push_back(d.count() / s.iters);
    }
    std::sort(per_op.begin(), per_op.end());
    double sec = per_op[per_op.size() / 2];
    double best = per_op.front();
    double algbw = s.bytes / sec / 1e9;
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (pg->rank() == 0) {
      if (json) {
        std::printf(
            "{\"impl\": \"dlaunch\", \"ranks\": %d, \"bytes\": %zu, "
            "\"time_us\": %.2f, \"best_us\": %.2f, \"algbw_gbs\": %.4f, "
            "\"busbw_gbs\": %.4f}\n",
            n, s.bytes, sec * 1e6, best * 1e6, algbw, busbw);
      } else {
        std::printf(
            "%10zu bytes  %10.1f us  algbw %7.3f GB/s  busbw %7.3f "
            "GB/s\n",
            s.bytes, sec * 1e6, algbw, busbw);
      }
      std::fflush(stdout);
    }
  }
  // One process's memcpy of 64 MiB in the same run, the yardstick of the
  // 64 MiB all_reduce (dl-bench's statistic); rank 0 alone.
  if (!json && pg->rank() == 0) {
    std::printf("memcpy of 64 MiB: %.3f GB/s (one process, median of %d)\n",
                dlaunch::workloads::memcpy_gbs(64 << 20),
                dlaunch::workloads::kMemcpyReps);
  }
  pg->barrier();
  return 0;
}
