#pragma once

#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "agent/worker_env.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// The user asked for --help.
struct HelpRequested {};

// The user asked for --version.
struct VersionRequested {};

// A bad flag or value: one line naming it and the valid forms. The command
// exits with `exit_code` (2 for bad usage, 127 for a missing program).
struct UsageError {
  std::string message;
  int exit_code = 2;
};

using ParseResult =
    std::variant<LaunchOptions, HelpRequested, VersionRequested, UsageError>;

// Receives notes for stderr, each a whole line ending in a newline (a PET_*
// variable overriding a job file key).
using NoteSink = std::function<void(const std::string&)>;

// Parses `dlaunch [options] PROG [ARGS...]` (torchrun's flags, both
// --dash-names and --under_score names) and the --config job file; each
// setting comes from the command line, else its PET_<KEY> variable in
// `env`, else the file. Resolves --nproc-per-node cpu/gpu/auto and builds
// the worker command (python -u for .py programs and -m modules).
ParseResult parse_command_line(const std::vector<std::string>& args,
                               const agent::EnvMap& env,
                               const NoteSink& note = {});

// The man-page style text of `dlaunch --help`, its options read from the
// flag table (flags.h).
const std::string& help_text();

// Whether the program is a script file the interpreter runs (a path even
// without a '/': train.py), not an executable or a --module name.
bool runs_a_script(const LaunchOptions& options);

// Why the .py program of `options` cannot run on this machine (not found
// in --chdir's folder, or unreadable), or "" (not a .py, found, or a
// --chdir that does not exist, which is refused as such).
std::string missing_script(const LaunchOptions& options);

// Visible CUDA devices (CUDA_VISIBLE_DEVICES honoured); 0 when there is no
// driver or no device; any other driver error throws, naming it. Asks the
// dlaunch-cuda-devices helper beside the running program, or at env's
// DLAUNCH_CUDA_DEVICES, which loads libcuda (dlaunch is static and does not
// link CUDA). Throws std::runtime_error naming the helper when it is missing,
// fails or hangs (60 s).
int cuda_device_count(const agent::EnvMap& env);

}  // namespace dlaunch::launcher
