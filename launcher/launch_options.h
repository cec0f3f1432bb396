#pragma once

#include <string>
#include <vector>

#include "agent/options.h"

namespace dlaunch::launcher {

// Everything `dlaunch` was asked to do, with documented defaults: the
// command line (cli.h) fills it, and a YAML job config will fill the same
// struct. The agent's part is `agent`; the rest is about where and how the
// agent runs. Plain data.
struct LaunchOptions {
  // The node agent's options (workers, restarts, logs, signals).
  agent::AgentOptions agent;
  // Nodes in the job. Default 1; only 1 is supported so far.
  int nnodes = 1;
  // This node's rank among them. Default 0.
  int node_rank = 0;
  // Rendezvous backend: "static" or "c10d". Default "static" (one node).
  std::string rdzv_backend = "static";
  // host:port of the rendezvous store; empty (default) on one node.
  std::string rdzv_endpoint;
  // Host an embedded TCP store on a free port for rendezvous (torchrun's
  // --standalone). Default: on exactly when nnodes is 1 and no endpoint
  // was given.
  bool standalone = false;
  // Accepted for torchrun compatibility (dlaunch detects exits through
  // events, not polling). Default 0.1 s.
  double monitor_interval_s = 0.1;
  // The program as given (before python wrapping) and its arguments.
  std::string program;
  std::vector<std::string> program_args;
  // Run `program` as a module: PYTHON -u -m PROGRAM. Default false.
  bool module = false;
  // Execute `program` directly even when it ends in .py. Default false.
  bool no_python = false;
  // Interpreter for .py programs and modules. Default: --python, else
  // $PYTHON, else "python3".
  std::string python = "python3";
};

}  // namespace dlaunch::launcher
