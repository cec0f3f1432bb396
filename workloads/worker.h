#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "comm/process_group.h"

namespace dlaunch::workloads {

// The world group of a workload started by dlaunch (or torchrun): rank and
// size from the environment contract (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). `backend` must be "gloo" or "nccl"; anything else throws
// std::invalid_argument naming --backend. A missing variable throws
// comm::CommError with a hint to start `prog` under dlaunch.
std::unique_ptr<comm::ProcessGroup> init_world(std::string_view backend,
                                               std::string_view prog);

// True when the environment names a distributed job (WORLD_SIZE is set).
bool launched_distributed();

// Runs a workload's main: parses `app` from argv (CLI11 errors and --help
// exit as CLI11 prescribes, bad values with status 2), then `body`. An
// exception escaping `body` is printed as "PROG: error: WHAT" and gives
// status 1 (std::invalid_argument, a bad flag value: status 2).
int run_main(CLI::App& app, int argc, char** argv,
             const std::function<int()>& body);

}  // namespace dlaunch::workloads
