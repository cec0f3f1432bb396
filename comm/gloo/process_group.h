#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/store/store.h"

namespace dlaunch::comm::gloo {

struct GroupOptions {
  // Rendezvous store; every group derived from this one shares it. Required.
  std::shared_ptr<store::Store> store;
  // True when `store` may be used from several threads at once (HashStore,
  // FileStore). Default false: calls are serialised.
  bool store_thread_safe = false;
  // Opens another connection to the store, so that groups created from
  // different threads at once each block on their own (TcpStore::clone).
  // Default empty.
  std::function<std::shared_ptr<store::Store>()> store_clone;
  // This process's rank in [0, size). Required.
  int rank = -1;
  // Number of ranks. Required.
  int size = -1;
  // Bound on every blocking call of the group and its sub-groups (unless
  // new_group is given another). Default 30 minutes.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Group name, also the store key prefix. Default "world".
  std::string name = "world";
  // Address Gloo's TCP pairs listen on: a hostname or IP peers can reach.
  // Default "127.0.0.1" (single host); init_process_group picks one from
  // MASTER_ADDR / GLOO_SOCKET_IFNAME.
  std::string hostname = "127.0.0.1";
  // Network interface to listen on instead of `hostname` (GLOO_SOCKET_IFNAME).
  // Default empty: use `hostname`.
  std::string iface;
  // Kept alive while this group or any group derived from it exists (the
  // store server rank 0 hosts for env:// and tcp://). Default none.
  std::shared_ptr<void> owned;
};

// Creates a Gloo (CPU, TCP) group: connects a full mesh of TCP pairs through
// the store. Blocks until every rank joined, at most options.timeout; throws
// CommError (CommTimeoutError on timeout) naming the group and what was
// missing.
std::unique_ptr<ProcessGroup> create_process_group(const GroupOptions& options);

// The path the last operation of `group` (a gloo group) took, for tests and
// dl-bench: "shm-check" (the data travelled with the argument check in the
// shared-memory channel), "shm-chunks" (pipelined shared-memory segments),
// "hierarchical" (within hosts, then among one leader per host), "tcp"
// (Gloo's pairs), "local" (nothing moved between ranks), "none" (no
// operation yet). Empty for a group of another backend.
std::string last_path(const ProcessGroup& group);

// The ranks whose connection `group` (a gloo group) has seen fail (they
// failed, exited or destroyed the group), in order, for tests. Empty for a
// group of another backend.
std::vector<int> lost_peers(const ProcessGroup& group);

}  // namespace dlaunch::comm::gloo
