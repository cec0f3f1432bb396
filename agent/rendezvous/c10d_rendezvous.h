#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/rendezvous/member.h"
#include "agent/rendezvous/rendezvous.h"
#include "comm/store/client.h"

namespace dlaunch::agent::rendezvous {

// Rendezvous of several node agents in the agents' TCP store, in rounds
// (torchrun's c10d backend, docs/rendezvous.md). Nodes join a round; it
// closes at max_nodes, after last_call_timeout once min_nodes joined, or
// at once when every survivor of the previous round is back or lost (a
// node lost while the round forms leaves it at once). Group ranks
// are stable: earlier members keep their order. Each agent binds "lost" to
// its store connection (append_on_close, with keep-alive heartbeats), so a
// dead or frozen agent ends the round for the others at once. With
// `fixed_ranks` (the static backend) ranks are --node-rank and any lost
// node ends the job. Threads: the agent's thread calls the methods; a
// watcher thread waits on the round's event key, a keep-alive thread pings.
class C10dRendezvous : public Rendezvous {
 public:
  // The node and its job (run_id: keys live under dlaunch/rdzv/RUN_ID/),
  // and the agents' store.
  struct Params : NodeParams {
    std::string store_host;  // where the agents' store listens
    int store_port = 0;
    std::string token;  // the job's store token; empty: none
    // Why this agent, whose machine the endpoint names, could not serve
    // the store itself (its port taken); "" when it serves it or another
    // machine does. Named when the store cannot be reached.
    std::string host_failure;
  };

  // Connects to the store on the first next_round(), retrying until
  // join_timeout (the hosting agent may start later).
  explicit C10dRendezvous(Params params);
  // Stops the watcher and keep-alive threads and closes the connections
  // (the others see this node as lost unless it reported first).
  ~C10dRendezvous() override;

  RendezvousResult next_round(int local_world_size, RoundReason reason,
                              std::chrono::milliseconds timeout) override;
  void watch(EventCallback on_event) override;
  void report(NodeOutcome outcome) override;
  // Stops the keep-alive pings for `d`: past keep_alive_interval *
  // keep_alive_max_attempt the store closes this node's link and the
  // others see it lost.
  bool cut_off(std::chrono::milliseconds d) override;
  std::vector<std::string> unfinished_nodes() override;
  bool may_wait() const override { return true; }
  void interrupt() override;

 private:
  std::string key(int round, const std::string& name) const;
  // Closes round `r` (compare_set of r/R/closed) when it may close now: its
  // live joiners (those not lost since) reach max_nodes (or `can_join`, no
  // fewer than min_nodes: the hosts a multi-host head has left), or
  // min_nodes when `at_min` (last call over, or every expected node back or
  // lost). Uses
  // `s`, the calling thread's connection. True when it closed it.
  bool try_close(comm::store::TcpStore& s, int r, bool at_min,
                 int can_join = std::numeric_limits<int>::max());
  // On the watcher's connection: waits until every key in `in_keys` (the
  // expected nodes' r/R/in/ID) exists, then try_close(at_min). The agent's
  // thread stops it with stop_watcher().
  void start_closer(int r, std::vector<std::string> in_keys,
                    std::chrono::steady_clock::time_point deadline);
  // The nodes round `prev`'s successor expects: `members` (round `prev`'s
  // node ids; read from the store when empty) less those its event key
  // names lost or left, plus the nodes that asked to join it; never this
  // node. `failed` is set when a worker failed in it.
  std::vector<std::string> expected_after(comm::store::TcpStore& s, int prev,
                                          std::vector<std::string> members,
                                          bool& failed) const;
  // Throws RendezvousError, before this node joins round `r`, when a live
  // joiner there gives another --nnodes, or (static) this node's
  // --node-rank: the job goes on without this node.
  void refuse_misfit(int r, const MemberRecord& me);
  // Round `r`'s node ids, in join order, from its closed key.
  std::vector<std::string> round_members(comm::store::TcpStore& s, int r) const;
  // The nodes round `r`'s event key names lost or left.
  std::set<std::string> lost_in(comm::store::TcpStore& s, int r) const;
  // Round `round`'s events once its key holds one other than a loss of a
  // node outside `members` or of a member that finished (in done_by), those
  // left out; StoreTimeoutError at `deadline` (none: waits on).
  std::string wait_for_members(
      comm::store::TcpStore& s, int round,
      const std::vector<std::string>& members,
      std::optional<std::chrono::steady_clock::time_point> deadline =
          std::nullopt);
  // `members`: the round's node ids; a loss of any other node (a joiner
  // the round closed without, a spare waiting for a place) is not an
  // event of the round. Empty: every loss counts.
  RoundEvent classify(int round, const std::string& text,
                      const std::vector<std::string>& members = {}) const;
  // Opens the three connections and starts the keep-alive thread; throws
  // RendezvousError (RendezvousInterrupted once interrupt() was called).
  void connect();
  void keep_alive_loop();
  void stop_watcher();

  Params p_;
  std::string prefix_;
  std::string node_id_;  // unique per agent: address and pid
  std::unique_ptr<comm::store::TcpStore> store_;    // agent thread
  std::unique_ptr<comm::store::TcpStore> watcher_;  // watcher thread
  std::unique_ptr<comm::store::TcpStore> alive_;    // keep-alive thread

  // State of the rounds this node was in.
  int round_ = -1;                         // last round joined
  int group_rank_ = -1;                    // in round_
  int restart_count_ = 0;                  // of round_
  int members_ = 0;                        // nodes in round_
  std::vector<std::string> member_ids_;    // round_'s nodes, by group rank
  std::string last_event_;                 // round_'s event text, once seen
  bool reported_ = false;                  // report() called for round_
  std::vector<std::string> member_addrs_;  // their addresses, the same

  std::thread watcher_thread_;
  std::atomic<bool> watcher_done_{true};     // its callback has run
  std::atomic<bool> watcher_failed_{false};  // the closer's call failed
  std::thread alive_thread_;
  std::mutex mu_;  // guards stopping_, silent_until_, store_'s creation,
                   // in_round_, watcher_'s replacement and alive_failure_
  // Guards alive_'s requests (the keep-alive's check, the agent thread's
  // registrations): a check waits on the network, which must not hold up
  // interrupt() on mu_.
  std::mutex alive_mu_;
  std::string alive_failure_;  // why the keep-alive gave up; "" while fine
  std::condition_variable cv_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point silent_until_{};  // cut_off()
  bool in_round_ = false;  // next_round() runs: interrupt() breaks store_
  std::atomic<bool> interrupted_{false};
};

}  // namespace dlaunch::agent::rendezvous
