#include "agent/rendezvous/static_rendezvous.h"

#include <utility>

namespace dlaunch::agent::rendezvous {

StaticRendezvous::StaticRendezvous(std::string master_addr, int master_port,
                                   PortPicker pick_port)
    : master_addr_(std::move(master_addr)),
      master_port_(master_port),
      pick_port_(std::move(pick_port)) {}

std::string reason_name(RoundReason reason) {
  switch (reason) {
    case RoundReason::kStart:
      return "start";
    case RoundReason::kFailure:
      return "failure";
    case RoundReason::kNodeLost:
      return "node lost";
    case RoundReason::kNodeJoined:
      return "node joined";
  }
  return "unknown";
}

RendezvousResult StaticRendezvous::next_round(
    int local_world_size, RoundReason reason,
    std::chrono::milliseconds /*timeout*/) {
  RendezvousResult r;
  if (reason == RoundReason::kFailure && round_ > 0) ++restart_count_;
  r.restart_count = restart_count_;
  r.reason = reason;
  r.members = {master_addr_};
  r.round = round_++;
  r.group_rank = 0;
  r.group_world_size = 1;
  r.world_size = local_world_size;
  r.master_addr = master_addr_;
  r.master_port = master_port_ != 0 ? master_port_ : pick_port_(master_addr_);
  return r;
}

void StaticRendezvous::watch(EventCallback on_event) {
  on_event_ = std::move(on_event);
}

void StaticRendezvous::report(NodeOutcome outcome) {
  // Alone, this node's success is the job's; nothing else can end a round.
  if (outcome != NodeOutcome::kSucceeded || !on_event_) return;
  auto cb = std::move(on_event_);
  on_event_ = nullptr;
  cb(RoundEvent{RoundEvent::Kind::kSucceeded, round_ - 1, ""});
}

}  // namespace dlaunch::agent::rendezvous
