#pragma once

#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "agent/rendezvous/rendezvous.h"

namespace dlaunch::agent::rendezvous {

// One node's join record for a round, as the elastic backends (c10d, etcd)
// store it: who the node is, what it brings, and its place in the
// previous round, which keeps group ranks stable. Plain data.
struct MemberRecord {
  std::string id;    // unique per agent: address and pid
  std::string addr;  // --local-addr or the host name
  int nproc = 0;     // its local world size
  int prev_round = -1;
  int prev_rank = -1;
  int restarts = 0;     // the restart count it proposes
  int master_port = 0;  // free for rank 0 to bind, should it be rank 0
  int node_rank = -1;   // --node-rank (static backend)
  int min_nodes = 0;    // its --nnodes, which every node must share
  int max_nodes = 0;
  int seq = 0;  // join order in the round, 1-based; not encoded

  // Ten lines of text.
  std::string encode() const;
  // Throws RendezvousError for text that is not a record.
  static MemberRecord decode(const std::string& text, int seq);
};

// Why `me` and `other` cannot be nodes of one job (their --nnodes differ),
// naming both values and the fix; "" when they can.
std::string nnodes_conflict(const MemberRecord& me, const MemberRecord& other);

// What both elastic backends (c10d, etcd) know of this node and its job;
// each backend's Params adds where its store is. Plain data.
struct NodeParams {
  using PortPicker = std::function<int(const std::string& host)>;
  using MessageSink = std::function<void(const std::string&)>;

  RendezvousOptions options;
  std::string run_id;     // the job: its keys live under a prefix of it
  std::string node_addr;  // this node's address (MASTER_ADDR if rank 0)
  int master_port = 0;    // fixed MASTER_PORT; 0: a free port each round
  PortPicker pick_port;   // a free port on node_addr
  // Progress lines ("waiting for nodes: ..."); must not block (dlaunch
  // queues them for its console).
  MessageSink log;
};

// This node's join record (`id`) for a round, with `nproc` workers, its
// place in the previous round (-1, -1: none) and the restart count it
// proposes; its master port is p.master_port or a fresh free one.
MemberRecord join_record(const NodeParams& p, const std::string& id, int nproc,
                         int prev_round, int prev_rank, int restarts);

// Orders the closed round's members by group rank, in place, and says
// where this node (`self_id`) stands: with `fixed` (the static backend) by
// --node-rank, which must be 0..N-1 once each (else RendezvousError);
// otherwise members of the previous round keep their order and newcomers
// follow in join order. The restart count is the largest proposed.
RendezvousResult form_round(int round, std::vector<MemberRecord>& members,
                            const std::string& self_id, RoundReason reason,
                            bool fixed);

// The pieces of `text` between `sep`s, as the elastic backends' stored
// lists hold them ("a;b;" -> {"a", "b"}: a trailing `sep` adds none).
std::vector<std::string> split_list(const std::string& text, char sep);

// "dlaunch: round 1 (node lost): 2 nodes [a, b], this node is group rank
// 0, 4 workers\n".
std::string round_line(const RendezvousResult& round);

// The members whose ids are not in `done`, as "ADDRESS (group rank K)",
// from the round's ids and addresses in group-rank order: what
// Rendezvous::unfinished_nodes() returns.
std::vector<std::string> unfinished_members(
    const std::vector<std::string>& ids, const std::vector<std::string>& addrs,
    const std::set<std::string>& done);

// The texts both elastic backends show while a round forms.
// "dlaunch: waiting for nodes: 2/3 joined (min 2, max 4)[, last call ends
// in 12 s]\n"; `call_left` < 0: no last call running.
std::string waiting_line(int joined, int target, const RendezvousOptions& o,
                         std::chrono::milliseconds call_left);
// "1/2 nodes joined round 0 of job 'x' at WHERE after 600 s (min 2, max 4;
// joined: a, b[; lost while waiting: c]); start the missing nodes or
// lower --nnodes". `joined` counts `joiners`, not the lost.
std::string too_few_message(int joined, int round, const std::string& run_id,
                            const std::string& where,
                            std::chrono::milliseconds waited,
                            const RendezvousOptions& o,
                            const std::vector<std::string>& joiners,
                            const std::vector<std::string>& lost = {});
// "dlaunch: round 3 is running with 2 nodes; it restarts to take this
// node in\n" (or, at max_nodes, "... waiting for a place").
std::string late_line(int round, int members, int max_nodes);
// Why a node that arrives after the job ended has nothing to join: "the
// job 'x' already finished ..." (RendezvousClosed: it exits 0) and "the
// job 'x' already failed: its nodes used every restart ..." (it fails).
std::string finished_message(const std::string& run_id);
std::string gave_up_message(const std::string& run_id);

}  // namespace dlaunch::agent::rendezvous
