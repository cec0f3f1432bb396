#pragma once

#include <string>

#include "agent/run_record.h"

namespace dlaunch::launcher {

// The verdict of `dlaunch --drill`: one row per fault of the job (when it
// fired after the job started, the time from firing to the failure being
// detected and to the group running again), a row for each comm fault
// (DLAUNCH_COMM_FAULTS) that fired, then the job's result. Faults that never
// fired are listed as such. `passed` is set to whether every
// fault fired, every detectable one was detected and the job exited 0.
std::string drill_verdict(const agent::RunResult& result,
                          const std::vector<std::string>& specs, bool& passed);

}  // namespace dlaunch::launcher
