// dl-collectives: every collective over the world and a sub-group, checked.
#include <iostream>

#include "workloads/collectives.h"
#include "workloads/worker.h"

int main(int argc, char** argv) {
  using namespace dlaunch::workloads;
  CLI::App app(
      "Runs every collective over the world and over the group {0, 1}, "
      "prints what each rank holds and one PASS/FAIL line per operation; "
      "exits 1 on any failure. Run it under dlaunch, e.g. "
      "build/bin/dlaunch --nproc-per-node 4 build/bin/dl-collectives",
      "dl-collectives");
  std::string backend = "gloo";
  app.add_option("--backend", backend, "gloo or nccl (default gloo)");
  return run_main(app, argc, argv, [&]() -> int {
    auto pg = init_world(backend, "dl-collectives");
    int failed = run_collectives(*pg, std::cout);
    if (pg->rank() == 0) {
      std::cout << (failed == 0
                        ? "all collectives passed"
                        : std::to_string(failed) + " collective checks FAILED")
                << std::endl;
    }
    return failed == 0 ? 0 : 1;
  });
}
