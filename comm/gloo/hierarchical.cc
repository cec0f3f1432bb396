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
    if (auto g = new_group(members)) local_ = std::move(g);
  }
  leaders_ = new_group(leaders);
  return true;
}

// Reduce to each host's leader, all-reduce among the leaders, broadcast
// from each leader: every rank ends with the leaders' result, bitwise
// alike. An average sums and divides once at the end.
bool GlooProcessGroup::hier_all_reduce(Tensor t, ReduceOp rop) {
  if (g_->all_local || !ensure_hierarchy()) return false;
  const ReduceOp op = rop == ReduceOp::kAvg ? ReduceOp::kSum : rop;
  local_->reduce(t, 0, op);
  if (leaders_) leaders_->all_reduce(t, op);
  local_->broadcast(t, 0);
  if (rop == ReduceOp::kAvg) divide_in_place(t, size());
  took("hierarchical");
  return true;
}

}  // namespace dlaunch::comm::gloo
