#pragma once

// The progress record a worker shares with its agent for hang detection
// (--hang-timeout): a small file (DLAUNCH_PROGRESS_FILE) that both map.
// comm bumps two counters around every operation of a group made by
// init_process_group (no message, no system call); the agent reads them on
// a timer. Header-only: the agent reads it without linking comm.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dlaunch::comm {

// The operations a record names; the values are the wire form.
enum class ProgressOp : uint32_t {
  kNone = 0,
  kSend,
  kRecv,
  kBroadcast,
  kReduce,
  kAllReduce,
  kScatter,
  kGather,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kWait,  // Work::wait of an asynchronous operation
  kNewGroup,
};

// "all_reduce" (torch's names); "unknown" for other values.
inline std::string_view progress_op_name(uint32_t op) {
  constexpr std::string_view kNames[] = {
      "none",       "send",    "recv",   "broadcast",  "reduce",
      "all_reduce", "scatter", "gather", "all_gather", "reduce_scatter",
      "all_to_all", "barrier", "wait",   "new_group"};
  return op < std::size(kNames) ? kNames[op] : "unknown";
}

// The record at offset 0 of the file. A worker is inside an operation
// while entered != left.
struct ProgressRecord {
  std::atomic<uint64_t> entered;  // operations started
  std::atomic<uint64_t> left;     // operations finished or failed
  std::atomic<uint32_t> op;       // ProgressOp of the last one started
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the record is shared between processes");

// The file's size (one page keeps it apart from anything else).
inline constexpr size_t kProgressFileSize = 4096;

}  // namespace dlaunch::comm
