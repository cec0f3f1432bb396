#include "workloads/worker.h"

#include <cstdlib>
#include <iostream>
#include <stdexcept>

#include "comm/cli_checks.h"
#include "comm/init.h"

namespace dlaunch::workloads {

bool launched_distributed() { return std::getenv("WORLD_SIZE") != nullptr; }

std::unique_ptr<comm::ProcessGroup> init_world(std::string_view backend,
                                               std::string_view prog) {
  if (backend != "gloo" && backend != "nccl") {
    throw std::invalid_argument("--backend: unknown backend '" +
                                std::string(backend) + "'; valid: gloo, nccl");
  }
  try {
    return comm::init_process_group(backend);
  } catch (const comm::CommError& e) {
    if (!launched_distributed()) {
      throw comm::CommError(
          std::string(e.what()) + "; " + std::string(prog) +
          " is a distributed worker: start it under the launcher, e.g. "
          "build/bin/dlaunch --nproc-per-node 2 build/bin/" +
          std::string(prog));
    }
    throw;
  }
}

int run_main(CLI::App& app, int argc, char** argv,
             const std::function<int()>& body) {
  if (auto status = comm::parse_or_exit(app, argc, argv)) return *status;
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace dlaunch::workloads
