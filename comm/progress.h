#pragma once

// The progress record a worker shares with its agent for hang detection
// (--hang-timeout) and for naming the comm faults that fired
// (DLAUNCH_COMM_FAULTS): a small file (DLAUNCH_PROGRESS_FILE) that both map.
// comm bumps two counters around every operation of a group made by
// init_process_group (no message, no system call); the agent reads them on
// a timer. Header-only: the agent reads it without linking comm.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "comm/op.h"

namespace dlaunch::comm {

// The file's size (one page keeps it apart from anything else).
inline constexpr size_t kProgressFileSize = 4096;
// Room for each text of a fired fault, its NUL included.
inline constexpr size_t kProgressFaultBytes = 512;

// The record at offset 0 of the file. A worker is inside an operation
// while entered != left.
struct ProgressRecord {
  std::atomic<uint64_t> entered;  // operations started
  std::atomic<uint64_t> left;     // operations finished or failed
  std::atomic<uint32_t> op;       // Op of the last one started
  // The last DLAUNCH_COMM_FAULTS fault that fired in this worker, so its
  // agent can say the failure was injected: when (system_clock ns since
  // the epoch; 0: none yet), its spec and what it did ("raising SIGKILL"),
  // NUL-terminated, cut to fit. The worker stores the time last (release);
  // a reader that loads a non-zero time (acquire) sees both texts whole.
  std::atomic<int64_t> fault_time_ns;
  char fault_spec[kProgressFaultBytes];
  char fault_action[kProgressFaultBytes];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the record is shared between processes");
static_assert(sizeof(ProgressRecord) <= kProgressFileSize);

}  // namespace dlaunch::comm
