#pragma once

// The operations of a ProcessGroup, numbered once for every place that
// names one: the progress record a worker shares with its agent
// (progress.h), the argument check the gloo and nccl backends exchange
// before a collective, and DLAUNCH_COMM_FAULTS' op= key. Header-only: the
// agent names operations without linking comm.

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

namespace dlaunch::comm {

// The values are the wire form (progress files, the argument checks):
// append new operations, never renumber.
enum class Op : uint32_t {
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

namespace op_detail {
// Indexed by Op's value: torch's names.
inline constexpr std::string_view kNames[] = {
    "none",       "send",    "recv",   "broadcast",  "reduce",
    "all_reduce", "scatter", "gather", "all_gather", "reduce_scatter",
    "all_to_all", "barrier", "wait",   "new_group"};
}  // namespace op_detail

// How many values Op has (kNone included): a table indexed by Op has this
// size.
inline constexpr size_t kNumOps = static_cast<size_t>(Op::kNewGroup) + 1;
static_assert(std::size(op_detail::kNames) == kNumOps, "one name per Op");

// "all_reduce" (torch's names); "unknown" for a value no Op has (one read
// from a file or a peer).
constexpr std::string_view op_name(uint32_t op) {
  return op < std::size(op_detail::kNames) ? op_detail::kNames[op] : "unknown";
}
constexpr std::string_view op_name(Op op) {
  return op_name(static_cast<uint32_t>(op));
}

// The operation `name` calls (never kNone); nullopt for any other text.
constexpr std::optional<Op> op_from_name(std::string_view name) {
  for (uint32_t i = 1; i < std::size(op_detail::kNames); ++i) {
    if (op_detail::kNames[i] == name) return static_cast<Op>(i);
  }
  return std::nullopt;
}

}  // namespace dlaunch::comm
