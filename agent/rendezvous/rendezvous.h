#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dlaunch::agent::rendezvous {

// How this node meets the others, with torchrun's defaults. The command
// line (launcher/cli.h) fills it from --nnodes, --rdzv-* and friends; a YAML
// job config fills the same struct. Plain data.
struct RendezvousOptions {
  // "static" (fixed nodes, --node-rank), "c10d" (elastic, over the TCP
  // store) or "etcd" (elastic, over etcd). Default "static".
  std::string backend = "static";
  // Nodes in a round: at least min_nodes, at most max_nodes (--nnodes N or
  // MIN:MAX). Default 1:1.
  int min_nodes = 1;
  int max_nodes = 1;
  // The agents' store (--rdzv-endpoint HOST[:PORT]). Empty host (default):
  // one node, no store needed. Port default 29400; 0 means a free port,
  // possible only for one node that hosts the store.
  std::string endpoint_host;
  int endpoint_port = 29400;
  // --rdzv-endpoint as given, one entry per comma-separated item (the etcd
  // backend takes several members). Empty (default): none given.
  std::vector<std::string> endpoints;
  // The etcd backend's members as HOST:PORT (port 2379 unless given),
  // from `endpoints`; filled by the command line's checks.
  std::vector<std::string> etcd_endpoints;
  // The etcd backend's TLS and login (--rdzv-conf cacert=, cert=, key=,
  // user=, password_file=): PEM file paths, an etcd user and the file
  // holding its password. Empty (default): plain TCP, no login.
  std::string cacert;
  std::string cert;
  std::string key;
  std::string user;
  std::string password_file;
  // Whether this agent hosts the store (torchrun's is_host). Unset
  // (default): it does when the endpoint's host is one of this machine's
  // names or addresses (or --local-addr).
  std::optional<bool> is_host;
  // This node's group rank with the static backend (--node-rank); -1 when
  // not given (default).
  int node_rank = -1;
  // The address other nodes reach this one at (--local-addr); empty
  // (default): the host name.
  std::string local_addr;
  // A round must form within this long (join_timeout). Default 600 s.
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  // Once min_nodes joined, how long more may join (last_call_timeout).
  // Default 30 s.
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  // How long closing the rendezvous at the end may take (close_timeout).
  // Default 30 s.
  std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
  // An agent silent for keep_alive_interval * keep_alive_max_attempt has
  // left. Defaults 5 s and 3.
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
  // Bound on one store request (read_timeout, or torchrun's `timeout`).
  // Default 60 s.
  std::chrono::milliseconds read_timeout{std::chrono::seconds(60)};
  // A 0600 file holding the job's store token (--rdzv-conf token_file=);
  // read when the job starts. Empty (default): $DLAUNCH_RDZV_TOKEN, else
  // no token (launcher/job_token.h).
  std::string token_file{};
};

// Why a round opened (summary.json lists it for every round).
enum class RoundReason { kStart, kFailure, kNodeLost, kNodeJoined };
// "start", "failure", "node lost", "node joined".
std::string reason_name(RoundReason reason);

// What ended the current round while this node's workers ran or waited in
// the exit barrier.
struct RoundEvent {
  enum class Kind {
    kSucceeded,   // every node's workers succeeded: the job is over
    kFailure,     // a worker failed on another node: restart the group
    kNodeLost,    // a node died, froze or left: new round, no restart spent
    kNodeJoined,  // a new node waits to join: new round, no restart spent
    kFatal,       // the job cannot go on (store host lost, static node lost)
  };
  Kind kind = Kind::kSucceeded;
  int round = 0;       // the round it ended
  std::string detail;  // "node 127.0.0.3 (group rank 2) left", for messages
};

// What this node tells the others at the end of its part of a round.
enum class NodeOutcome {
  kSucceeded,  // its workers all exited 0: it enters the exit barrier
  kFailed,     // a worker failed: every node restarts (or gives up)
  kLeaving,    // stopped by a signal: the others go on without it
  kGaveUp,     // past --max-restarts: every node stops; a node that comes
               // later is told so (c10d) instead of waiting for a place
};

// The outcome of one rendezvous round: who this node is in the group and
// where rank 0 serves the workers' store.
struct RendezvousResult {
  int round = 0;             // 0 for the first round, +1 for each new one
  int group_rank = 0;        // this node's rank (GROUP_RANK)
  int group_world_size = 1;  // nodes in the round (GROUP_WORLD_SIZE)
  // Workers in the whole job: the sum of every node's local world size.
  int world_size = 1;
  // RANK of this node's local rank 0: the local world sizes of the nodes
  // before it in group-rank order.
  int rank_offset = 0;
  std::string master_addr;  // MASTER_ADDR
  int master_port = 0;      // MASTER_PORT, free for rank 0 to bind
  // TORCHELASTIC_RESTART_COUNT: worker-group restarts so far, the same on
  // every node (membership changes spend none). A failure anywhere in the
  // previous round spends one on every node, even on a node that saw only
  // a node loss end it; past --max-restarts every node gives up.
  int restart_count = 0;
  // When this round spent a restart: the failure that spent it ("a worker
  // on node 10.0.0.2/123 failed"), for nodes that did not see it.
  std::string restart_cause;
  RoundReason reason = RoundReason::kStart;
  // Every node's address, in group-rank order.
  std::vector<std::string> members;
};

// A round could not complete: the message says who was waited for, the
// timeout and how many nodes joined ("1/2 nodes joined after 30 s").
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The job this node came to join has already finished: nothing to do
// (the agent exits 0 saying so).
class RendezvousClosed : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// interrupt() ended the wait for a round (the agent got a stop signal).
class RendezvousInterrupted : public RendezvousError {
 public:
  using RendezvousError::RendezvousError;
};

// How agents agree on group membership before each start or restart of
// their workers, and how they learn that a round is over. Implementations:
// one node (static_rendezvous.h); c10d over the TCP store and static
// multi-node (c10d_rendezvous.h); etcd, with c10d's semantics, served by a
// helper program (remote_rendezvous.h, etcd/etcd_rendezvous.h).
// One thread at a time calls the methods (next_round() may run on a helper
// thread of the agent's Env, so that signals are served meanwhile);
// interrupt() may be called from any thread, and watch()'s callback may run
// on another thread.
class Rendezvous {
 public:
  // Called once per watch(), from any thread.
  using EventCallback = std::function<void(const RoundEvent&)>;

  virtual ~Rendezvous() = default;
  // Joins the next round with `local_world_size` workers on this node;
  // `reason` says why this node opens it (a failure it saw adds one
  // restart). Blocks for at most `timeout`; throws RendezvousError.
  virtual RendezvousResult next_round(int local_world_size, RoundReason reason,
                                      std::chrono::milliseconds timeout) = 0;
  // Calls `on_event` once, with what ends the round next_round() returned
  // last: an event from another node, or kSucceeded once every node
  // reported kSucceeded. The agent's event loop stays idle meanwhile.
  virtual void watch(EventCallback on_event) = 0;
  // Tells the other nodes how this node's part of the round ended.
  virtual void report(NodeOutcome outcome) = 0;
  // A drill's network partition (the cut fault): this node sends nothing
  // to the other nodes' meeting place for `d`, so that they may declare it
  // lost. False, doing nothing, when there is no such link (one node).
  virtual bool cut_off(std::chrono::milliseconds d) {
    (void)d;
    return false;
  }
  // The nodes of the current round whose workers have not all succeeded
  // yet, as "ADDRESS (group rank K)": whom the exit barrier waits for.
  // Empty when none or unknown.
  virtual std::vector<std::string> unfinished_nodes() = 0;
  // Whether next_round() may wait for other nodes (the agent then runs it
  // off its event loop, so that signals are served meanwhile).
  virtual bool may_wait() const = 0;
  // Any thread: makes a next_round() in progress throw RendezvousInterrupted
  // within about a second, and every later call; for an agent stopped by a
  // signal while it waits for the others.
  virtual void interrupt() = 0;
};

}  // namespace dlaunch::agent::rendezvous
