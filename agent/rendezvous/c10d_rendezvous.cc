#include "agent/rendezvous/c10d_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <sstream>

#include "agent/rendezvous/member.h"
#include "comm/store/resolve.h"
#include "comm/store/text.h"

namespace dlaunch::agent::rendezvous {

using comm::store::format_duration;
using comm::store::StoreError;
using comm::store::StoreTimeoutError;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

// How often a node waiting for a round says how it is going.
constexpr milliseconds kProgressEvery(5000);
// A watcher's wait is renewed this often (a job may run for weeks).
constexpr milliseconds kWatchSlice(std::chrono::hours(24));
// How often a round's event key is read again once it holds only losses of
// nodes outside the round.
constexpr milliseconds kOutsiderPoll(100);
// How long a round's closer waits for a counted node's record.
constexpr milliseconds kRecordGrace(1000);

int to_int(const std::string& s, int fallback = -1) {
  int v = fallback;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() ? v : fallback;
}

// The entries of a round's event text: "VERB NODE_ID;" each.
std::vector<std::pair<std::string, std::string>> entries(
    const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& e : split_list(text, ';')) {
    if (e.empty()) continue;
    size_t sp = e.find(' ');
    out.emplace_back(e.substr(0, sp),
                     sp == std::string::npos ? "" : e.substr(sp + 1));
  }
  return out;
}

// A loss of a node outside `members` (which, empty, holds everyone): each
// joiner registers its "lost" before it knows whether the round takes it.
bool outsider_loss(const std::pair<std::string, std::string>& e,
                   const std::vector<std::string>& members) {
  return (e.first == "lost" || e.first == "left") && !members.empty() &&
         std::find(members.begin(), members.end(), e.second) == members.end();
}

// The entries of `text` but outsiders' losses and those of members in
// `done` (finished: their agents leave after the exit barrier, which must
// not end the round of those still running), as event text.
std::string concerning(const std::string& text,
                       const std::vector<std::string>& members,
                       const std::set<std::string>& done) {
  std::string out;
  for (const auto& e : entries(text)) {
    if (outsider_loss(e, members) ||
        ((e.first == "lost" || e.first == "left") && done.contains(e.second))) {
      continue;
    }
    out += e.first + (e.second.empty() ? "" : " " + e.second) + ";";
  }
  return out;
}

// Whether `text` holds a member's loss (outsiders' aside).
bool member_loss(const std::string& text,
                 const std::vector<std::string>& members) {
  for (const auto& e : entries(text)) {
    if ((e.first == "lost" || e.first == "left") && !outsider_loss(e, members))
      return true;
  }
  return false;
}

// "3,1,4" <-> {3, 1, 4}: the join sequence numbers of a closed round's
// members, as stored in r/R/closed.
std::string join_seqs(const std::vector<int>& seqs) {
  std::string out;
  for (int s : seqs) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}
std::vector<int> parse_seqs(const std::string& text) {
  std::vector<int> out;
  for (const std::string& s : split_list(text, ',')) out.push_back(to_int(s));
  return out;
}

// Sets a flag when a thread's body ends, however it ends.
struct SetOnExit {
  std::atomic<bool>& flag;
  ~SetOnExit() { flag.store(true); }
};

}  // namespace

C10dRendezvous::C10dRendezvous(Params params)
    : p_(std::move(params)),
      prefix_("dlaunch/rdzv/" + p_.run_id + "/"),
      node_id_(p_.node_addr + "/" + std::to_string(::getpid())) {}

void C10dRendezvous::connect() {
  comm::store::TcpStoreOptions so;
  so.host = p_.store_host;
  so.port = static_cast<uint16_t>(p_.store_port);
  so.connect_timeout = p_.options.join_timeout;
  so.timeout = p_.options.read_timeout;
  so.token = p_.token;
  std::unique_ptr<comm::store::TcpStore> store, watcher, alive;
  try {
    store = comm::store::TcpStore::connect(
        so, [this] { return interrupted_.load(); });
    watcher = store->clone();
    alive = store->clone();
  } catch (const comm::store::StoreAuthError& e) {
    throw RendezvousError(
        std::string("the agents' store refused this agent: ") + e.what());
  } catch (const StoreError& e) {
    if (interrupted_) throw RendezvousInterrupted(e.what());
    if (!p_.host_failure.empty()) {
      throw RendezvousError(
          std::string("cannot reach the agents' store: ") + e.what() +
          "; this agent could not serve it itself (" + p_.host_failure +
          "): if a program other than dlaunch holds port " +
          std::to_string(p_.store_port) +
          ", pick a free one (--rdzv-endpoint HOST:PORT); else start the "
          "agent that hosts it (is_host)");
    }
    throw RendezvousError(std::string("cannot reach the agents' store: ") +
                          e.what() +
                          "; start the agent that hosts it (is_host) or "
                          "check --rdzv-endpoint");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    store_ = std::move(store);
    watcher_ = std::move(watcher);
    alive_ = std::move(alive);
  }
  alive_thread_ = std::thread([this] { keep_alive_loop(); });
}

void C10dRendezvous::interrupt() {
  interrupted_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  if (in_round_ && store_) store_->interrupt();
}

C10dRendezvous::~C10dRendezvous() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // The watcher first: ending alive_'s connection makes the store append
  // this node's loss, an event the watcher must not report any more.
  stop_watcher();
  // A check in flight to a silent store would hold the join for up to the
  // read timeout.
  if (alive_thread_.joinable()) alive_->interrupt();
  if (alive_thread_.joinable()) alive_thread_.join();
}

void C10dRendezvous::stop_watcher() {
  if (!watcher_thread_.joinable()) return;
  if (watcher_done_.load()) {
    watcher_thread_.join();
    if (!watcher_failed_.exchange(false)) return;
  } else {
    // Still parked in wait(): break its connection, and give the next
    // watcher a fresh one.
    watcher_->interrupt();
    watcher_thread_.join();
    watcher_failed_.store(false);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!stopping_) watcher_ = store_->clone();
}

std::string C10dRendezvous::key(int round, const std::string& name) const {
  return prefix_ + "r/" + std::to_string(round) + "/" + name;
}

void C10dRendezvous::keep_alive_loop() {
  // At least two pings in each span the store allows silence for
  // (interval * max_attempt): with max_attempt 1 a ping every interval,
  // counted from the last one's end, always came late.
  const auto& o = p_.options;
  // Never 0 ms (interval 1 ms, one attempt): that would spin.
  const milliseconds every =
      std::max(milliseconds(1),
               std::min(o.keep_alive_interval,
                        o.keep_alive_interval * o.keep_alive_max_attempt / 2));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, every, [this] { return stopping_; });
    if (stopping_) break;
    if (Clock::now() < silent_until_) continue;
    lock.unlock();
    std::string silent;
    bool closed = false;
    try {
      std::lock_guard<std::mutex> alive(alive_mu_);
      alive_->check({});
    } catch (const StoreError& e) {
      // Closed by the server (FIN): the store is alive and dropped this
      // node, or went with its host, whose FIN the watcher gets too.
      // Anything else (no answer, a reset) may leave the watcher waiting.
      const std::string what = e.what();
      if (what.find("the server closed the connection") != std::string::npos) {
        closed = true;
      } else {
        silent = what;
      }
    }
    lock.lock();
    // A closed connection: the store is gone (the watcher's connection
    // closes too, and it reports that) or alive and dropped this node (the
    // watcher reads why from the round's events).
    if (closed) return;
    if (!silent.empty()) {
      // No answer (the store's host frozen or powered off: no FIN), and
      // the watcher's connection may wait as silently: end its wait, so
      // that it reports the loss; watch() ends the next one at once.
      if (!stopping_) {
        alive_failure_ = silent;
        watcher_->interrupt();
      }
      return;
    }
  }
}

std::set<std::string> C10dRendezvous::lost_in(comm::store::TcpStore& s,
                                              int r) const {
  std::set<std::string> lost;
  if (s.check({key(r, "ev")})) {
    for (const auto& [verb, id] : entries(s.get(key(r, "ev")))) {
      if (verb == "lost" || verb == "left") lost.insert(id);
    }
  }
  return lost;
}

bool C10dRendezvous::try_close(comm::store::TcpStore& s, int r, bool at_min,
                               int can_join) {
  const RendezvousOptions& o = p_.options;
  const int n = static_cast<int>(s.add(key(r, "n"), 0));
  // Joiner i's record. One not written yet: its node is microseconds from
  // writing it, or was killed between counting and writing (then waiting
  // for it would take the read timeout): given kRecordGrace, else none.
  auto record = [&](int i) -> std::optional<MemberRecord> {
    const std::string k = key(r, "node/" + std::to_string(i));
    if (!s.check({k})) {
      try {
        s.wait({k}, kRecordGrace);
      } catch (const StoreTimeoutError&) {
        return std::nullopt;
      }
    }
    return MemberRecord::decode(s.get(k), i);
  };
  // Joiners lost before the round closed stay out of it.
  const std::set<std::string> lost = lost_in(s, r);
  std::vector<int> live;
  for (int i = 1; i <= n; ++i) {
    if (lost.empty()) {
      live.push_back(i);
    } else if (auto m = record(i); m && !lost.contains(m->id)) {
      live.push_back(i);
    }
  }
  if (o.backend == "static") {
    // One joiner per --node-rank, the first: a second node given the same
    // rank is left out (and fails saying so), not the round.
    std::set<int> ranks;
    std::erase_if(live, [&](int i) {
      auto m = record(i);
      return !m || !ranks.insert(m->node_rank).second;
    });
  } else if (static_cast<int>(live.size()) > o.max_nodes && r > 0) {
    // More joiners than room: the last round's members first, then by join
    // order (an idle spare joins first and pushed out the member that
    // arrived last, slow to stop its workers).
    std::vector<std::pair<bool, int>> order;
    for (int i : live) {
      if (auto m = record(i)) order.emplace_back(m->prev_round != r - 1, i);
    }
    std::stable_sort(
        order.begin(), order.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    live.clear();
    for (const auto& [newcomer, i] : order) live.push_back(i);
  }
  const int count = static_cast<int>(live.size());
  const int full = std::max(o.min_nodes, std::min(o.max_nodes, can_join));
  if (count < full && !(at_min && count >= o.min_nodes)) return false;
  live.resize(static_cast<size_t>(std::min(count, o.max_nodes)));
  std::sort(live.begin(), live.end());
  s.compare_set(key(r, "closed"), "", join_seqs(live));
  return true;
}

void C10dRendezvous::refuse_misfit(int r, const MemberRecord& me) {
  const int n = static_cast<int>(store_->add(key(r, "n"), 0));
  if (n == 0) return;
  const std::set<std::string> lost = lost_in(*store_, r);
  std::vector<std::string> keys;
  for (int i = 1; i <= n; ++i)
    keys.push_back(key(r, "node/" + std::to_string(i)));
  // Two requests when every record is written (the usual case), not two
  // per joiner: a round of 512 nodes reads them at every join.
  std::vector<std::string> vals;
  if (store_->check(keys)) {
    vals = store_->multi_get(keys);
  } else {
    for (const std::string& k : keys) {
      // "": a joiner about to write it
      vals.push_back(store_->check({k}) ? store_->get(k) : "");
    }
  }
  for (int i = 1; i <= n; ++i) {
    if (vals[i - 1].empty()) continue;
    const MemberRecord m = MemberRecord::decode(vals[i - 1], i);
    if (m.id == node_id_ || lost.contains(m.id)) continue;
    if (std::string e = nnodes_conflict(me, m); !e.empty()) {
      throw RendezvousError(e);
    }
    if (p_.options.backend == "static" && m.node_rank == me.node_rank) {
      throw RendezvousError(
          "node " + m.addr + " joined round " + std::to_string(r) +
          " of job '" + p_.run_id + "' with --node-rank " +
          std::to_string(me.node_rank) + " before this node (" + me.addr +
          "); give each of the " + std::to_string(p_.options.max_nodes) +
          " nodes its own --node-rank, 0.." +
          std::to_string(p_.options.max_nodes - 1));
    }
  }
}

std::vector<std::string> C10dRendezvous::round_members(comm::store::TcpStore& s,
                                                       int r) const {
  std::vector<std::string> ids;
  if (!s.check({key(r, "closed")})) return ids;
  const std::vector<int> seqs = parse_seqs(s.get(key(r, "closed")));
  std::vector<std::string> keys;
  for (int i : seqs) keys.push_back(key(r, "node/" + std::to_string(i)));
  const std::vector<std::string> vals = s.multi_get(keys);
  for (size_t i = 0; i < seqs.size(); ++i) {
    ids.push_back(MemberRecord::decode(vals[i], seqs[i]).id);
  }
  return ids;
}

std::vector<std::string> C10dRendezvous::expected_after(
    comm::store::TcpStore& s, int prev, std::vector<std::string> members,
    bool& failed) const {
  if (members.empty()) members = round_members(s, prev);
  const std::string ev =
      s.check({key(prev, "ev")}) ? s.get(key(prev, "ev")) : "";
  std::set<std::string> gone;
  std::vector<std::string> asked;
  for (const auto& [verb, id] : entries(ev)) {
    if (verb == "lost" || verb == "left") gone.insert(id);
    if (verb == "joined") asked.push_back(id);
    if (verb == "failed") failed = true;
  }
  std::vector<std::string> expected;
  for (const std::vector<std::string>* ids : {&members, &asked}) {
    for (const std::string& id : *ids) {
      if (id != node_id_ && !gone.contains(id) &&
          std::find(expected.begin(), expected.end(), id) == expected.end()) {
        expected.push_back(id);
      }
    }
  }
  return expected;
}

void C10dRendezvous::start_closer(int r, std::vector<std::string> in_keys,
                                  Clock::time_point deadline) {
  stop_watcher();  // the last round's, done by now
  watcher_done_.store(false);
  watcher_thread_ = std::thread([this, r, keys = std::move(in_keys), deadline] {
    SetOnExit done{watcher_done_};
    try {
      auto left =
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      watcher_->wait(keys, std::max(left, milliseconds(1)));
      try_close(*watcher_, r, true);
    } catch (const StoreError&) {
      // Stopped (the round closed otherwise), past the deadline, or the
      // store is gone: the agent's thread deals with each. The connection
      // may be unusable: stop_watcher() replaces it.
      watcher_failed_.store(true);
    }
  });
}

RendezvousResult C10dRendezvous::next_round(int local_world_size,
                                            RoundReason reason,
                                            milliseconds timeout) {
  if (interrupted_) throw RendezvousInterrupted("interrupted");
  if (!store_) connect();
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_round_ = true;
  }
  struct Leave {
    C10dRendezvous& r;
    ~Leave() {
      std::lock_guard<std::mutex> lock(r.mu_);
      r.in_round_ = false;
    }
  } leave{*this};
  // interrupt() may have come before in_round_ was set.
  if (interrupted_) throw RendezvousInterrupted("interrupted");
  const RendezvousOptions& o = p_.options;
  const bool fixed = o.backend == "static";
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const std::string where = p_.store_host + ":" + std::to_string(p_.store_port);
  try {
    if (store_->check({prefix_ + "finished"})) {
      throw RendezvousClosed(finished_message(p_.run_id));
    }
    if (store_->check({prefix_ + "gave_up"})) {
      throw RendezvousError(gave_up_message(p_.run_id));
    }
    if (store_->check({prefix_ + "aborted"})) {
      throw RendezvousError(store_->get(prefix_ + "aborted"));
    }
    int r = 0;
    // Every round after the first re-forms the one before, whoever joins
    // it (a member, a node that round left out, a new one): it closes as
    // soon as each node it expects (the survivors of the previous round and
    // the nodes that asked to join it) is back or lost, with at least
    // min_nodes; no last call, so a member slow to stop its workers is
    // never left out (the nodes then took turns holding rounds alone). A
    // first round, or one after a round none of whose nodes is left (for
    // a node that was not in it), waits for max_nodes or the last call.
    bool reformed = false;
    std::vector<std::string> expected;
    // Whether the others wait for this node's r/R/in/ID key.
    bool awaited = round_ >= 0 && !fixed;
    // A failure anywhere in the previous round spends a restart, even when
    // a node loss is what this node saw end it: every member proposes the
    // count it saw and the round takes the largest, so all agree.
    bool failed = reason == RoundReason::kFailure && round_ >= 0;
    if (round_ < 0) {
      r = to_int(store_->compare_set(prefix_ + "cur", "", "0"), 0);
      if (r > 0 && !fixed) {
        bool ignored = false;
        expected = expected_after(*store_, r - 1, {}, ignored);
        reformed = !expected.empty();  // none left: a first round again
      }
    } else {
      r = round_ + 1;
      store_->compare_set(prefix_ + "cur", std::to_string(round_),
                          std::to_string(r));
      std::vector<std::string> last =
          expected_after(*store_, round_, member_ids_, failed);
      if (!fixed) {
        expected = std::move(last);
        reformed = true;
      }
    }
    const auto target_for = [&o](bool re, size_t expecting) {
      return re ? std::clamp(static_cast<int>(expecting) + 1, o.min_nodes,
                             o.max_nodes)
                : o.max_nodes;
    };
    int target = target_for(reformed, expected.size());
    const int restarts = restart_count_ + (failed ? 1 : 0);
    const milliseconds keep_alive =
        o.keep_alive_interval * o.keep_alive_max_attempt;

    while (true) {
      {
        // Dying from here on ends round r for the others at once, and
        // their wait for this node in round r+1 while it forms. Registered
        // before joining: a node counted in the round is always covered.
        std::lock_guard<std::mutex> lock(alive_mu_);
        alive_->append_on_close(key(r, "ev"), "lost " + node_id_ + ";",
                                keep_alive);
        if (!fixed) {
          alive_->append_on_close(key(r + 1, "in/" + node_id_), "lost;",
                                  keep_alive);
        }
      }
      // The record first: it may fail (no free port on --local-addr), and a
      // node counted in r/n must have one (try_close reads them all).
      const MemberRecord me = join_record(p_, node_id_, local_world_size,
                                          round_, group_rank_, restarts);
      refuse_misfit(r, me);
      const int seq = static_cast<int>(store_->add(key(r, "n"), 1));
      const auto joined_at = Clock::now();
      store_->set(key(r, "node/" + std::to_string(seq)), me.encode());
      if (awaited) store_->append(key(r, "in/" + node_id_), "joined;");
      std::vector<std::string> in_keys;
      for (const std::string& id : expected) {
        in_keys.push_back(key(r, "in/" + id));
      }
      if (reformed) {
        // The last expected node to arrive closes the round; should one
        // be lost instead, the closer thread sees its key appear.
        if (store_->check(in_keys)) {
          try_close(*store_, r, true);
        } else {
          start_closer(r, in_keys, deadline);
        }
      } else if (seq >= target) {
        try_close(*store_, r, false);
      }

      // Wait for the round to close, saying how it goes.
      std::string closed;
      auto next_progress = joined_at + milliseconds(1000);
      while (closed.empty()) {
        // A multi-host head that lost hosts below the minimum says so
        // here (launcher/multi_host.cc): no waiting out the join timeout.
        if (store_->check({prefix_ + "aborted"})) {
          stop_watcher();
          throw RendezvousError(store_->get(prefix_ + "aborted"));
        }
        auto now = Clock::now();
        const bool last_call = !fixed && !reformed && seq >= o.min_nodes;
        const auto call_ends = joined_at + o.last_call_timeout;
        if (last_call && now >= call_ends) try_close(*store_, r, true);
        // A multi-host head that lost hosts says how many can still join
        // (HostLosses): once they all have, no last call is waited out.
        if (last_call && now < call_ends &&
            store_->check({prefix_ + "hosts_left"})) {
          try_close(*store_, r, false,
                    to_int(store_->get(prefix_ + "hosts_left"), o.max_nodes));
        }
        if (now >= next_progress) {
          int n = static_cast<int>(store_->add(key(r, "n"), 0));
          p_.log(waiting_line(
              n, target, o,
              last_call && now < call_ends
                  ? std::chrono::duration_cast<milliseconds>(call_ends - now)
                  : milliseconds(-1)));
          next_progress = now + kProgressEvery;
        }
        if (now >= deadline) {
          stop_watcher();
          // Joiners lost meanwhile are named apart, not counted.
          int n = static_cast<int>(store_->add(key(r, "n"), 0));
          const std::set<std::string> lost = lost_in(*store_, r);
          std::vector<std::string> who, gone;
          for (int i = 1; i <= n; ++i) {
            const std::string k = key(r, "node/" + std::to_string(i));
            if (!store_->check({k})) continue;  // killed before writing it
            const MemberRecord m = MemberRecord::decode(store_->get(k), i);
            (lost.contains(m.id) ? gone : who).push_back(m.addr);
          }
          std::string message = too_few_message(
              static_cast<int>(who.size()), r, p_.run_id, where,
              std::chrono::duration_cast<milliseconds>(now - start), o, who,
              gone);
          // torchrun's defaults (an empty endpoint, --master-addr
          // 127.0.0.1) meet on each host alone.
          if (comm::store::is_loopback(p_.store_host)) {
            message += "; " + p_.store_host +
                       " reaches this machine alone: nodes on other hosts "
                       "must name node 0's address (--rdzv-endpoint "
                       "HOST[:PORT], or --master-addr HOST for the static "
                       "backend)";
          }
          throw RendezvousError(message);
        }
        // At most a second: the head's aborted and hosts_left keys are
        // looked at between waits.
        auto until =
            std::min({deadline, next_progress, now + milliseconds(1000),
                      last_call ? std::max(call_ends, now) : deadline});
        auto slice =
            std::max(milliseconds(1),
                     std::chrono::duration_cast<milliseconds>(until - now));
        try {
          store_->wait({key(r, "closed")}, slice);
          closed = store_->get(key(r, "closed"));
        } catch (const StoreTimeoutError&) {
        }
      }
      stop_watcher();
      const std::vector<int> seqs = parse_seqs(closed);
      const int count = static_cast<int>(seqs.size());

      if (std::find(seqs.begin(), seqs.end(), seq) == seqs.end()) {
        // The round formed without this node: ask for the next one (when
        // there is room) and wait for the running round to end.
        if (fixed) {
          throw RendezvousError(
              "round " + std::to_string(r) + " of job '" + p_.run_id +
              "' already has its " + std::to_string(count) +
              " nodes; is --node-rank " + std::to_string(o.node_rank) +
              " given to two nodes?");
        }
        awaited = count < o.max_nodes;
        if (awaited) store_->append(key(r, "ev"), "joined " + node_id_ + ";");
        p_.log(late_line(r, count, o.max_nodes));
        // The round's members, whose events alone end this wait (the
        // losses of other outsiders do not: the members go on).
        const std::vector<std::string> member_ids = round_members(*store_, r);
        std::string ev;
        try {
          ev = wait_for_members(*store_, r, member_ids, deadline);
        } catch (const StoreTimeoutError&) {
          // A store that stopped answering fails here too: the check,
          // on a connection closed by the client, throws plain StoreError.
          if (Clock::now() < deadline) throw;
          store_->check({});
          throw RendezvousError(
              "round " + std::to_string(r) + " of job '" + p_.run_id +
              "' stayed full (" + std::to_string(count) +
              " nodes, the most --nnodes allows) for the " +
              comm::store::format_duration(timeout) +
              " this node waited for a place; raise --nnodes MAX or start "
              "this node when the job has room");
        }
        if (classify(r, ev, member_ids).kind == RoundEvent::Kind::kSucceeded) {
          throw RendezvousClosed("the job '" + p_.run_id +
                                 "' finished while this node waited to "
                                 "join; nothing to do");
        }
        ++r;
        store_->compare_set(prefix_ + "cur", std::to_string(r - 1),
                            std::to_string(r));
        // It re-forms the round that left this node out: this node waits
        // for that round's members as they wait for it.
        bool ignored = false;
        expected = expected_after(*store_, r - 1, member_ids, ignored);
        reformed = !expected.empty();
        target = target_for(reformed, expected.size());
        continue;
      }

      // A member: read everyone's record and order the group.
      std::vector<std::string> keys;
      for (int i : seqs) keys.push_back(key(r, "node/" + std::to_string(i)));
      std::vector<std::string> vals = store_->multi_get(keys);
      std::vector<MemberRecord> ms;
      for (int i = 0; i < count; ++i) {
        ms.push_back(MemberRecord::decode(vals[i], seqs[i]));
      }
      RendezvousResult res = form_round(r, ms, node_id_, reason, fixed);
      std::vector<std::string> ids;
      for (const MemberRecord& m : ms) ids.push_back(m.id);
      if (round_ >= 0 && res.restart_count > restart_count_) {
        // Spent on every member, whatever each saw end the last round.
        res.reason = RoundReason::kFailure;
        res.restart_cause = "a worker on another node failed";
        const std::string ev = store_->check({key(round_, "ev")})
                                   ? store_->get(key(round_, "ev"))
                                   : "";
        for (const auto& [verb, id] : entries(ev)) {
          if (verb == "failed") {
            res.restart_cause = "a worker on node " + id + " failed";
            break;
          }
        }
      }

      round_ = r;
      group_rank_ = res.group_rank;
      members_ = count;
      member_ids_ = std::move(ids);
      member_addrs_ = res.members;
      restart_count_ = res.restart_count;
      reported_ = false;
      p_.log(round_line(res));
      return res;
    }
  } catch (const StoreError& e) {
    if (interrupted_) throw RendezvousInterrupted(e.what());
    throw RendezvousError(std::string("the agents' store at ") + where +
                          " failed: " + e.what());
  }
}

std::string C10dRendezvous::wait_for_members(
    comm::store::TcpStore& s, int round,
    const std::vector<std::string>& members,
    std::optional<Clock::time_point> deadline) {
  // Once the key holds only losses left out, appends to it are looked
  // for every kOutsiderPoll (the store wakes a wait only when a key
  // appears). A sleep, not a short store wait: a wait whose answer comes
  // late closes the connection. interrupt() fails the next get.
  size_t seen = 0;
  while (true) {
    if (seen == 0) {
      milliseconds slice = kWatchSlice;
      if (deadline) {
        slice = std::clamp(
            std::chrono::duration_cast<milliseconds>(*deadline - Clock::now()),
            milliseconds(1), kWatchSlice);
      }
      try {
        s.wait({key(round, "ev")}, slice);
      } catch (const StoreTimeoutError&) {
        if (deadline && Clock::now() >= *deadline) throw;
        continue;
      }
    } else {
      if (deadline && Clock::now() >= *deadline) {
        throw StoreTimeoutError("timed out waiting for an event of round " +
                                std::to_string(round) +
                                " other than losses left out");
      }
      std::this_thread::sleep_for(kOutsiderPoll);
    }
    std::string text = s.get(key(round, "ev"));
    if (text.size() != seen) {
      std::set<std::string> done;
      if (member_loss(text, members) && s.check({key(round, "done_by")})) {
        for (std::string& id : split_list(s.get(key(round, "done_by")), ';')) {
          done.insert(std::move(id));
        }
      }
      if (std::string left = concerning(text, members, done); !left.empty()) {
        return left;
      }
    }
    seen = text.size();
  }
}

RoundEvent C10dRendezvous::classify(
    int round, const std::string& text,
    const std::vector<std::string>& members) const {
  RoundEvent ev;
  ev.round = round;
  auto es = entries(text);
  std::erase_if(es, [&](const auto& e) { return outsider_loss(e, members); });
  if (!es.empty() && es[0].first == "exit") {
    ev.kind = RoundEvent::Kind::kSucceeded;
    return ev;
  }
  const bool fixed = p_.options.backend == "static";
  const std::pair<std::string, std::string>* lost = nullptr;
  const std::pair<std::string, std::string>* joined = nullptr;
  for (const auto& e : es) {
    if (e.first == "failed" && e.second != node_id_) {
      ev.kind = RoundEvent::Kind::kFailure;
      ev.detail = "a worker on node " + e.second + " failed";
      return ev;
    }
    if ((e.first == "lost" || e.first == "left") && !lost) lost = &e;
    if (e.first == "joined" && !joined) joined = &e;
  }
  if (lost && lost->second == node_id_) {
    ev.kind = RoundEvent::Kind::kFatal;
    ev.detail =
        "the agents' store declared this node lost (silent past its "
        "keep-alive of " +
        format_duration(p_.options.keep_alive_interval *
                        p_.options.keep_alive_max_attempt) +
        "); was it stopped or cut off?";
  } else if (lost) {
    ev.kind = fixed ? RoundEvent::Kind::kFatal : RoundEvent::Kind::kNodeLost;
    ev.detail = "node " + lost->second +
                (lost->first == "left" ? " left" : " is gone") +
                (fixed ? "; the static backend cannot go on without it (use "
                         "--rdzv-backend c10d with --nnodes MIN:MAX)"
                       : "");
  } else if (joined) {
    ev.kind = RoundEvent::Kind::kNodeJoined;
    ev.detail = "node " + joined->second + " asks to join";
  } else {
    ev.kind = RoundEvent::Kind::kFatal;
    ev.detail = "unexpected rendezvous event '" + text + "'";
  }
  return ev;
}

void C10dRendezvous::watch(EventCallback on_event) {
  stop_watcher();
  {
    // The keep-alive gave up on a silent store before this watcher (its
    // interrupt may have hit a closer's connection, since replaced).
    std::lock_guard<std::mutex> lock(mu_);
    if (!alive_failure_.empty()) watcher_->interrupt();
  }
  const int r = round_;
  const std::string where = p_.store_host + ":" + std::to_string(p_.store_port);
  watcher_done_.store(false);
  watcher_thread_ = std::thread(
      [this, r, where, members = member_ids_, cb = std::move(on_event)] {
        SetOnExit done{watcher_done_};
        std::string text;
        try {
          text = wait_for_members(*watcher_, r, members);
        } catch (const StoreError& e) {
          std::string why = e.what();
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopping_) return;
            if (!alive_failure_.empty()) why = "keep-alive: " + alive_failure_;
          }
          cb(RoundEvent{RoundEvent::Kind::kFatal, r,
                        "lost the agents' store at " + where + " (" + why +
                            "): the agent hosting it is gone (stopped, or "
                            "finished and left after its "
                            "--exit-barrier-timeout), which ends the job with "
                            "the c10d backend (--rdzv-backend etcd survives "
                            "it)"});
          return;
        }
        cb(classify(r, text, members));
      });
}

bool C10dRendezvous::cut_off(milliseconds d) {
  std::lock_guard<std::mutex> lock(mu_);
  silent_until_ = Clock::now() + d;
  return true;
}

std::vector<std::string> C10dRendezvous::unfinished_nodes() {
  if (round_ < 0 || !store_) return {};
  std::set<std::string> done;
  try {
    if (store_->check({key(round_, "done_by")})) {
      for (const std::string& id :
           split_list(store_->get(key(round_, "done_by")), ';')) {
        done.insert(id);
      }
    }
  } catch (const StoreError&) {
    return {};  // the store is gone: nobody to name
  }
  done.insert(node_id_);  // asked only once this node's workers succeeded
  return unfinished_members(member_ids_, member_addrs_, done);
}

void C10dRendezvous::report(NodeOutcome outcome) {
  if (round_ < 0 || reported_) return;
  reported_ = true;
  const std::string ev = key(round_, "ev");
  try {
    switch (outcome) {
      case NodeOutcome::kSucceeded:
        // Who, before how many: the barrier's message names the others.
        store_->append(key(round_, "done_by"), node_id_ + ";");
        if (store_->add(key(round_, "done"), 1) == members_) {
          store_->set(prefix_ + "finished", "1");
          store_->append(ev, "exit;");
        }
        break;
      case NodeOutcome::kFailed:
        store_->append(ev, "failed " + node_id_ + ";");
        break;
      case NodeOutcome::kLeaving:
        store_->append(ev, "left " + node_id_ + ";");
        break;
      case NodeOutcome::kGaveUp:
        // For nodes that come later: the job is over, not waiting.
        store_->set(prefix_ + "gave_up", "1");
        break;
    }
  } catch (const StoreError& e) {
    p_.log(std::string("dlaunch: cannot tell the other nodes: ") + e.what() +
           "\n");
  }
}

}  // namespace dlaunch::agent::rendezvous
