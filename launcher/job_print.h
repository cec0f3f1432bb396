#pragma once

#include <string>

#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// The effective job as a YAML job file: every key with its value
// (absolute paths, secrets as `${NAME}`). `with_run_id` false leaves out
// rdzv_id (job.yaml, so a rerun gets a fresh log folder).
std::string job_yaml(const LaunchOptions& options, bool with_run_id);

// The --dry-run plan: what the job runs where, each worker's environment
// (the part dlaunch sets) and command line; what only a rendezvous or
// other hosts decide is shown as such. Throws std::runtime_error where the
// run would stop first (an unreadable or bad --env-file; LookupTimeout).
std::string dry_run_plan(const LaunchOptions& options);

}  // namespace dlaunch::launcher
