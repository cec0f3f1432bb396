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

// A drill over several hosts: the head puts kDrillKeyEnv=KEY in every
// agent's environment; each agent, once its job ended, leaves its part of
// the verdict in the head's store under KEY/HOST, and the head merges the
// parts into one table (a rank's fault fires on the host that runs it).
inline constexpr char kDrillKeyEnv[] = "DLAUNCH_DRILL_KEY";

// One agent's part: its group starts (the first one's time) and its
// faults, as JSON text.
std::string encode_drill_part(const agent::RunResult& result);

// Adds a part (encode_drill_part) to `merged`: its faults, its first start
// when earlier, its group starts when more. Throws std::runtime_error for
// text that is not a part.
void merge_drill_part(const std::string& part, agent::RunResult& merged);

}  // namespace dlaunch::launcher
