#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/rendezvous/etcd/client.h"
#include "agent/rendezvous/member.h"
#include "agent/rendezvous/rendezvous.h"

namespace dlaunch::agent::rendezvous::etcd {

// The c10d backend's rounds (docs/rendezvous.md) on etcd v3, which
// outlives any node: every key lives under /dlaunch/RUN_ID/ and is bound
// to the lease of the agent that wrote it, which a keep-alive thread
// renews; a dead or cut-off agent's lease expires and its keys vanish,
// which the others see through watches. Rounds close in a transaction.
// Threads: the helper's thread calls the methods; a watcher thread waits
// for the round's end, a keep-alive thread renews the lease.
class EtcdRendezvous : public Rendezvous {
 public:
  // The node and its job (run_id: keys live under /dlaunch/RUN_ID/), and
  // how to reach etcd.
  struct Params : NodeParams {
    ClientOptions client;
    // Test-only: runs after this node's "done" completed the round's set
    // and before it puts "end" (a test kills the node there). Default none.
    std::function<void()> before_end;
    // When above zero: the lease is renewed only while the agent was heard
    // (agent_alive()) within this, so a frozen agent (SIGSTOP) is dropped
    // at its TTL as a dead one is; the helper process renews it otherwise.
    std::chrono::milliseconds agent_silence{0};
  };

  // Grants this agent's lease (TTL keep_alive_interval x
  // keep_alive_max_attempt, rounded up to seconds), retrying until
  // join_timeout, and starts renewing it. Throws RendezvousError naming
  // every endpoint tried.
  explicit EtcdRendezvous(Params params);
  // Stops the threads and revokes the lease: this agent's keys vanish.
  ~EtcdRendezvous() override;

  RendezvousResult next_round(int local_world_size, RoundReason reason,
                              std::chrono::milliseconds timeout) override;
  void watch(EventCallback on_event) override;
  void report(NodeOutcome outcome) override;
  // Stops renewing the lease for `d` (the cut fault): past its TTL etcd
  // drops this node's keys, the others go on without it, and this node
  // sees its own loss (kFatal). Any thread.
  bool cut_off(std::chrono::milliseconds d) override;
  // The members without a "done" key in round_ and not gone after one;
  // empty when etcd cannot be read.
  std::vector<std::string> unfinished_nodes() override;
  bool may_wait() const override { return true; }
  void interrupt() override {}

  // The agent is alive (its ping arrived). Any thread.
  void agent_alive();

  // Revokes the lease now, from any thread (the agent is gone).
  void abandon(std::chrono::milliseconds timeout);
  // "127.0.0.1:2379, ...": the members, for messages.
  std::string endpoints_text() const { return client_->endpoints_text(); }

 private:
  struct RoundState;
  class ActiveWatch;
  std::string round_prefix(int round) const;
  // Whether a node of round `r - 1` that has not left lives (its leased
  // record is there) and has not joined round `r` yet: a re-formed round
  // waits for it past the last call.
  bool last_round_pending(int r) const;
  // Round `round`'s joiners (their records, or just their number).
  etcdserverpb::RangeRequest joiners(int round, bool count_only) const;
  // The number of round `round`'s "done" keys (at `revision`; 0: now).
  etcdserverpb::RangeRequest done_count(int round, int64_t revision = 0) const;
  // Puts this node's record `me` into round `round` and reads, in the same
  // transaction, who joined and whether it closed (into st). With
  // `guess`, only when no later round exists. Returns the round joined or
  // a later one to join instead (nothing put); throws RendezvousClosed
  // once the job finished, RendezvousError once it gave up.
  int join(int round, const MemberRecord& me, bool guess, RoundState& st);
  // The job's end marks, "finished" and "gave_up" (keys only).
  etcdserverpb::RangeRequest end_marks() const;
  // For a key of end_marks(): true for "finished"; throws RendezvousError
  // for "gave_up"; false for any other key.
  bool over(const std::string& key) const;
  // The put of the end mark `key`, under its own lease of close_timeout
  // (granted here).
  etcdserverpb::PutRequest job_mark(const std::string& key);
  // Ends the exit barrier of round `round`: puts its "end", which the
  // members watch (wait_round_end), and marks the job finished for nodes
  // that come late; nothing when another node put "end" already.
  void put_end(int round);
  // Closes round r with its first max_nodes joiners when at least `need`
  // are there, unless another node closed it (st then holds its
  // records); st.joined says how many were there.
  void try_close(int round, int need, RoundState& st);
  // What ends round_ (the watcher thread's work).
  RoundEvent wait_round_end();
  // Waits (bounded) until a round after r opens or the job finished;
  // returns false for finished.
  bool wait_next_round(int round,
                       std::chrono::steady_clock::time_point deadline);
  void keep_alive_loop();
  void stop_watcher();
  // Points watch_ at [key, range_end) from revision `from` (0: now),
  // making it at the first use or after it failed.
  Watch& watch_on(const std::string& key, const std::string& range_end,
                  int64_t from);
  void set_active(Watch* w);
  // Throws RendezvousError once the lease is lost.
  void check_lease() const;
  // The kFatal event of a node whose lease expired.
  RoundEvent self_lost() const;

  Params p_;
  std::string prefix_;   // /dlaunch/RUN_ID/
  std::string node_id_;  // unique per agent: address and pid
  std::unique_ptr<Client> client_;
  // The one watch stream that a forming round, a node waiting for the
  // next round and the round's end take in turns (Watch::rewatch), used
  // by one thread at a time: next_round() runs only once the watcher
  // thread stopped. Destroyed before client_.
  std::unique_ptr<Watch> watch_;
  int64_t lease_ = 0;
  std::chrono::seconds ttl_{0};  // as granted
  // When the granted request went out (not the first of its retries, which
  // may be join_timeout earlier): etcd expires it ttl_ after, or later.
  std::chrono::steady_clock::time_point asked_;

  // State of the round this node was last in (agent thread).
  int round_ = -1;
  int group_rank_ = -1;
  int restart_count_ = 0;
  std::vector<std::string> members_;  // ids, in join order
  // round_'s members' ids and addresses in group-rank order, for naming
  // whom the exit barrier waits for.
  std::vector<std::string> ranked_ids_;
  std::vector<std::string> member_addrs_;
  int64_t watch_from_ = 0;  // round_'s watch: the revision after its read
  bool reported_ = false;
  // This node put its "done" in round_ (read by the watcher thread).
  std::atomic<bool> done_reported_{false};
  // The revisions at which members of round_ went after their "done"
  // (their keys vanished with their leases): counted with the "done" keys
  // of a later revision to end the exit barrier (watcher adds, report()
  // reads).
  std::vector<int64_t> gone_done_;
  std::set<std::string> gone_done_ids_;  // their ids
  std::mutex gone_mu_;
  // The members gone after their "done" before `revision`.
  int64_t gone_before(int64_t revision);

  std::thread watcher_thread_;
  std::thread alive_thread_;
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  bool stopping_ = false;
  bool watcher_stop_ = false;
  Watch* active_ = nullptr;  // the watch a lease loss must wake
  std::chrono::steady_clock::time_point silent_until_{};  // cut_off()
  std::atomic<bool> lease_lost_{false};
  // When the agent was last heard (agent_alive()), steady clock.
  std::atomic<std::chrono::steady_clock::rep> agent_heard_{
      std::chrono::steady_clock::now().time_since_epoch().count()};
};

}  // namespace dlaunch::agent::rendezvous::etcd
