#pragma once

#include "agent/run_record.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// Runs the job described by `options` on this node: the agent in-process
// over the real OS (PosixEnv), single-node static rendezvous. Returns the
// process exit code (see `dlaunch --help`, EXIT STATUS). When `result` is
// given, it receives the agent's record of the run (the drill reads it).
int launch(const LaunchOptions& options, agent::RunResult* result = nullptr);

// Called before dlaunch hosts a store: the store logs through spdlog, whose
// default logger writes to stdout; its warnings go to stderr with
// dlaunch's own, so that stdout carries only the workers' output (dl-store
// does the same). Once per process, on first use: a launch that hosts no
// store never sets up a logger. Thread-safe.
void store_logs_to_stderr();

// The whole `dlaunch` command: parse, print help or a usage error, launch.
int main(int argc, char** argv);

}  // namespace dlaunch::launcher
