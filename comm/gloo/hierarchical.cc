// Hierarchical collectives for groups that span hosts: within each host
// over shared memory, among one leader per host (the host's lowest rank)
// over Gloo's TCP pairs, then back within the host. The hosts come from
// the ranks' host identities exchanged at set-up, never from
// LOCAL_WORLD_SIZE.

#include <algorithm>
#include <string>
#include <vector>

#include "comm/gloo/gloo_group.h"
#include "comm/reduce.h"

namespace dlaunch::comm::gloo {

// Creates the per-host groups and the leaders' group on first use; false
// (on every rank alike: every rank holds every rank's host) when no host
// holds two ranks, where the flat paths are as good. Every rank calls
// new_group once per host and once for the leaders, in the same order.
bool GlooProcessGroup::ensure_hierarchy() {
  if (hier_tried_) return local_ != nullptr;
  hier_tried_ = true;
  const auto& hosts = g_->hosts;
  std::vector<std::string> order;  // hosts by their lowest rank
  for (const auto& h : hosts) {
    if (std::find(order.begin(), order.end(), h) == order.end()) {
      order.push_back(h);
    }
  }
  if (order.size() < 2 || order.size() == hosts.size()) return false;
  std::vector<int> leaders;
  for (const auto& h : order) {
    std::vector<int> members;
    for (int j = 0; j < size(); ++j) {
      if (hosts[j] == h) members.push_back(j);
    }
    leaders.push_back(members.front());
    if (auto g = new_group(members)) {
      local_ = std::move(g);
      local_ranks_ = members;
    }
  }
  leaders_ = new_group(leaders);
  if (leaders_) leader_ranks_ = leaders;
  return true;
}

// Reduce to each host's leader, all-reduce among the leaders, broadcast
// from each leader: every rank ends with the leaders' result, bitwise
// alike. An average sums and divides once at the end.
//
// A phase that fails (a rank died, a peer left, a timeout) fails this
// group, in its own ranks: the sub-groups close first, so that ranks
// waiting in another phase (a host's members in the broadcast while
// their leader failed among the leaders) fail at once rather than at the
// timeout, and each names the lost world rank, not a sub-group's.
bool GlooProcessGroup::hier_all_reduce(Tensor t, ReduceOp rop) {
  if (g_->all_local || !ensure_hierarchy()) return false;
  const ReduceOp op = rop == ReduceOp::kAvg ? ReduceOp::kSum : rop;
  // The phase's group and its members' world ranks.
  const GlooProcessGroup* phase = nullptr;
  const std::vector<int>* members = &local_ranks_;
  try {
    phase = dynamic_cast<const GlooProcessGroup*>(local_.get());
    local_->reduce(t, 0, op);
    if (leaders_) {
      phase = dynamic_cast<const GlooProcessGroup*>(leaders_.get());
      members = &leader_ranks_;
      leaders_->all_reduce(t, op);
    }
    phase = dynamic_cast<const GlooProcessGroup*>(local_.get());
    members = &local_ranks_;
    local_->broadcast(t, 0);
  } catch (const CommError& e) {
    const bool timed_out = dynamic_cast<const CommTimeoutError*>(&e);
    const std::string what = e.what();
    // A timed-out phase's late ranks, as world ranks (it once said "none
    // reported a failure" here, naming them only in the phase's ranks). A
    // rank that left is not passed on: the world group names the lost one
    // (the rank that left may have left because of it).
    std::vector<int> missing;
    if (phase != nullptr) {
      for (int r : phase->failed_missing_) {
        if (r >= 0 && static_cast<size_t>(r) < members->size()) {
          missing.push_back((*members)[static_cast<size_t>(r)]);
        }
      }
    }
    leaders_.reset();
    local_.reset();
    fail("all_reduce", what, missing, {}, timed_out);
  }
  if (rop == ReduceOp::kAvg) divide_in_place(t, size());
  took("hierarchical");
  return true;
}

}  // namespace dlaunch::comm::gloo
