#include "agent/rendezvous/etcd/etcd_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "agent/rendezvous/member.h"
#include "comm/store/text.h"

namespace dlaunch::agent::rendezvous::etcd {

using comm::store::format_duration;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How often a round past its last call looks again for the last round's
// members it still waits for.
constexpr milliseconds kPendingLook(1000);

namespace {

// How often a node waiting for a round says how it is going.
constexpr milliseconds kProgressEvery(5000);
// Separates the member records in a round's "closed" value.
constexpr char kRecordSep = '\x1e';
// How long a join waits for its watch's request to go out.
constexpr milliseconds kWatchSendWait(1000);
// Bound on revoking the lease at the end.
constexpr milliseconds kRevokeTimeout(5000);

// Zero-padded, so that keys sort by round.
std::string pad(int round) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08d", round);
  return buf;
}

etcdserverpb::RangeRequest prefix_range(const std::string& prefix,
                                        int64_t revision = 0) {
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(prefix_end(prefix));
  req.set_revision(revision);
  return req;
}

// Makes transaction t succeed only while no key in [key, range_end)
// exists (etcd compares an empty range as one absent key).
void require_absent(etcdserverpb::TxnRequest& t, const std::string& key,
                    const std::string& range_end = "") {
  auto* c = t.add_compare();
  c->set_key(key);
  c->set_range_end(range_end);
  c->set_target(etcdserverpb::Compare::CREATE);
  c->set_result(etcdserverpb::Compare::EQUAL);
  c->set_create_revision(0);
}

}  // namespace

// What a node forming round R knows of it: how many have joined and,
// once closed, the member records.
struct EtcdRendezvous::RoundState {
  int joined = 0;  // live joiners, this node included
  // Their records by the revision that created them, when read at
  // `revision` and not used since (else empty).
  std::vector<std::pair<int64_t, std::string>> fresh;
  bool closed = false;
  std::string records;  // the "closed" value
  int64_t closed_rev = 0;
  int64_t revision = 0;  // of the last read

  // Takes the round's "closed" key, as read or put.
  void take_closed(const mvccpb::KeyValue& kv) {
    closed = true;
    records = kv.value();
    closed_rev = kv.mod_revision();
  }
  // The same from a read of it (no key: not closed).
  void take_closed(
      const google::protobuf::RepeatedPtrField<mvccpb::KeyValue>& kvs) {
    if (!kvs.empty()) take_closed(kvs[0]);
  }
};

// Makes a watch the one that a lost lease, or stop_watcher(), interrupts
// while this lives (set_active). The thread that made it uses it.
class EtcdRendezvous::ActiveWatch {
 public:
  ActiveWatch(EtcdRendezvous& r, Watch& w) : r_(r), w_(w) {
    r_.set_active(&w_);
  }
  ~ActiveWatch() { r_.set_active(nullptr); }
  ActiveWatch(const ActiveWatch&) = delete;
  ActiveWatch& operator=(const ActiveWatch&) = delete;
  Watch* operator->() const { return &w_; }

 private:
  EtcdRendezvous& r_;
  Watch& w_;
};

namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

// Heads a round's "closed" value: the format of the round's keys. "f2":
// a round's success is its "end" key, which the member whose "done"
// completes the set puts, or the others should it die first (before it,
// every member counted the "done" keys, and "closed" began with the
// revision alone).
constexpr std::string_view kRoundFormat = "f2:";

// The first field of a round's "closed" value: kRoundFormat, then the
// revision at which the closer read the records that follow.
int64_t closed_read_revision(const std::string& field) {
  int64_t rev = 0;
  const char* end = field.data() + field.size();
  const bool ours = field.starts_with(kRoundFormat);
  auto [p, ec] = std::from_chars(
      field.data() + (ours ? kRoundFormat.size() : 0), end, rev);
  if (!ours || ec != std::errc() || p != end || rev <= 0) {
    throw RendezvousError("malformed round record '" + field +
                          "' in etcd (another dlaunch version?)");
  }
  return rev;
}

}  // namespace

EtcdRendezvous::EtcdRendezvous(Params params)
    : p_(std::move(params)),
      prefix_("/dlaunch/" + p_.run_id + "/"),
      node_id_(p_.node_addr + "/" + std::to_string(::getpid())) {
  const RendezvousOptions& o = p_.options;
  const auto ka = o.keep_alive_interval * o.keep_alive_max_attempt;
  const std::chrono::seconds want(
      std::max<int64_t>(1, (ka.count() + 999) / 1000));
  try {
    client_ = std::make_unique<Client>(p_.client);
    auto grant = client_->lease_grant(want, o.join_timeout, &asked_);
    lease_ = grant.id();
    ttl_ = std::chrono::seconds(grant.ttl());
  } catch (const EtcdError& e) {
    throw RendezvousError(std::string("cannot join the etcd rendezvous: ") +
                          e.what());
  }
  alive_thread_ = std::thread([this] { keep_alive_loop(); });
}

EtcdRendezvous::~EtcdRendezvous() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  stop_watcher();
  watch_.reset();
  if (alive_thread_.joinable()) alive_thread_.join();
  abandon(std::min(p_.options.read_timeout, kRevokeTimeout));
}

void EtcdRendezvous::abandon(milliseconds timeout) {
  if (lease_lost_) return;  // nothing left to revoke
  try {
    client_->lease_revoke(lease_, timeout);
  } catch (const EtcdError& e) {
    p_.log(std::string("dlaunch: could not revoke this node's etcd lease (its "
                       "keys vanish when it expires): ") +
           e.what() + "\n");
  }
}

std::string EtcdRendezvous::round_prefix(int round) const {
  return prefix_ + "r/" + pad(round) + "/";
}

Watch& EtcdRendezvous::watch_on(const std::string& key,
                                const std::string& range_end, int64_t from) {
  if (!watch_ || !watch_->rewatch(key, range_end, from)) {
    watch_.reset();
    watch_ = client_->watch(key, range_end, from);
  }
  return *watch_;
}

void EtcdRendezvous::set_active(Watch* w) {
  std::lock_guard<std::mutex> lock(mu_);
  active_ = w;
  if (w && (lease_lost_ || watcher_stop_)) w->interrupt();
}

RoundEvent EtcdRendezvous::self_lost() const {
  return RoundEvent{RoundEvent::Kind::kFatal, round_,
                    "etcd dropped this node's keys (its lease of " +
                        std::to_string(ttl_.count()) +
                        " s expired): it was cut off from etcd or stopped "
                        "too long, and the others went on without it"};
}

void EtcdRendezvous::check_lease() const {
  if (lease_lost_) {
    throw RendezvousError(
        "this node's etcd lease (TTL " + std::to_string(ttl_.count()) +
        " s) expired: it was cut off from etcd at " +
        client_->endpoints_text() +
        ", so the others went on without it; check the network to etcd");
  }
}

void EtcdRendezvous::keep_alive_loop() {
  const milliseconds ttl = ttl_;
  const milliseconds beat = std::max(
      milliseconds(100), std::min(p_.options.keep_alive_interval, ttl / 3));
  // The lease was granted after it was asked for: etcd expires it no
  // earlier than ttl from then unless a keep-alive renews it.
  auto renewed = asked_;
  // After a keep-alive that got no answer the next goes soon, not a beat
  // later: a member may be down or without a leader for seconds, and the
  // whole TTL is there to reach another (the client moves on to the next
  // member after a failure).
  const milliseconds retry = std::min(beat, milliseconds(100));
  bool failed = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const auto expires = renewed + ttl;
    cv_.wait_until(lock,
                   std::min(Clock::now() + (failed ? retry : beat), expires),
                   [this] { return stopping_; });
    if (stopping_) return;
    std::string why;
    const auto now = Clock::now();
    const auto heard = Clock::time_point(Clock::duration(agent_heard_.load()));
    const bool agent_silent =
        p_.agent_silence.count() > 0 && now - heard > p_.agent_silence;
    // Cut off, or the agent frozen: not renewed.
    if (now < expires && (now < silent_until_ || agent_silent)) continue;
    if (now < expires) {
      lock.unlock();
      const auto sent = Clock::now();
      int64_t left = 0;
      try {
        left = client_->lease_keep_alive(
            lease_,
            std::max(milliseconds(1),
                     std::min(beat, std::chrono::duration_cast<milliseconds>(
                                        expires - sent))));
        if (left <= 0) why = "etcd says it expired";
      } catch (const EtcdError& e) {
        why = e.what();
      }
      lock.lock();
      failed = left <= 0;
      if (left > 0) {
        renewed = sent;
        continue;
      }
      if (why.find("expired") == std::string::npos && Clock::now() < expires) {
        continue;  // not renewed yet; try again until it expires
      }
    } else if (now < silent_until_) {
      why = "the cut fault kept its keep-alives from etcd for its TTL of " +
            format_duration(ttl);
    } else if (agent_silent) {
      why = "the agent gave no sign of life for " +
            format_duration(
                std::chrono::duration_cast<milliseconds>(now - heard)) +
            ", past the lease's TTL of " + format_duration(ttl) +
            " (frozen: stopped with SIGSTOP or swapped out?)";
    } else {
      why = "no keep-alive got through for " + format_duration(ttl);
    }
    // Past its TTL etcd has dropped this node's keys and the others go on
    // without it: it must stop its workers, not run on as a split brain.
    // The reason goes out first, ahead of the error it leads to.
    lock.unlock();
    p_.log("dlaunch: this node's etcd lease expired (" + why + ")\n");
    lock.lock();
    lease_lost_ = true;
    if (active_) active_->interrupt();
    lock.unlock();
    client_->cancel();  // whatever this node still asks etcd is moot
    return;
  }
}

void EtcdRendezvous::agent_alive() {
  agent_heard_.store(Clock::now().time_since_epoch().count());
}

bool EtcdRendezvous::cut_off(milliseconds d) {
  std::lock_guard<std::mutex> lock(mu_);
  silent_until_ = Clock::now() + d;
  return true;
}

etcdserverpb::RangeRequest EtcdRendezvous::end_marks() const {
  // The two keys sort next to each other: one range holds both.
  etcdserverpb::RangeRequest req;
  req.set_key(prefix_ + "finished");
  req.set_range_end(prefix_end(prefix_ + "gave_up"));
  req.set_keys_only(true);
  return req;
}

bool EtcdRendezvous::over(const std::string& key) const {
  if (key == prefix_ + "gave_up") {
    throw RendezvousError(gave_up_message(p_.run_id));
  }
  return key == prefix_ + "finished";
}

etcdserverpb::PutRequest EtcdRendezvous::job_mark(const std::string& key) {
  // Its own lease of close_timeout: the mark outlives the members' leases
  // for late nodes, and no key of the job outlives it.
  auto secs = std::chrono::ceil<std::chrono::seconds>(p_.options.close_timeout);
  auto grant = client_->lease_grant(std::max(secs, std::chrono::seconds(1)));
  etcdserverpb::PutRequest put;
  put.set_key(prefix_ + key);
  put.set_value("1");
  put.set_lease(grant.id());
  return put;
}

void EtcdRendezvous::put_end(int round) {
  const std::string rp = round_prefix(round);
  etcdserverpb::TxnRequest end;
  require_absent(end, rp + "end");
  // The mark expires after close_timeout (job_mark), so no key of the job
  // outlives it.
  *end.add_success()->mutable_request_put() = job_mark("finished");
  auto* put = end.add_success()->mutable_request_put();
  put->set_key(rp + "end");
  put->set_lease(lease_);
  client_->txn(end);
}

bool EtcdRendezvous::last_round_pending(int r) const {
  if (r <= 0) return false;
  const std::string pp = round_prefix(r - 1);
  std::set<std::string> live, left;
  const auto last = client_->range(prefix_range(pp));
  for (const auto& kv : last.kvs()) {
    const std::string name = kv.key().substr(pp.size());
    if (starts_with(name, "node/")) live.insert(name.substr(5));
    if (starts_with(name, "ev/") && kv.value() == "left") {
      left.insert(name.substr(3));
    }
  }
  const std::string rp = round_prefix(r) + "node/";
  etcdserverpb::RangeRequest joined = prefix_range(rp);
  joined.set_keys_only(true);
  const auto now_in = client_->range(joined);
  for (const auto& kv : now_in.kvs()) {
    live.erase(kv.key().substr(rp.size()));
  }
  live.erase(node_id_);
  return std::any_of(live.begin(), live.end(),
                     [&](const std::string& id) { return !left.contains(id); });
}

etcdserverpb::RangeRequest EtcdRendezvous::joiners(int round,
                                                   bool count_only) const {
  etcdserverpb::RangeRequest req = prefix_range(round_prefix(round) + "node/");
  req.set_count_only(count_only);
  return req;
}

etcdserverpb::RangeRequest EtcdRendezvous::done_count(int round,
                                                      int64_t revision) const {
  etcdserverpb::RangeRequest req =
      prefix_range(round_prefix(round) + "done/", revision);
  req.set_count_only(true);
  return req;
}

int64_t EtcdRendezvous::gone_before(int64_t revision) {
  std::lock_guard lock(gone_mu_);
  return std::count_if(gone_done_.begin(), gone_done_.end(),
                       [&](int64_t r) { return r < revision; });
}

void EtcdRendezvous::try_close(int round, int need, RoundState& st) {
  const std::string rp = round_prefix(round);
  // The joiners' records in join order, the first max_nodes of them.
  std::vector<std::pair<int64_t, std::string>> by_rev;
  by_rev.swap(st.fresh);
  if (by_rev.empty()) {
    const auto now = client_->range(joiners(round, false));
    for (const auto& kv : now.kvs()) {
      by_rev.emplace_back(kv.create_revision(), kv.value());
    }
    st.revision = now.header().revision();
  }
  std::sort(by_rev.begin(), by_rev.end());
  st.joined = static_cast<int>(by_rev.size());
  if (st.joined < need) return;  // some left meanwhile
  by_rev.resize(std::min<size_t>(by_rev.size(), p_.options.max_nodes));
  // The revision of the read first: the members watch the round from the
  // one after it (wait_round_end), so they need not read it again.
  std::string value = std::string(kRoundFormat) + std::to_string(st.revision);
  for (const auto& [rev, record] : by_rev) value += kRecordSep + record;
  // Closed once, with exactly the joiners read: the transaction fails
  // when another closed it or a joiner came or went since the read.
  etcdserverpb::TxnRequest t;
  require_absent(t, rp + "closed");
  auto* same = t.add_compare();
  same->set_key(rp + "node/");
  same->set_range_end(prefix_end(rp + "node/"));
  same->set_target(etcdserverpb::Compare::MOD);
  same->set_result(etcdserverpb::Compare::LESS);
  same->set_mod_revision(st.revision + 1);
  auto* put = t.add_success()->mutable_request_put();
  put->set_key(rp + "closed");
  put->set_value(value);
  put->set_lease(lease_);
  t.add_failure()->mutable_request_range()->set_key(rp + "closed");
  auto resp = client_->txn(t);
  if (resp.succeeded()) {
    st.closed = true;
    st.records = value;
    st.closed_rev = resp.header().revision();
    return;
  }
  st.take_closed(resp.responses(0).response_range().kvs());
  // Else the joiners changed (or a closer's key vanished with it, which
  // its members see): the caller looks again.
}

bool EtcdRendezvous::wait_next_round(int round, Clock::time_point deadline) {
  // The watch starts before the reads, so that it reports whatever they
  // miss (one from their revision would wait for etcd's sync loop).
  ActiveWatch w(*this, watch_on(prefix_, prefix_end(prefix_), 0));
  const std::string rounds = prefix_ + "r/";
  bool read = false;
  while (true) {
    check_lease();
    if (Clock::now() >= deadline) {
      throw RendezvousError(
          "round " + std::to_string(round) + " of job '" + p_.run_id +
          "' kept running without this node (it has the most nodes "
          "allowed, " +
          std::to_string(p_.options.max_nodes) +
          ") until join_timeout; raise the MAX of --nnodes");
    }
    if (!read) {
      if (!w->first_revision(deadline)) continue;
      read = true;
      etcdserverpb::RangeRequest req;
      req.set_key(rounds + pad(round + 1));
      req.set_range_end(prefix_end(rounds));
      req.set_count_only(true);
      if (client_->range(req).count() > 0) return true;
      const auto marks = client_->range(end_marks());
      for (const auto& kv : marks.kvs()) {
        if (over(kv.key())) return false;
      }
      continue;
    }
    auto ev = w->next(deadline);
    if (!ev || ev->type() != mvccpb::Event::PUT) continue;
    const std::string& k = ev->kv().key();
    if (over(k)) return false;
    if (starts_with(k, rounds) &&
        std::atoi(k.substr(rounds.size(), 8).c_str()) > round) {
      return true;
    }
  }
}

int EtcdRendezvous::join(int round, const MemberRecord& me, bool guess,
                         RoundState& st) {
  const std::string rp = round_prefix(round);
  const std::string rounds = prefix_ + "r/";
  const etcdserverpb::RangeRequest marks = end_marks();
  etcdserverpb::TxnRequest t;
  require_absent(t, marks.key(), marks.range_end());
  if (guess) {
    // No round after this one exists.
    require_absent(t, rounds + pad(round + 1), prefix_end(rounds));
  }
  auto* put = t.add_success()->mutable_request_put();
  put->set_key(rp + "node/" + node_id_);
  put->set_value(me.encode());
  put->set_lease(lease_);
  *t.add_success()->mutable_request_range() = joiners(round, false);
  t.add_success()->mutable_request_range()->set_key(rp + "closed");
  *t.add_failure()->mutable_request_range() = marks;
  auto* newest = t.add_failure()->mutable_request_range();
  *newest = prefix_range(rounds);
  newest->set_sort_order(etcdserverpb::RangeRequest::DESCEND);
  newest->set_sort_target(etcdserverpb::RangeRequest::KEY);
  newest->set_limit(1);
  newest->set_keys_only(true);
  const auto resp = client_->txn(t);
  st.revision = resp.header().revision();
  if (!resp.succeeded()) {
    for (const auto& kv : resp.responses(0).response_range().kvs()) {
      if (over(kv.key())) {
        throw RendezvousClosed(finished_message(p_.run_id));
      }
    }
    const auto& kvs = resp.responses(1).response_range().kvs();
    if (kvs.empty()) return round;  // raced with the last round's end
    return std::atoi(kvs[0].key().substr(rounds.size(), 8).c_str());
  }
  for (const auto& kv : resp.responses(1).response_range().kvs()) {
    st.fresh.emplace_back(kv.create_revision(), kv.value());
  }
  st.joined = static_cast<int>(st.fresh.size());
  st.take_closed(resp.responses(2).response_range().kvs());
  return round;
}

RendezvousResult EtcdRendezvous::next_round(int local_world_size,
                                            RoundReason reason,
                                            milliseconds timeout) {
  stop_watcher();
  check_lease();
  const RendezvousOptions& o = p_.options;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  try {
    // A first join tries round 0, the usual case, in one transaction; a
    // later round, or a finished job, shows in its failure.
    int r = 0;
    bool guess = round_ < 0;
    int target = o.max_nodes;
    if (round_ >= 0) {
      r = round_ + 1;
      // A re-formed round closes as soon as every survivor and every node
      // that asked to join is back: no last call.
      const std::string rp = round_prefix(round_);
      std::set<std::string> present, left;
      const auto prev = client_->range(prefix_range(rp));
      for (const auto& kv : prev.kvs()) {
        const std::string name = kv.key().substr(rp.size());
        if (starts_with(name, "node/")) present.insert(name.substr(5));
        if (starts_with(name, "ev/") && kv.value() == "left") {
          left.insert(name.substr(3));
        }
      }
      int expect = 0;
      for (const std::string& id : members_) {
        if (id == node_id_ || (present.contains(id) && !left.contains(id))) {
          ++expect;
        }
      }
      if (static_cast<int>(members_.size()) < o.max_nodes) {
        for (const std::string& id : present) {
          if (std::find(members_.begin(), members_.end(), id) ==
              members_.end()) {
            ++expect;
          }
        }
      }
      target = std::clamp(expect, o.min_nodes, o.max_nodes);
    }
    const int restarts =
        restart_count_ + (reason == RoundReason::kFailure && round_ >= 0);

    while (true) {
      const std::string rp = round_prefix(r);
      const MemberRecord me = join_record(p_, node_id_, local_world_size,
                                          round_, group_rank_, restarts);
      // The watch on the round's "closed" key starts (from now) before the
      // join: one from the join's revision would wait for etcd's sync loop
      // (up to 100 ms, Client::watch) whenever other joins came in between.
      // Only that key is watched: with every joiner watching every join, a
      // round of N would send N*N events.
      std::optional<ActiveWatch> w;
      w.emplace(*this, watch_on(rp + "closed", "", 0));
      // Joining once the watch is on its way saves reading "closed" again
      // after it (below) in nearly every round; a watch still failing over
      // after kWatchSendWait is not waited for (the read covers it).
      (*w)->wait_sent(std::min(deadline, Clock::now() + kWatchSendWait));
      RoundState st;
      const int joined = join(r, me, guess, st);
      if (joined != r) {
        r = joined;  // a later round is the newest: join that one
        continue;
      }
      guess = false;
      const auto joined_at = Clock::now();
      bool watching = false;  // the watch covers what came after st.revision
      // When the last call ends; none (max) until min_nodes joined.
      constexpr auto kNone = Clock::time_point::max();
      auto call_ends = kNone;
      auto next_progress = joined_at + milliseconds(1000);
      while (!st.closed) {
        check_lease();
        const auto now = Clock::now();
        const int n = st.joined;
        if (n >= o.min_nodes && call_ends == kNone) {
          call_ends = now + o.last_call_timeout;
        }
        if (n < o.min_nodes) call_ends = kNone;
        if (n < target && now >= call_ends && last_round_pending(r)) {
          // A member slow to stop its workers (its --term-timeout) is
          // waited for, not left out; a dead one's record goes with its
          // lease. Looked at again each second.
          call_ends = now + kPendingLook;
        } else if (n >= target || now >= call_ends) {
          try_close(r, n >= target ? target : o.min_nodes, st);
          if (st.closed) continue;
          // Some left (wait for more), or one came since the read: it
          // closes the round, else this node tries again.
          if (st.joined < o.min_nodes) call_ends = kNone;
        }
        if (now >= next_progress) {
          // The joiners that came since, and the progress line.
          st.joined =
              static_cast<int>(client_->range(joiners(r, true)).count());
          st.fresh.clear();
          p_.log(waiting_line(
              st.joined, target, o,
              call_ends != kNone
                  ? std::chrono::duration_cast<milliseconds>(call_ends - now)
                  : milliseconds(-1)));
          next_progress = now + kProgressEvery;
          continue;
        }
        if (now >= deadline) {
          std::vector<std::pair<int64_t, std::string>> by_rev;
          const auto all = client_->range(joiners(r, false));
          for (const auto& kv : all.kvs()) {
            by_rev.emplace_back(kv.create_revision(),
                                MemberRecord::decode(kv.value(), 0).addr);
          }
          std::sort(by_rev.begin(), by_rev.end());
          std::vector<std::string> who;
          for (auto& [rev, addr] : by_rev) who.push_back(std::move(addr));
          throw RendezvousError(too_few_message(
              static_cast<int>(who.size()), r, p_.run_id,
              "etcd " + client_->endpoints_text(),
              std::chrono::duration_cast<milliseconds>(now - start), o, who));
        }
        st.fresh.clear();  // stale once time passes: joiners may leave
        auto until = std::min({deadline, next_progress, call_ends});
        if (!watching) {
          // Known once etcd took the watch; what came between the last
          // read and the watch's start is read again.
          const auto first = (*w)->first_revision(until);
          if (!first) continue;
          watching = true;
          if (*first > st.revision + 1) {
            etcdserverpb::RangeRequest closed;
            closed.set_key(rp + "closed");
            const auto now_closed = client_->range(closed);
            st.revision = now_closed.header().revision();
            st.take_closed(now_closed.kvs());
            continue;
          }
        }
        if (auto ev = (*w)->next(until);
            ev && ev->type() == mvccpb::Event::PUT) {
          st.take_closed(ev->kv());
        }
      }
      w.reset();

      // The read revision heads the value, then the members' records; an
      // empty value is no round of ours either.
      const std::vector<std::string> recs = split_list(st.records, kRecordSep);
      const int64_t read_rev =
          closed_read_revision(recs.empty() ? "" : recs[0]);
      std::vector<MemberRecord> ms;
      bool member = false;
      for (size_t k = 1; k < recs.size(); ++k) {
        ms.push_back(MemberRecord::decode(recs[k], static_cast<int>(k - 1)));
        member = member || ms.back().id == node_id_;
      }
      if (!member) {
        p_.log(late_line(r, static_cast<int>(ms.size()), o.max_nodes));
        if (!wait_next_round(r, deadline)) {
          throw RendezvousClosed("the job '" + p_.run_id +
                                 "' finished while this node waited to "
                                 "join; nothing to do");
        }
        ++r;
        target = o.max_nodes;
        continue;
      }
      members_.clear();
      for (const MemberRecord& m : ms) members_.push_back(m.id);
      RendezvousResult res = form_round(r, ms, node_id_, reason, false);
      ranked_ids_.clear();
      for (const MemberRecord& m : ms) ranked_ids_.push_back(m.id);
      member_addrs_ = res.members;
      if (round_ >= 0 && res.restart_count > restart_count_) {
        // A failure anywhere in the last round spends the restart on every
        // member, whatever each saw end that round.
        res.reason = RoundReason::kFailure;
        res.restart_cause = "a worker on another node failed";
        const std::string ev = round_prefix(round_) + "ev/";
        const auto evs = client_->range(prefix_range(ev));
        for (const auto& kv : evs.kvs()) {
          if (kv.value() == "failed") {
            res.restart_cause =
                "a worker on node " + kv.key().substr(ev.size()) + " failed";
          }
        }
      }
      round_ = r;
      group_rank_ = res.group_rank;
      restart_count_ = res.restart_count;
      // Nothing came between the closer's read and the close (the usual
      // case): the watch starts after the close, a revision etcd may not
      // have yet, which it serves at once rather than from its sync loop
      // (Client::watch).
      watch_from_ =
          st.closed_rev == read_rev + 1 ? st.closed_rev + 1 : read_rev + 1;
      reported_ = false;
      done_reported_ = false;
      {
        std::lock_guard lock(gone_mu_);
        gone_done_.clear();
        gone_done_ids_.clear();
      }
      p_.log(round_line(res));
      return res;
    }
  } catch (const EtcdError& e) {
    check_lease();
    throw RendezvousError(std::string("the etcd rendezvous of job '") +
                          p_.run_id + "' failed: " + e.what());
  }
}

RoundEvent EtcdRendezvous::wait_round_end() {
  const int r = round_;
  const std::string rp = round_prefix(r);
  const int max = p_.options.max_nodes;
  auto is_member = [this](const std::string& id) {
    return std::find(members_.begin(), members_.end(), id) != members_.end();
  };
  auto lost = [&](const std::string& id, bool left) {
    if (id == node_id_) return self_lost();
    return RoundEvent{RoundEvent::Kind::kNodeLost, r,
                      "node " + id + (left ? " left" : " is gone")};
  };
  auto joined = [&](const std::string& id) {
    return RoundEvent{RoundEvent::Kind::kNodeJoined, r,
                      "node " + id + " asks to join"};
  };
  const RoundEvent succeeded{RoundEvent::Kind::kSucceeded, r, ""};
  // Whether every member's "done" was there before `revision`: a member
  // gone once the set was complete (before it put "end") ends the round
  // as a success, as it would have with "end".
  auto all_done_before = [&](int64_t revision) {
    try {
      return client_->range(done_count(r, revision - 1)).count() +
                 gone_before(revision) >=
             static_cast<int64_t>(members_.size());
    } catch (const EtcdError&) {
      return false;  // compacted or unreachable: the node is lost
    }
  };
  // Whether every member is done now, those gone after their "done"
  // counted.
  auto all_done_now = [&] {
    try {
      const auto now = client_->range(done_count(r));
      return now.count() + gone_before(now.header().revision() + 1) >=
             static_cast<int64_t>(members_.size());
    } catch (const EtcdError&) {
      return false;
    }
  };
  // Every member was done when `id` went: the barrier ends here, and for
  // nodes that come late too.
  auto end_barrier = [&](const std::string& id) {
    p_.log("dlaunch: node " + id +
           " is gone after every node was done; the exit barrier is "
           "complete\n");
    try {
      put_end(r);
    } catch (const EtcdError& e) {
      p_.log(std::string("dlaunch: cannot mark the job finished for "
                         "nodes that come late: ") +
             e.what() + "\n");
    }
    return succeeded;
  };
  // Whether member `id` had put its "done" before `revision`: it finished
  // and leaves after its exit barrier, which must not end the round of
  // those still running (as the c10d backend).
  auto done_before = [&](const std::string& id, int64_t revision) {
    etcdserverpb::RangeRequest req;
    req.set_key(rp + "done/" + id);
    req.set_revision(revision - 1);
    req.set_count_only(true);
    try {
      return client_->range(req).count() > 0;
    } catch (const EtcdError&) {
      return false;  // compacted or unreachable: the node is lost
    }
  };
  // What one change of the round's keys means; nullopt: nothing yet.
  auto meaning = [&](const mvccpb::Event& ev) -> std::optional<RoundEvent> {
    const bool del = ev.type() == mvccpb::Event::DELETE;
    const std::string name = ev.kv().key().substr(rp.size());
    if (starts_with(name, "node/")) {
      const std::string id = name.substr(5);
      if (del && is_member(id)) {
        // This node's own "done" is one of the set: without it, the set
        // is not complete.
        if (done_reported_ && all_done_before(ev.kv().mod_revision())) {
          // It died between its "done" and the "end" it was to put.
          return end_barrier(id);
        }
        if (done_before(id, ev.kv().mod_revision())) {
          // Recorded before this node looks (report() reads it after its
          // own "done"): one of the two sees the set complete.
          {
            std::lock_guard lock(gone_mu_);
            gone_done_.push_back(ev.kv().mod_revision());
            gone_done_ids_.insert(id);
          }
          if (done_reported_ && all_done_now()) return end_barrier(id);
          return std::nullopt;
        }
        return lost(id, false);
      }
      if (!del && !is_member(id) && static_cast<int>(members_.size()) < max) {
        return joined(id);
      }
    } else if (starts_with(name, "ev/") && !del) {
      const std::string id = name.substr(3);
      if (id == node_id_) return std::nullopt;
      if (ev.kv().value() == "failed") {
        return RoundEvent{RoundEvent::Kind::kFailure, r,
                          "a worker on node " + id + " failed"};
      }
      if (ev.kv().value() == "left") return lost(id, true);
    } else if (name == "end" && !del) {
      return succeeded;
    }
    return std::nullopt;
  };
  // The members are the joiners the closer read, and no node joined
  // between that read and the close (its transaction checks), so the
  // watch from the revision after the read (after the close when nothing
  // came between, next_round) reports whatever changed since: a member
  // gone before the close too. It does not start from now: the order of
  // what came since matters (the "end" of a round comes before the first
  // member leaves, its keys vanishing with its lease), so a late watcher
  // takes etcd's sync delay (Client::watch) rather than a later state.
  // The "done" keys, which sort before "end", are not watched: N members
  // watching N of them would make N*N events at every job's end.
  Watch& stream = watch_on(rp + "end", prefix_end(rp), watch_from_);
  ActiveWatch w(*this, stream);
  // Once this returns, etcd stops sending the round's changes (the
  // members' keys vanish one by one as they leave); the stream stays for
  // the next round.
  struct PauseAtEnd {
    Watch& w;
    ~PauseAtEnd() { w.pause(); }
  } pause{stream};
  while (true) {
    auto ev = w->next(Clock::now() + std::chrono::hours(24));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (watcher_stop_)
        return RoundEvent{RoundEvent::Kind::kSucceeded, -1, ""};
    }
    if (lease_lost_) return lost(node_id_, false);
    if (!ev) continue;
    if (auto e = meaning(*ev)) return *e;
  }
}

void EtcdRendezvous::watch(EventCallback on_event) {
  stop_watcher();
  watcher_thread_ = std::thread([this, cb = std::move(on_event)] {
    RoundEvent ev;
    try {
      ev = wait_round_end();
    } catch (const EtcdError& e) {
      ev = RoundEvent{RoundEvent::Kind::kFatal, round_,
                      std::string("lost etcd: ") + e.what()};
    }
    if (lease_lost_) ev = self_lost();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (watcher_stop_ || stopping_) return;
    }
    cb(ev);
  });
}

void EtcdRendezvous::stop_watcher() {
  if (!watcher_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watcher_stop_ = true;
    if (active_) active_->interrupt();
  }
  watcher_thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  watcher_stop_ = false;
}

std::vector<std::string> EtcdRendezvous::unfinished_nodes() {
  if (round_ < 0) return {};
  const std::string done_prefix = round_prefix(round_) + "done/";
  std::set<std::string> done;
  try {
    etcdserverpb::RangeRequest req = prefix_range(done_prefix);
    req.set_keys_only(true);
    const auto resp = client_->range(req);
    for (const auto& kv : resp.kvs()) {
      done.insert(kv.key().substr(done_prefix.size()));
    }
  } catch (const EtcdError&) {
    return {};  // etcd unreachable: nobody to name
  }
  {
    std::lock_guard lock(gone_mu_);
    done.insert(gone_done_ids_.begin(), gone_done_ids_.end());
  }
  done.insert(node_id_);  // asked only once this node's workers succeeded
  return unfinished_members(ranked_ids_, member_addrs_, done);
}

void EtcdRendezvous::report(NodeOutcome outcome) {
  if (round_ < 0 || reported_) return;
  reported_ = true;
  const std::string rp = round_prefix(round_);
  auto put_ev = [&](const std::string& verb) {
    etcdserverpb::PutRequest put;
    put.set_key(rp + "ev/" + node_id_);
    put.set_value(verb);
    put.set_lease(lease_);
    client_->put(put);
  };
  try {
    switch (outcome) {
      case NodeOutcome::kSucceeded: {
        // The exit barrier: the node whose "done" completes the set puts
        // the round's "end" (put_end); should it die first, the others
        // put it once its lease expires (wait_round_end).
        done_reported_ = true;
        etcdserverpb::TxnRequest t;
        auto* put = t.add_success()->mutable_request_put();
        put->set_key(rp + "done/" + node_id_);
        put->set_lease(lease_);
        *t.add_success()->mutable_request_range() = done_count(round_);
        auto resp = client_->txn(t);
        // Members gone after the count's revision are in it still.
        if (resp.responses(1).response_range().count() +
                gone_before(resp.header().revision()) >=
            static_cast<int64_t>(members_.size())) {
          if (p_.before_end) p_.before_end();
          put_end(round_);
        }
        break;
      }
      case NodeOutcome::kFailed:
        put_ev("failed");
        break;
      case NodeOutcome::kLeaving:
        put_ev("left");
        break;
      case NodeOutcome::kGaveUp:
        // Every member gives up together; a node that comes later fails
        // at once instead of waiting for a place.
        client_->put(job_mark("gave_up"));
        break;
    }
  } catch (const EtcdError& e) {
    p_.log(std::string("dlaunch: cannot tell the other nodes: ") + e.what() +
           "\n");
  }
}

}  // namespace dlaunch::agent::rendezvous::etcd
