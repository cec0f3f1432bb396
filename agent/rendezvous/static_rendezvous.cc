#include "agent/rendezvous/static_rendezvous.h"

#include <utility>

namespace dlaunch::agent::rendezvous {

StaticRendezvous::StaticRendezvous(std::string master_addr, int master_port,
                                   PortPicker pick_port)
    : master_addr_(std::move(master_addr)),
      master_port_(master_port),
      pick_port_(std::move(pick_port)) {}

RendezvousResult StaticRendezvous::next_round(
    int local_world_size, std::chrono::milliseconds /*timeout*/) {
  RendezvousResult r;
  r.round = round_++;
  r.group_rank = 0;
  r.group_world_size = 1;
  r.world_size = local_world_size;
  r.master_addr = master_addr_;
  r.master_port = master_port_ != 0 ? master_port_ : pick_port_(master_addr_);
  return r;
}

}  // namespace dlaunch::agent::rendezvous
