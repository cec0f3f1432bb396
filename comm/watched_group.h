#pragma once

#include <memory>

#include "comm/process_group.h"

namespace dlaunch::comm {

// What a worker's environment asks of every group it makes: progress
// records for its agent's hang detection (DLAUNCH_PROGRESS_FILE, see
// comm/progress.h) and injected faults (DLAUNCH_COMM_FAULTS: fail, exit,
// kill or stall at the N-th call of an operation). Shared by a world group
// and the groups made from it; thread-safe.
class WatchState;

// Reads the environment once per process: nullptr when neither variable
// is set, so unwatched groups cost nothing. `rank` is the world rank the
// faults' rank= is matched against, `size` the world's size. Throws
// CommError naming a bad spec or one whose rank is not in the world.
std::shared_ptr<WatchState> watch_state_from_env(int rank, int size);

// `inner` with every operation recorded and checked against the faults of
// `state` (a decorator: the backend is unchanged).
std::unique_ptr<ProcessGroup> watch_group(std::unique_ptr<ProcessGroup> inner,
                                          std::shared_ptr<WatchState> state);

}  // namespace dlaunch::comm
