#pragma once

#include "agent/run_record.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// Runs the job described by `options` on this node: the agent in-process
// over the real OS (PosixEnv), single-node static rendezvous. Returns the
// process exit code (see `dlaunch --help`, EXIT STATUS). When `result` is
// given, it receives the agent's record of the run (the drill reads it).
int launch(const LaunchOptions& options, agent::RunResult* result = nullptr);

// The whole `dlaunch` command: parse, print help or a usage error, launch.
int main(int argc, char** argv);

}  // namespace dlaunch::launcher
