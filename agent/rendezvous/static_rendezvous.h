#pragma once

#include <functional>
#include <string>

#include "agent/rendezvous/rendezvous.h"

namespace dlaunch::agent::rendezvous {

// The trivial single-node rendezvous: this node is group rank 0 of 1 in
// every round, and its own kSucceeded ends the round at once. MASTER_PORT
// is the fixed port when one was given, otherwise a fresh free port from
// `pick_port` each round (torchrun picks a new one on every restart too).
// Not thread-safe; owned by the agent.
class StaticRendezvous : public Rendezvous {
 public:
  using PortPicker = std::function<int(const std::string& host)>;

  StaticRendezvous(std::string master_addr, int master_port,
                   PortPicker pick_port);

  RendezvousResult next_round(int local_world_size, RoundReason reason,
                              std::chrono::milliseconds timeout) override;
  void watch(EventCallback on_event) override;
  void report(NodeOutcome outcome) override;
  std::vector<std::string> unfinished_nodes() override { return {}; }
  // Never waits: there is nobody to wait for.
  bool may_wait() const override { return false; }
  void interrupt() override {}

 private:
  EventCallback on_event_;
  int restart_count_ = 0;
  std::string master_addr_;
  int master_port_;
  PortPicker pick_port_;
  int round_ = 0;
};

}  // namespace dlaunch::agent::rendezvous
