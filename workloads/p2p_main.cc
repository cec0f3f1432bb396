// dl-p2p: the seeds' blocking and non-blocking send/recv, and ping-pong.
#include <cstdio>
#include <iostream>
#include <string>

#include "comm/cli_checks.h"
#include "workloads/bench_table.h"
#include "workloads/p2p.h"
#include "workloads/worker.h"

int main(int argc, char** argv) {
  using namespace dlaunch::workloads;
  CLI::App app(
      "Point to point between ranks 0 and 1: the seeds' blocking and "
      "non-blocking send/recv, or --ping-pong latency and bandwidth per "
      "size. Run it under dlaunch, e.g. "
      "build/bin/dlaunch --nproc-per-node 2 build/bin/dl-p2p",
      "dl-p2p");
  bool pingpong = false;
  std::string minb = "8", maxb = "4M", backend = "gloo";
  double factor = 4;
  int iters = 20, warmup = 5;
  app.add_flag("--ping-pong", pingpong,
               "measure round trips between ranks 0 and 1 instead");
  app.add_option("-b,--minbytes", minb, "ping-pong: first size (default 8)");
  app.add_option("-e,--maxbytes", maxb, "ping-pong: last size (default 4M)");
  app.add_option("-f,--stepfactor", factor,
                 "ping-pong: size multiplier (default 4)");
  app.add_option("-n,--iters", iters,
                 "ping-pong: timed round trips (default 20)")
      ->check(dlaunch::comm::whole_number(1));
  app.add_option("-w,--warmup_iters", warmup,
                 "ping-pong: untimed round trips (default 5)")
      ->check(dlaunch::comm::whole_number(0));
  app.add_option("--backend", backend, "gloo or nccl (default gloo)");
  return run_main(app, argc, argv, [&]() -> int {
    std::vector<size_t> sizes =
        size_sweep(parse_size(minb, "-b"), parse_size(maxb, "-e"), factor, 0);
    auto pg = init_world(backend, "dl-p2p");
    if (pg->size() < 2) {
      throw std::invalid_argument(
          "dl-p2p needs at least 2 ranks (world size is 1); start it with "
          "dlaunch --nproc-per-node 2");
    }
    if (!pingpong) {
      float a = p2p_blocking(*pg, std::cout);
      pg->barrier();
      float b = p2p_nonblocking(*pg, std::cout);
      bool ok = pg->rank() > 1 || (a == 1.0f && b == 1.0f);
      return ok ? 0 : 1;
    }
    std::vector<PingPongRow> rows = ping_pong(*pg, sizes, iters, warmup);
    bool ok = true;
    if (pg->rank() == 0) {
      std::printf("# ping-pong rank 0 <-> rank 1, %d round trips per size\n",
                  iters);
      std::printf("# %10s  %12s  %10s  %6s\n", "size(B)", "latency(us)",
                  "bw(GB/s)", "check");
      for (const PingPongRow& r : rows) {
        std::printf("%12zu  %12.2f  %10.3f  %6s\n", r.bytes, r.latency_us,
                    r.bandwidth_gbs, r.ok ? "ok" : "WRONG");
        ok = ok && r.ok;
      }
      std::fflush(stdout);
    } else if (pg->rank() == 1) {
      for (const PingPongRow& r : rows) ok = ok && r.ok;
    }
    return ok ? 0 : 1;
  });
}
