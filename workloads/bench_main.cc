// dl-bench: nccl-tests-style bandwidth of every collective and send/recv.
#include <iomanip>
#include <iostream>
#include <string>

#include "comm/cli_checks.h"
#include "workloads/bench.h"
#include "workloads/worker.h"

int main(int argc, char** argv) {
  using namespace dlaunch::workloads;
  CLI::App app(
      "nccl-tests-style bandwidth of every collective and send/recv over "
      "comm; run it under dlaunch, e.g. "
      "build/bin/dlaunch --nproc-per-node 2 build/bin/dl-bench -b 8 -e 1M",
      "dl-bench");
  BenchOptions opt;
  std::string minb = "32", maxb = "32M", step = "0", ops = "all",
              dtype = "float", redop = "sum", backend = "gloo";
  int check = 1;
  app.add_option("-b,--minbytes", minb,
                 "first size in bytes, K/M/G suffixes (default 32)");
  app.add_option("-e,--maxbytes", maxb, "last size (default 32M)");
  app.add_option("-f,--stepfactor", opt.factor,
                 "multiply the size by this (default 2)");
  app.add_option("-i,--stepbytes", step,
                 "add this many bytes instead when -f is 1 (default 0)");
  app.add_option(
      "-o,--op", ops,
      "operation: all, or a comma list of all_reduce, all_gather, "
      "broadcast, reduce, reduce_scatter, all_to_all, sendrecv, "
      "scatter, gather, pingpong (one-way latency between ranks 0 and 1, "
      "as OSU's osu_latency; not in all) (default all; nccl-tests picks the "
      "collective by binary and uses -o for the reduction, which "
      "is --redop here)");
  app.add_option("-d,--datatype", dtype,
                 "float, double, half, bfloat16, int8, uint8, int32, int64 "
                 "(default float)");
  app.add_option("--redop", redop, "sum, prod, min, max, avg (default sum)");
  app.add_option("-r,--root", opt.root, "root of rooted ops (default 0)");
  app.add_option("-n,--iters", opt.iters, "timed iterations (default 20)")
      ->check(dlaunch::comm::whole_number(1));
  app.add_option("-w,--warmup_iters", opt.warmup,
                 "untimed iterations first (default 5)")
      ->check(dlaunch::comm::whole_number(0));
  app.add_option("-c,--check", check, "check results, 0 or 1 (default 1)")
      ->check(CLI::Range(0, 1));
  app.add_option("--backend", backend, "gloo or nccl (default gloo)");
  return run_main(app, argc, argv, [&]() -> int {
    opt.min_bytes = parse_size(minb, "-b");
    opt.max_bytes = parse_size(maxb, "-e");
    opt.increment = parse_size(step, "-i");
    opt.ops = parse_bench_ops(ops);
    opt.dtype = parse_nccl_dtype(dtype);
    opt.redop = parse_redop(redop);
    opt.check = check != 0;
    size_sweep(opt.min_bytes, opt.max_bytes, opt.factor, opt.increment);
    auto pg = init_world(backend, "dl-bench");
    if (opt.root < 0 || opt.root >= pg->size()) {
      throw std::invalid_argument("-r " + std::to_string(opt.root) +
                                  ": root must be a rank, 0.." +
                                  std::to_string(pg->size() - 1));
    }
    if (pg->rank() == 0) {
      std::cout << "# dl-bench: " << pg->size() << " ranks, backend "
                << pg->backend() << ", type " << nccl_dtype_name(opt.dtype)
                << "\n";
    }
    // The yardstick for large sizes, measured by rank 0 alone while its
    // peers wait for the first operation.
    if (pg->rank() == 0 && opt.max_bytes >= (64 << 20)) {
      std::cout << "# memcpy: 64 MiB in one process at " << std::fixed
                << std::setprecision(2) << memcpy_gbs(64 << 20)
                << " GB/s (median of " << kMemcpyReps << ")\n"
                << std::defaultfloat;
    }
    int64_t wrong = run_bench(*pg, opt, std::cout);
    if (pg->rank() == 0) {
      std::cout << "# Out of bounds values : " << wrong
                << (wrong == 0 ? " OK" : " FAILED") << "\n"
                << std::flush;
    }
    return wrong == 0 ? 0 : 1;
  });
}
