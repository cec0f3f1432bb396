#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

namespace dlaunch::agent::rendezvous {

// The outcome of one rendezvous round: who this node is in the group and
// where rank 0 serves the workers' store.
struct RendezvousResult {
  int round = 0;             // 0 for the first round, +1 for each new one
  int group_rank = 0;        // this node's rank (GROUP_RANK)
  int group_world_size = 1;  // nodes in the round (GROUP_WORLD_SIZE)
  // Workers in the whole job; homogeneous nodes: group_world_size * local.
  int world_size = 1;
  std::string master_addr;  // MASTER_ADDR
  int master_port = 0;      // MASTER_PORT, free for rank 0 to bind
};

// A round could not complete: the message says who was waited for, the
// timeout and how many nodes joined ("1/2 nodes joined after 30 s").
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How agents agree on group membership before each start or restart of
// their workers. Implementations: static single node (static_rendezvous.h);
// later c10d over the TCP store, static multi-node and etcd. One agent
// thread calls it; next_round() blocks for at most `timeout`.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Joins the next round with `local_world_size` workers on this node.
  // Throws RendezvousError.
  virtual RendezvousResult next_round(int local_world_size,
                                      std::chrono::milliseconds timeout) = 0;
};

}  // namespace dlaunch::agent::rendezvous
