// Point to point over shared memory (ShmP2p): set-up and teardown, posting
// and matching, waiting (spin, sleep, the engine's thread) and failures.
// The ring protocol, a round of progress with one peer: shm_p2p_rings.cc.

#include "comm/gloo/shm_p2p.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <new>

#include "comm/gloo/shm_p2p_internal.h"
#include "comm/gloo/shm_sync.h"
#include "comm/say.h"

namespace dlaunch::comm::gloo {
namespace {

constexpr uint32_t kMagic = 0x444c5036;  // "DLP6": layout and wake-ups
constexpr size_t kSegHeaderBytes = 128;
// How soon the engine's thread retries a round that ran out of memory.
constexpr auto kAllocRetry = std::chrono::milliseconds(1);

// Room for one more element, growing geometrically: reserve(size() + 1)
// alone would reallocate on every push at a new high.
template <class T>
void reserve_one(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(8, 2 * v.size()));
}

// Removes and returns the first element of `v` that `pred` accepts (the
// order of the rest kept), or false.
template <class T, class P>
bool take_first(std::vector<T>& v, P&& pred, T& out) {
  auto it = std::find_if(v.begin(), v.end(), pred);
  if (it == v.end()) return false;
  out = *it;
  v.erase(it);
  return true;
}

std::string bytes_text(uint64_t n) { return std::to_string(n) + " bytes"; }

// What a failure says when its own words could not be allocated: short
// enough for std::string's inline buffer, so assigning it never allocates.
constexpr char kNoMemory[] = "out of memory";

// The string `make` builds, or kNoMemory when that runs out of memory.
template <class F>
std::string words(F&& make) noexcept {
  try {
    return make();
  } catch (const std::bad_alloc&) {
    return kNoMemory;
  }
}

void set_words(std::string& to, const std::string& from) noexcept {
  try {
    to = from;
  } catch (const std::bad_alloc&) {
    to = kNoMemory;
  }
}

constexpr size_t kSlotBytes =
    3 * 64 + (kCells + kControlRecords) * 64 + kRingBytes;

// Whether `op` and the other side's header agree; records the other side's
// size and dtype when not.
void compare(ShmP2p::Op& op, uint32_t dtype, uint64_t nbytes) {
  if (dtype != op.dtype || nbytes != op.nbytes) {
    op.mismatch = true;
    op.their_dtype = dtype;
    op.their_nbytes = nbytes;
  }
}

}  // namespace

ShmP2p::ShmP2p(const std::string& base, int rank, std::vector<int> local,
               std::chrono::milliseconds timeout, std::string& error)
    : base_(base), rank_(rank), timeout_(timeout), local_(std::move(local)) {
  static_assert(sizeof(Pair) == 3 * 64);
  static_assert(sizeof(Cell) == 64);
  static_assert(kSegHeaderBytes % 64 == 0);  // cells on lines of their own
  static_assert(sizeof(Seg) <= kSegHeaderBytes);
  static_assert(std::atomic<uint64_t>::is_always_lock_free);  // address-free
  const int ranks = local_.back() + 1;
  peer_index_.assign(static_cast<size_t>(ranks), -1);
  lost_ = std::make_unique<std::atomic<bool>[]>(ranks);
  for (int i = 0; i < ranks; ++i) lost_[i].store(false);
  segment_bytes_ = kSegHeaderBytes + (local_.size() - 1) * kSlotBytes;
  mine_ =
      ShmSegment::create(base + std::to_string(rank), segment_bytes_, error);
  if (!mine_.ok()) return;
  seg_ = new (mine_.data()) Seg{};
  seg_->cpu.store(-1);
  seg_->pid = static_cast<int32_t>(::getpid());
  seg_->pid_ns = pid_namespace();
  for (size_t k = 0; k + 1 < local_.size(); ++k) {
    auto* pair = new (mine_.data() + kSegHeaderBytes + k * kSlotBytes) Pair{};
    auto* cells = reinterpret_cast<char*>(pair + 1);
    for (uint64_t c = 0; c < kCells + kControlRecords; ++c) {
      new (cells + c * sizeof(Cell)) Cell{};
    }
  }
  seg_->magic = kMagic;
}

ShmP2p::~ShmP2p() {
  if (seg_) flush_control();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  detach_cv_.notify_all();
  if (seg_) {
    seg_->closed.store(1, std::memory_order_seq_cst);
    ring_self();  // the engine's thread, if asleep
    for (auto& p : peers_) ring(*p);
  }
  if (thread_.joinable()) thread_.join();
  for (auto& p : peers_) {
    if (p->pidfd >= 0) ::close(p->pidfd);
  }
}

bool ShmP2p::open_peers(std::string& error) {
  // Where rank `peer`'s slot lies in rank `owner`'s segment: its place
  // among the owner's local peers.
  auto slot = [&](int owner, int peer) -> char* {
    auto at = [&](int r) {
      return std::find(local_.begin(), local_.end(), r) - local_.begin();
    };
    const auto o = at(owner), q = at(peer);
    return reinterpret_cast<char*>(kSegHeaderBytes +
                                   (q < o ? q : q - 1) * kSlotBytes);
  };
  for (int j : local_) {
    if (j == rank_) continue;
    auto p = std::make_unique<Peer>();
    p->rank = j;
    p->seg = ShmSegment::open(base_ + std::to_string(j), segment_bytes_, error);
    if (!p->seg.ok()) return false;
    p->their = std::launder(reinterpret_cast<Seg*>(p->seg.data()));
    if (p->their->magic != kMagic) {
      error = "shared memory of rank " + std::to_string(j) +
              " has another layout (a different dlaunch build?)";
      return false;
    }
    const auto out_at = reinterpret_cast<uintptr_t>(slot(rank_, j));
    const auto in_at = reinterpret_cast<uintptr_t>(slot(j, rank_));
    p->out = std::launder(reinterpret_cast<Pair*>(mine_.data() + out_at));
    p->out_cells = reinterpret_cast<Cell*>(p->out + 1);
    p->out_ctl = p->out_cells + kCells;
    p->out_data = reinterpret_cast<char*>(p->out_ctl + kControlRecords);
    p->in = std::launder(reinterpret_cast<Pair*>(p->seg.data() + in_at));
    p->in_cells = reinterpret_cast<const Cell*>(p->in + 1);
    p->in_ctl = p->in_cells + kCells;
    p->in_data = reinterpret_cast<const char*>(p->in_ctl + kControlRecords);
    p->pidfd = watch_process(p->their->pid, p->their->pid_ns);
    p->busy.reset(static_cast<uint8_t*>(std::calloc(2 * kTagSlots, 1)));
    if (!p->busy) throw std::bad_alloc();
    peer_index_[j] = static_cast<int>(peers_.size());
    peers_.push_back(std::move(p));
  }
  taken_.assign(peers_.size() + 1, -1);
  return true;
}

bool ShmP2p::serves(int peer) const {
  return peer >= 0 && peer < static_cast<int>(peer_index_.size()) &&
         peer_index_[peer] >= 0;
}

ShmP2p::Peer* ShmP2p::peer_of(int rank) {
  return peers_[peer_index_[rank]].get();
}

bool ShmP2p::claim(bool is_send, int peer, int tag) {
  auto slot = peer_of(peer)->slot(is_send, tag);
  if (slot.load(std::memory_order_acquire) != 0) return false;
  slot.store(1, std::memory_order_relaxed);
  return true;
}

void ShmP2p::release(bool is_send, int peer, int tag) {
  peer_of(peer)->slot(is_send, tag).store(0, std::memory_order_release);
}

ShmP2p::Clock::time_point ShmP2p::after(Clock::time_point now,
                                        std::chrono::milliseconds d) {
  // Compared in milliseconds: milliseconds::max() in the clock's
  // nanoseconds would overflow.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::time_point::max() - now);
  return d >= room ? Clock::time_point::max() : now + d;
}

bool ShmP2p::post(Op& op, std::string& error) {
  std::lock_guard lock(mu_);
  publish_cpu(seg_->cpu);
  Peer& p = *peer_of(op.peer);
  if (p.dead) {
    error = p.why;
    return false;
  }
  // Registered in full or not at all (bad_alloc): a recv's header must
  // not go out without its op, nor an op stay listed whose post() threw.
  if (op.is_send) {
    reserve_one(p.unmatched);
    p.sends.push_back(&op);
    Rec r;
    if (take_first(
            p.early,
            [&](const Rec& e) {
              return e.tag == static_cast<uint32_t>(op.tag);
            },
            r)) {
      op.matched = true;
      compare(op, r.dtype, r.nbytes);
    } else {
      p.unmatched.push_back(&op);
    }
  } else {
    reserve_one(p.posted);
    p.ctl_out.push_back(
        Rec{static_cast<uint32_t>(op.tag), op.dtype, op.nbytes});
    Unexpected* u = nullptr;
    for (auto& e : p.unexpected) {
      if (!e->op && e->h.tag == static_cast<uint32_t>(op.tag)) {
        u = e.get();
        break;
      }
    }
    if (u) {
      u->op = &op;
      op.matched = true;
      compare(op, u->h.dtype, u->h.nbytes);
      if (u->complete) deliver(p, *u);
    } else {
      p.posted.push_back(&op);
    }
  }
  op.posted_bell = seg_->bell.load(std::memory_order_acquire);
  try {
    progress(p);  // small payloads and headers go at once
  } catch (const std::bad_alloc&) {
    return true;  // posted: a later round retries (see read_control)
  }
  if (!op.done.load(std::memory_order_relaxed)) {
    free_read(p);  // what this round read: a wait may spin at once
    watch(op.watch);
    op.fresh = true;
  }
  return true;
}

// Removes the first of `ops` waiting for the other side's header `r` (the
// same tag) and records the match; null when none waits for it.
ShmP2p::Op* ShmP2p::match(std::vector<Op*>& ops, const Rec& r) {
  Op* op = nullptr;
  if (!take_first(
          ops, [&](Op* o) { return o->tag == static_cast<int>(r.tag); }, op)) {
    return nullptr;
  }
  op->matched = true;
  compare(*op, r.dtype, r.nbytes);
  return op;
}

void ShmP2p::finish(Op& op) {
  if (op.detached) {
    detached_.erase(std::find(detached_.begin(), detached_.end(), &op));
  }
  op.done.store(true, std::memory_order_release);
  if (in_wait_ > 1) ring_self();
}

void ShmP2p::fail(Op& op, const std::string& why) noexcept {
  if (op.done.load(std::memory_order_relaxed)) return;
  set_words(op.failure, why);
  finish(op);
}

void ShmP2p::time_out(Op& op) noexcept {
  Peer& p = *peer_of(op.peer);
  std::string stage = words([&] { return stage_of(op); });
  // Its payload may be half way through the ring: the pair's stream can
  // no longer be parsed, so the pair goes, as a TCP pair does.
  const std::string why = words([&] {
    return std::string("an earlier ") + (op.is_send ? "send to" : "recv from") +
           " rank " + std::to_string(p.rank) + " (tag " +
           std::to_string(op.tag) + ") timed out; the pair is unusable";
  });
  op.timed_out = true;
  op.failure = std::move(stage);
  kill(p, why);
  finish(op);
}

void ShmP2p::kill(Peer& p, const std::string& why) noexcept {
  auto fail_all = [&](auto& ops) {
    for (Op* o : ops) {
      if (!o->timed_out) fail(*o, why);
    }
  };
  fail_all(p.sends);
  fail_all(p.unmatched);
  fail_all(p.posted);
  if (p.cur_op && !p.cur_op->timed_out) fail(*p.cur_op, why);
  for (auto& u : p.unexpected) {
    if (u->op && !u->op->timed_out) fail(*u->op, why);
  }
  p.sends.clear();
  p.unmatched.clear();
  p.posted.clear();
  p.unexpected.clear();
  p.ctl_out.clear();
  p.early.clear();
  p.cur_op = nullptr;
  p.cur_ux = nullptr;
  p.reading = false;
  p.in_avail = 0;
  if (!p.dead) {
    p.dead = true;
    p.out->broken.store(1, std::memory_order_seq_cst);
    ring(p);
    set_words(p.why, why);
  }
}

// Fails what peers that left can no longer complete. A peer writes
// everything it sends before it leaves, so one more round reads it first.
void ShmP2p::check_peers() {
  for (auto& pp : peers_) {
    Peer& p = *pp;
    if (p.dead) continue;
    const bool lost = lost_[p.rank].load(std::memory_order_acquire) ||
                      process_exited(p.pidfd);
    const bool left = p.their->closed.load(std::memory_order_seq_cst) != 0 ||
                      p.in->broken.load(std::memory_order_seq_cst) != 0;
    if (!lost && !left) continue;
    progress(p);  // may throw bad_alloc: a later round retries
    kill(p, words([&] {
           return "connection to rank " + std::to_string(p.rank) +
                  " lost (it exited, failed or destroyed the group)";
         }));
  }
}

void ShmP2p::expire(Clock::time_point now) noexcept {
  // time_out() removes the op from detached_ (and never throws): one at a
  // time, with no list of the late ones to allocate.
  for (;;) {
    auto late = std::find_if(detached_.begin(), detached_.end(),
                             [&](Op* o) { return o->deadline <= now; });
    if (late == detached_.end()) return;
    time_out(**late);
  }
}

void ShmP2p::watch(Watches& w) const {
  w.clear();
  for (const auto& pp : peers_) {
    const Peer& p = *pp;
    if (p.dead) continue;
    if (p.reading) {
      w.add(&p.in->data_head, p.in_tail + 1);
    } else if (!p.posted.empty()) {
      // Without a posted recv a new message would stay in the ring.
      w.add(&p.in_cells[p.in_cell % kCells].seq, p.in_cell + 1);
    }
    if (!p.unmatched.empty()) {
      w.add(&p.in_ctl[p.in_ctl_tail % kControlRecords].seq, p.in_ctl_tail + 1);
    }
  }
}

void ShmP2p::ring_self() {
  seg_->bell.fetch_add(1, std::memory_order_seq_cst);
  if (seg_->sleepers.load(std::memory_order_seq_cst) > 0) {
    futex_wake(&seg_->bell);
  }
}

void ShmP2p::flush_control() {
  const auto until = after(Clock::now(), timeout_);
  const Watches none{};  // the peer rings this rank when it frees cells
  std::unique_lock lock(mu_);
  try {
    for (;;) {
      const uint32_t seen = seg_->bell.load(std::memory_order_acquire);
      progress();
      check_peers();  // a peer that left or died takes its queue along
      free_reads();
      bool queued = false;
      for (const auto& p : peers_) {
        if (!p->dead && !p->ctl_out.empty()) queued = true;
      }
      if (!queued) return;
      if (Clock::now() >= until) {
        // The peers' sends to this rank fail as "connection lost" when
        // they see it go: say why here.
        for (const auto& p : peers_) {
          if (p->dead || p->ctl_out.empty()) continue;
          say("rank " + std::to_string(rank_) + " leaves its group with " +
              std::to_string(p->ctl_out.size()) + " recv header(s) for rank " +
              std::to_string(p->rank) + " unwritten: rank " +
              std::to_string(p->rank) +
              " did not make room in this rank's control ring (recv "
              "headers) within " +
              std::to_string(timeout_.count()) +
              " ms (the group timeout); its sends matching those recvs "
              "fail. Have every rank finish its point-to-point operations "
              "before destroying the group");
        }
        return;
      }
      lock.unlock();
      sleep_until_rung(seen, none, until);
      lock.lock();
    }
  } catch (const std::bad_alloc&) {
    // Leaving without them: the peer's sends fail when it sees this rank go.
  }
}

void ShmP2p::sleep_until_rung(uint32_t seen, const Watches& w,
                              Clock::time_point until) {
  const auto now = Clock::now();
  if (now >= until) return;
  seg_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // see notify()
  if (seg_->bell.load(std::memory_order_seq_cst) == seen && !w.ready()) {
    futex_wait(&seg_->bell, seen,
               std::min<std::chrono::nanoseconds>(until - now, kLivenessSlice));
  }
  seg_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmP2p::move_if_shared(int peer) {
  // `peer` published its CPU before the post that ended the wait.
  const int cpu = current_cpu();
  if (cpu < 0 ||
      peer_of(peer)->their->cpu.load(std::memory_order_relaxed) != cpu ||
      !cpu_move_due()) {
    return;
  }
  if (taken_.size() != peers_.size() + 1) return;  // open_peers() failed
  taken_[0] = cpu;
  for (size_t i = 0; i < peers_.size(); ++i) {
    taken_[i + 1] = peers_[i]->their->cpu.load(std::memory_order_relaxed);
  }
  move_off_cpu(cpu, taken_, seg_->cpu);
}

bool ShmP2p::wait(Op& op, std::chrono::milliseconds timeout,
                  std::chrono::milliseconds deadline_in) {
  // Counted in in_wait_ (under mu_, as every return is) from its first
  // round on.
  bool counted = false;
  bool waited = false;  // spun or slept
  auto leave = [&](bool done) {
    if (counted) {
      counted = false;
      --in_wait_;
    }
    // Only after the peer's post completed the op: a timeout or a failure
    // has no fresh evidence of where the peer runs.
    if (waited && done && rank_ > op.peer &&
        op.done.load(std::memory_order_relaxed) && !op.timed_out &&
        op.failure.empty()) {
      move_if_shared(op.peer);
    }
    return done;
  };
  SpinWait spin;
  bool spinning = true;
  const std::atomic<int32_t>& peer_cpu = peer_of(op.peer)->their->cpu;
  // What the spin and the sleep watch, built at the end of each round: a
  // word reaching its mark, or the bell moving from what it was before the
  // round, means something came.
  Watches local;
  Clock::time_point until;  // set at the first look at the clock
  bool timed = false;
  // An op's first whole wait skips its first round: post() ran one. (A
  // shorter wait runs it: its time starts at once.)
  bool posted = op.fresh && deadline_in.count() > 0;
  op.fresh = false;
  for (;;) {
    uint32_t seen = seg_->bell.load(std::memory_order_acquire);
    const int cpu = publish_cpu(seg_->cpu);
    auto deadline = Clock::time_point::max();
    const Watches* w = &local;
    if (posted) {
      posted = false;
      seen = op.posted_bell;
      w = &op.watch;
    } else {
      std::lock_guard lock(mu_);
      if (op.done.load(std::memory_order_relaxed)) return leave(true);
      if (!counted) {
        counted = true;
        ++in_wait_;
      }
      // A round that runs out of memory (setting an early payload aside)
      // throws after the deadline's check and a look at the peers, so
      // that a wait retried until done (~ShmCall) still ends at
      // op.deadline, or when the awaited peer is lost.
      std::exception_ptr starved;
      try {
        if (progress(&op)) {
          spin.reset();
          spinning = true;
        }
      } catch (...) {
        starved = std::current_exception();
      }
      if (op.done.load(std::memory_order_relaxed)) return leave(true);
      const auto now = Clock::now();
      if (!timed) {
        timed = true;
        until = after(now, timeout);
        if (deadline_in.count() > 0 &&
            op.deadline == Clock::time_point::max()) {
          op.deadline = after(now, deadline_in);
        }
      }
      if (now >= op.deadline) {
        time_out(op);
        return leave(true);
      }
      if (!spinning || starved) {
        try {
          check_peers();
        } catch (...) {
          if (!starved) starved = std::current_exception();
        }
        if (op.done.load(std::memory_order_relaxed)) return leave(true);
      }
      if (starved) {
        leave(false);
        std::rethrow_exception(starved);
      }
      if (now >= until) return leave(false);
      // Space read in this round, freed now that this thread will wait
      // (not before a reply was written: see free_read).
      free_reads();
      watch(local);
      deadline = op.deadline;
    }
    waited = true;
    if (spinning) {
      // op.done too: a thread of the engine may finish it (without a new
      // message: one that came before post()'s look).
      while (
          !op.done.load(std::memory_order_acquire) &&
          seg_->bell.load(std::memory_order_acquire) == seen && !w->ready() &&
          (spinning = spin.once(
               cpu >= 0 && peer_cpu.load(std::memory_order_relaxed) == cpu))) {
      }
      continue;
    }
    sleep_until_rung(seen, *w, std::min(until, deadline));
  }
}

bool ShmP2p::test(Op& op) {
  std::lock_guard lock(mu_);
  if (!op.done.load(std::memory_order_relaxed)) progress();
  return op.done.load(std::memory_order_relaxed);
}

void ShmP2p::arm(Op& op, Clock::time_point deadline) {
  std::lock_guard lock(mu_);
  if (op.deadline == Clock::time_point::max()) op.deadline = deadline;
}

void ShmP2p::detach(Op& op) {
  std::lock_guard lock(mu_);
  if (op.done.load(std::memory_order_relaxed) || op.detached) return;
  op.detached = true;
  detached_.push_back(&op);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  detach_cv_.notify_all();
}

// The engine's thread: drives detached operations while nobody waits for
// them, and fails them at their deadline.
// A round that runs out of memory (setting an early payload aside) is
// retried kAllocRetry later; deadlines fail ops meanwhile.
void ShmP2p::loop() {
  ::pthread_setname_np(::pthread_self(), "dl-shm-p2p");
  std::unique_lock lock(mu_);
  ++in_wait_;
  Watches w;
  while (!stop_) {
    if (detached_.empty()) {
      detach_cv_.wait(lock);
      continue;
    }
    const uint32_t seen = seg_->bell.load(std::memory_order_acquire);
    bool starved = false;  // bad_alloc, most likely: nothing may escape
    try {
      progress();
    } catch (...) {
      starved = true;
    }
    expire(Clock::now());
    try {
      check_peers();
    } catch (...) {
      starved = true;
    }
    free_reads();
    if (detached_.empty()) continue;
    auto next = Clock::time_point::max();
    if (starved) {
      // The unread cell that could not be set aside is still there: a
      // watch would wake at once.
      w.clear();
      next = Clock::now() + kAllocRetry;
    } else {
      watch(w);
    }
    for (Op* o : detached_) next = std::min(next, o->deadline);
    lock.unlock();
    sleep_until_rung(seen, w, next);
    lock.lock();
  }
  --in_wait_;
}

std::string ShmP2p::stage(const Op& op) {
  std::lock_guard lock(mu_);
  return stage_of(op);
}

std::string ShmP2p::stage_of(const Op& op) const {
  if (!op.matched) {
    return op.is_send
               ? std::string("no matching recv posted there yet") +
                     (op.written ? " (the payload is in shared memory)" : "")
               : "no matching send posted there yet";
  }
  const uint64_t total = op.mismatch ? op.their_nbytes : op.nbytes;
  return "payload of " + bytes_text(total) + " in transfer (" +
         std::to_string(op.moved) + (op.is_send ? " written)" : " read)");
}

void ShmP2p::peers_lost(const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (r >= 0 && r < static_cast<int>(peer_index_.size())) {
      lost_[r].store(true, std::memory_order_release);
    }
  }
  if (seg_) ring_self();
}

void ShmP2p::close(const std::string& why) {
  std::lock_guard lock(mu_);
  const std::string failed = words([&] { return "the group failed: " + why; });
  for (auto& p : peers_) kill(*p, failed);
  if (seg_) seg_->closed.store(1, std::memory_order_seq_cst);
  for (auto& p : peers_) ring(*p);
}

}  // namespace dlaunch::comm::gloo
