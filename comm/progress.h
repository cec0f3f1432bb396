#pragma once

// The progress record a worker shares with its agent for hang detection
// (--hang-timeout): a small file (DLAUNCH_PROGRESS_FILE) that both map.
// comm bumps two counters around every operation of a group made by
// init_process_group (no message, no system call); the agent reads them on
// a timer. Header-only: the agent reads it without linking comm.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "comm/op.h"

namespace dlaunch::comm {

// The record at offset 0 of the file. A worker is inside an operation
// while entered != left.
struct ProgressRecord {
  std::atomic<uint64_t> entered;  // operations started
  std::atomic<uint64_t> left;     // operations finished or failed
  std::atomic<uint32_t> op;       // Op of the last one started
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the record is shared between processes");

// The file's size (one page keeps it apart from anything else).
inline constexpr size_t kProgressFileSize = 4096;

}  // namespace dlaunch::comm
