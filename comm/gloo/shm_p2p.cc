#include "comm/gloo/shm_p2p.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "comm/gloo/shm_sync.h"
#include "comm/say.h"

namespace dlaunch::comm::gloo {
namespace {

// A pair's payload ring: big enough that a sender streams while its
// receiver copies out, small enough to stay in the cache (each rank holds
// one per local peer).
constexpr uint64_t kRingBytes = 256 << 10;
// Send headers a pair's ring of header cells holds before the receiver
// reads them, and recv headers its control ring holds.
constexpr uint64_t kCells = 512;
constexpr uint64_t kControlRecords = 256;
// Payloads up to this size travel inside their header cell.
constexpr uint64_t kInlineBytes = 40;
// A sender publishes (and a receiver frees) ring space in steps of at most
// this, so that the other side starts while the rest is copied.
constexpr uint64_t kStepBytes = 64 << 10;
// In-flight slots per peer and direction: tags are 0..65535 (kMaxTag,
// checked before claim()).
constexpr size_t kTagSlots = size_t{1} << 16;
constexpr uint32_t kMagic = 0x444c5036;  // "DLP6": layout and wake-ups
constexpr size_t kSegHeaderBytes = 128;

void ring_put(char* ring, uint64_t pos, const void* src, uint64_t n) {
  const uint64_t off = pos & (kRingBytes - 1);
  const uint64_t first = std::min(n, kRingBytes - off);
  std::memcpy(ring + off, src, first);
  if (n > first) {
    std::memcpy(ring, static_cast<const char*>(src) + first, n - first);
  }
}

void ring_get(const char* ring, uint64_t pos, void* dst, uint64_t n) {
  const uint64_t off = pos & (kRingBytes - 1);
  const uint64_t first = std::min(n, kRingBytes - off);
  std::memcpy(dst, ring + off, first);
  if (n > first) {
    std::memcpy(static_cast<char*>(dst) + first, ring, n - first);
  }
}

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

}  // namespace

// The start of every rank's segment.
struct ShmP2p::Seg {
  uint32_t magic;
  int32_t pid;                   // the owner's process
  uint64_t pid_ns;               // ... in this pid namespace
  std::atomic<uint32_t> closed;  // 1 once the owner has left
  std::atomic<int32_t> cpu;      // where the owner last posted or waited
  // The owner's futex word. Rung (incremented) by a peer after it wrote
  // something the owner reads while the owner has sleepers (notify()),
  // and after it freed space the owner writes or failed (ring()).
  alignas(64) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleepers;  // owner threads asleep on `bell`
};

// The counters of one direction, owner -> peer, in the owner's segment;
// its header cells, control cells and payload ring follow. The owner's
// and the peer's counters lie on cache lines of their own.
struct ShmP2p::Pair {
  // Payload bytes streamed (owner); whole payloads publish through their
  // header cell instead, so it may lag behind them.
  alignas(64) std::atomic<uint64_t> data_head;
  alignas(64) std::atomic<uint64_t> data_tail;  // payload bytes read (peer)
  std::atomic<uint64_t> cell_tail;              // header cells read (peer)
  std::atomic<uint64_t> ctl_tail;               // control cells read (peer)
  // Set by the owner when a ring is full; the peer clears it and rings the
  // owner's bell when it frees space.
  alignas(64) std::atomic<uint32_t> want_space;
  std::atomic<uint32_t> broken;  // the owner gave up on the pair
};

// One cache line: a send's header in the ring of header cells (its payload
// inside when it fits, else in the payload ring), or a recv's header in the
// control ring. The writer stores `seq` last (release): the cell's number
// in its ring's life + 1. A reader polls the one word of the line that
// brings the message (a counter elsewhere cost it a second line), and a
// cell's stale content is an older cell's, whose seq is lower.
struct alignas(64) ShmP2p::Cell {
  uint32_t tag;
  uint16_t dtype;
  uint16_t flags;  // kWhole
  uint64_t nbytes;
  char data[kInlineBytes];
  std::atomic<uint64_t> seq;
};

namespace {
// The payload (larger than kInlineBytes) is in the payload ring, written
// before the header cell: no need to watch data_head for it.
constexpr uint16_t kWhole = 1;
}  // namespace

// A send's or recv's header, as the engine keeps it.
struct ShmP2p::Rec {
  uint32_t tag = 0;
  uint32_t dtype = 0;
  uint64_t nbytes = 0;
};

// A payload that arrived before its recv, copied aside because a recv with
// another tag waited behind it in the ring.
struct ShmP2p::Unexpected {
  Rec h;
  std::vector<char> data;
  bool complete = false;
  Op* op = nullptr;  // the recv it matched, if any yet
};

// This rank's view of one local peer (under the engine's mutex).
struct ShmP2p::Peer {
  int rank = 0;
  int pidfd = -1;
  ShmSegment seg;  // the peer's segment, mapped here
  Seg* their = nullptr;
  Pair* out = nullptr;  // this rank -> peer, in this rank's segment
  Cell* out_cells = nullptr;
  Cell* out_ctl = nullptr;
  char* out_data = nullptr;
  Pair* in = nullptr;  // peer -> this rank, in the peer's segment
  const Cell* in_cells = nullptr;
  const Cell* in_ctl = nullptr;
  const char* in_data = nullptr;

  // This side's counters, and what it last saw of the other side's.
  uint64_t out_head = 0, out_published = 0, out_tail = 0;
  uint64_t cell_head = 0, cell_tail = 0;
  uint64_t ctl_head = 0, ctl_tail = 0;
  uint64_t in_tail = 0, in_published = 0;
  uint64_t in_cell = 0, in_cell_published = 0;
  uint64_t in_ctl_tail = 0, in_ctl_published = 0;
  // Cells written in this round: the peer's sleepers are looked at once, at
  // its end (settle()), after the fence the round takes anyway.
  bool notify_due = false;

  std::deque<Op*> sends;       // not fully written yet, in post order
  bool front_started = false;  // sends.front()'s header is written
  std::deque<Rec> ctl_out;     // recv headers not written yet
  std::vector<Op*> unmatched;  // sends without their recv's header
  std::vector<Rec> early;      // recv headers that came before their send
  std::vector<Op*> posted;     // recvs without their send's header
  std::deque<std::unique_ptr<Unexpected>> unexpected;

  // The payload being read (from the payload ring): into cur_op's buffer
  // (dropped on a mismatch) or cur_ux's; in_avail of its bytes are known
  // to be there.
  bool reading = false;
  Rec cur;
  uint64_t got = 0;
  uint64_t in_avail = 0;
  Op* cur_op = nullptr;
  Unexpected* cur_ux = nullptr;

  // Tails stored by a round without a fence (progress()): a sender that
  // asked for space meanwhile is answered at the next fence.
  bool unanswered = false;
  bool dead = false;
  std::string why;  // set with dead

  // In-flight (direction, tag) slots, 1 while an operation holds one:
  // [0, kTagSlots) sends, then recvs. Bytes, so that a release from one
  // thread never rewrites a slot the poster sets; calloc'd, so that only
  // the pages of used tags are touched. Accessed through std::atomic_ref,
  // outside the engine's mutex.
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t[], Free> busy;
  std::atomic_ref<uint8_t> slot(bool is_send, int tag) {
    return std::atomic_ref<uint8_t>(
        busy[(is_send ? 0 : kTagSlots) + static_cast<size_t>(tag)]);
  }
};

namespace {

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

bool ShmP2p::progress(const Op* mine) {
  bool any = false;
  for (auto& p : peers_) {
    if (!p->dead && progress(*p, mine)) any = true;
    if (mine && mine->done.load(std::memory_order_relaxed)) break;
  }
  return any;
}

bool ShmP2p::progress(Peer& p, const Op* mine) {
  // Writes first: a send's payload goes out before this rank stalls on
  // the lines the peer is writing (the order matches nothing: a send is
  // written whether or not its recv's header came). The space earlier
  // rounds read is published just before them (plain stores), and one
  // fence at the end of the round (settle) serves both Dekkers: the reads
  // below wait for the peer's lines while the writes drain, where a fence
  // right after the writes stalled until the peer gave up the polled line.
  // A round with nothing to write publishes space only once a quarter of a
  // ring waits (else free_read() does before this rank waits): a fence of
  // its own delayed the reply to each small message.
  const bool writes = !p.sends.empty() || !p.ctl_out.empty();
  bool freed = (writes || p.in_tail - p.in_published >= kRingBytes / 4 ||
                p.in_cell - p.in_cell_published >= kCells / 4 ||
                p.in_ctl_tail - p.in_ctl_published >= kControlRecords / 4) &&
               store_tails(p);
  bool any = write_control(p);
  if (write_data(p)) any = true;
  // The peer's lines are looked at only for an op that waits on them: a
  // message with no recv posted would stay in the ring, a recv header with
  // no send waiting only moves to `early` (read with the next send), and a
  // waiter whose op just completed returns first. A look at a line the peer
  // has not written yet is a miss, and the round's fence or unlock waits
  // for it.
  bool read = false;
  try {
    if (!p.posted.empty() || p.reading) read = read_data(p, mine);
    if (!p.unmatched.empty() &&
        (!mine || !mine->done.load(std::memory_order_relaxed))) {
      if (read_control(p)) read = true;
    }
  } catch (...) {  // bad_alloc copying a payload aside: ring what was written
    settle(p, freed);
    throw;
  }
  // A waiter whose op this round completed returns without free_reads(),
  // and may next wait elsewhere (a collective) while the peer waits for
  // the space it read: it is published now (plain stores; a sender that
  // asks for space after this look still sees them at its next look, and
  // is answered at the next fence: `unanswered`), and given back at once,
  // fenced and rung, to a sender that already asks.
  if (read && store_tails(p) && !freed) {
    p.unanswered = true;
    freed = p.in->want_space.load(std::memory_order_relaxed) != 0;
  }
  settle(p, freed);
  return any || read;
}

void ShmP2p::settle(Peer& p, bool freed) {
  if (!p.notify_due && !freed) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (p.notify_due) {
    p.notify_due = false;
    if (p.their->sleepers.load(std::memory_order_relaxed) > 0) {
      p.their->bell.fetch_add(1, std::memory_order_seq_cst);
      futex_wake(&p.their->bell);
    }
  }
  if (freed || p.unanswered) {
    p.unanswered = false;
    answer_want(p);
  }
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

bool ShmP2p::read_control(Peer& p) {
  bool any = false;
  for (;;) {
    const Cell& c = p.in_ctl[p.in_ctl_tail % kControlRecords];
    if (c.seq.load(std::memory_order_acquire) != p.in_ctl_tail + 1) break;
    const Rec r{c.tag, c.dtype, c.nbytes};
    if (Op* s = match(p.unmatched, r)) {
      if (s->written) finish(*s);
    } else {
      p.early.push_back(r);  // on bad_alloc, read again in a later round
    }
    ++p.in_ctl_tail;
    any = true;
  }
  return any;  // the cells are published at the round's end (progress())
}

// Publishes the ring space this rank has read since the last call (or
// that a round published unfenced), and rings the owner if it waits for
// space. Its fence is deferred from the reads (to the next round's
// writes, whose fence serves it, or to before a wait) because it would
// otherwise stand between a small payload's arrival and the reply.
void ShmP2p::free_read(Peer& p) {
  if (!store_tails(p) && !p.unanswered) return;
  p.unanswered = false;
  // Dekker against the owner's want_space (see write_data, write_control):
  // one fence between both tails and the flag (a seq_cst store each was two).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  answer_want(p);
}

void ShmP2p::free_reads() {
  for (auto& p : peers_) {
    if (!p->dead) free_read(*p);
  }
}

bool ShmP2p::store_tails(Peer& p) {
  if (p.in_tail == p.in_published && p.in_cell == p.in_cell_published &&
      p.in_ctl_tail == p.in_ctl_published) {
    return false;
  }
  if (p.in_tail != p.in_published) {
    p.in->data_tail.store(p.in_tail, std::memory_order_release);
    p.in_published = p.in_tail;
  }
  if (p.in_cell != p.in_cell_published) {
    p.in->cell_tail.store(p.in_cell, std::memory_order_release);
    p.in_cell_published = p.in_cell;
  }
  if (p.in_ctl_tail != p.in_ctl_published) {
    p.in->ctl_tail.store(p.in_ctl_tail, std::memory_order_release);
    p.in_ctl_published = p.in_ctl_tail;
  }
  return true;
}

void ShmP2p::answer_want(Peer& p) {
  if (p.in->want_space.load(std::memory_order_seq_cst) != 0 &&
      p.in->want_space.exchange(0) != 0) {
    ring(p);
  }
}

bool ShmP2p::write_control(Peer& p) {
  if (p.ctl_out.empty()) return false;
  bool wrote = false;
  while (!p.ctl_out.empty()) {
    if (p.ctl_head - p.ctl_tail >= kControlRecords) {
      p.ctl_tail = p.out->ctl_tail.load(std::memory_order_acquire);
      if (p.ctl_head - p.ctl_tail >= kControlRecords) {
        // Full: ask to be rung, then look once more (the reader stores its
        // tail before it reads the flag; seq_cst on both sides).
        p.out->want_space.store(1, std::memory_order_seq_cst);
        p.ctl_tail = p.out->ctl_tail.load(std::memory_order_seq_cst);
        if (p.ctl_head - p.ctl_tail >= kControlRecords) break;
      }
    }
    const Rec& r = p.ctl_out.front();
    Cell& c = p.out_ctl[p.ctl_head % kControlRecords];
    c.tag = r.tag;
    c.dtype = static_cast<uint16_t>(r.dtype);
    c.flags = 0;
    c.nbytes = r.nbytes;
    c.seq.store(p.ctl_head + 1, std::memory_order_release);
    ++p.ctl_head;
    p.ctl_out.pop_front();
    wrote = true;
  }
  if (wrote) p.notify_due = true;
  return wrote;
}

bool ShmP2p::cell_space(Peer& p) {
  if (p.cell_head - p.cell_tail < kCells) return true;
  p.cell_tail = p.out->cell_tail.load(std::memory_order_acquire);
  if (p.cell_head - p.cell_tail < kCells) return true;
  // Full: ask to be rung, then look once more (see write_control).
  p.out->want_space.store(1, std::memory_order_seq_cst);
  p.cell_tail = p.out->cell_tail.load(std::memory_order_seq_cst);
  return p.cell_head - p.cell_tail < kCells;
}

uint64_t ShmP2p::data_space(Peer& p, uint64_t want) {
  uint64_t space = kRingBytes - (p.out_head - p.out_tail);
  if (space < want) {
    p.out_tail = p.out->data_tail.load(std::memory_order_acquire);
    space = kRingBytes - (p.out_head - p.out_tail);
  }
  return space;
}

bool ShmP2p::write_data(Peer& p) {
  bool any = false;
  auto publish = [&] {
    if (p.out_head != p.out_published) {
      p.out->data_head.store(p.out_head, std::memory_order_release);
      p.out_published = p.out_head;
      notify(p);
    }
  };
  while (!p.sends.empty()) {
    Op& s = *p.sends.front();
    if (!p.front_started) {
      if (!cell_space(p)) break;
      // Inline, whole (written before its header, so that the receiver
      // needs no other line to know it is there) or streamed behind it.
      const bool small = s.nbytes <= kInlineBytes;
      bool whole = false;
      if (!small) {
        // The payload starts at the source's offset within a cache line
        // (when there is room for the pad): memcpy runs slower between
        // buffers whose offsets differ (a 64 MiB ping-pong took 5-8% longer
        // from a malloc'd buffer, 16 bytes into its line, into line
        // starts). Its receiver's buffer most often has the same offset.
        const uint64_t pad =
            (reinterpret_cast<uintptr_t>(s.data) - p.out_head) & 63;
        const uint64_t space = data_space(p, pad + s.nbytes);
        const uint64_t skip = space > pad ? pad : 0;
        whole = s.nbytes <= kStepBytes && space >= skip + s.nbytes;
        p.out_head += skip;
      }
      if (whole) {
        ring_put(p.out_data, p.out_head, s.data, s.nbytes);
        p.out_head += s.nbytes;
        s.moved = s.nbytes;
      }
      Cell& c = p.out_cells[p.cell_head % kCells];
      c.tag = static_cast<uint32_t>(s.tag);
      c.dtype = static_cast<uint16_t>(s.dtype);
      c.flags = whole ? kWhole : 0;
      c.nbytes = s.nbytes;
      if (small) {
        if (s.nbytes > 0) std::memcpy(c.data, s.data, s.nbytes);
        s.moved = s.nbytes;
      } else {  // where its payload starts in the ring
        const uint64_t start = p.out_head - (whole ? s.nbytes : 0);
        std::memcpy(c.data, &start, sizeof(start));
      }
      c.seq.store(p.cell_head + 1, std::memory_order_release);
      ++p.cell_head;
      p.notify_due = true;
      p.front_started = true;
      any = true;
    }
    while (s.moved < s.nbytes) {
      uint64_t space = data_space(p, s.nbytes - s.moved);
      if (space == 0) {
        publish();  // what is there, before this rank waits for room
        p.out->want_space.store(1, std::memory_order_seq_cst);
        p.out_tail = p.out->data_tail.load(std::memory_order_seq_cst);
        space = kRingBytes - (p.out_head - p.out_tail);
        if (space == 0) break;
      }
      const uint64_t n = std::min({space, s.nbytes - s.moved, kStepBytes});
      ring_put(p.out_data, p.out_head, s.data + s.moved, n);
      p.out_head += n;
      s.moved += n;
      any = true;
      publish();  // the receiver may start (whole payloads need not)
    }
    if (s.moved < s.nbytes) break;  // rung when the receiver frees room
    p.sends.pop_front();
    p.front_started = false;
    s.written = true;
    if (s.matched) finish(s);
  }
  return any;
}

bool ShmP2p::read_data(Peer& p, const Op* mine) {
  bool any = false;
  while (!mine || !mine->done.load(std::memory_order_relaxed)) {
    if (!p.reading) {
      const Cell& c = p.in_cells[p.in_cell % kCells];
      if (c.seq.load(std::memory_order_acquire) != p.in_cell + 1) break;
      const Rec r{c.tag, c.dtype, c.nbytes};
      Unexpected* u = nullptr;
      Op* op = match(p.posted, r);
      if (!op && p.posted.empty()) {
        break;  // nobody waits behind it: it stays in the ring
      }
      if (!op) {
        auto e = std::make_unique<Unexpected>();
        e->h = r;
        e->data.resize(r.nbytes);
        u = e.get();
        p.unexpected.push_back(std::move(e));
      }
      p.cur = r;
      p.got = 0;
      p.cur_op = op;
      p.cur_ux = u;
      any = true;
      if (r.nbytes <= kInlineBytes) {
        char* dst = u ? u->data.data() : op->mismatch ? nullptr : op->data;
        if (dst && r.nbytes > 0) std::memcpy(dst, c.data, r.nbytes);
        p.got = r.nbytes;
        if (op) op->moved = p.got;
      } else {
        std::memcpy(&p.in_tail, c.data, sizeof(p.in_tail));  // past the pad
        p.reading = true;
        p.in_avail = (c.flags & kWhole) ? r.nbytes : 0;
      }
      ++p.in_cell;  // read; published at the round's end (progress())
    }
    while (p.got < p.cur.nbytes) {
      if (p.in_avail == 0) {
        // A streamed payload: its head, which may be behind this one's
        // start (until the sender publishes its first chunk after the
        // cell) and behind whole payloads before it: hence `<=`.
        const uint64_t head = p.in->data_head.load(std::memory_order_acquire);
        if (head <= p.in_tail) break;
        p.in_avail = head - p.in_tail;
      }
      const uint64_t n =
          std::min({p.in_avail, p.cur.nbytes - p.got, kStepBytes});
      char* dst = p.cur_ux             ? p.cur_ux->data.data() + p.got
                  : p.cur_op->mismatch ? nullptr
                                       : p.cur_op->data + p.got;
      if (dst) ring_get(p.in_data, p.in_tail, dst, n);
      p.in_tail += n;
      p.in_avail -= n;
      p.got += n;
      if (p.cur_op) p.cur_op->moved = p.got;
      any = true;
      // The sender may wait for this space to stream the rest.
      if (p.got < p.cur.nbytes) free_read(p);
    }
    if (p.got < p.cur.nbytes) break;
    p.reading = false;
    p.in_avail = 0;
    if (p.cur_op) {
      finish(*p.cur_op);
    } else {
      p.cur_ux->complete = true;
      if (p.cur_ux->op) deliver(p, *p.cur_ux);
    }
    p.cur_op = nullptr;
    p.cur_ux = nullptr;
  }
  return any;  // the space is published at the round's end (progress())
}

// Copies a complete early payload into the recv it matched, and forgets it.
void ShmP2p::deliver(Peer& p, Unexpected& u) {
  Op& op = *u.op;
  if (!op.mismatch && op.nbytes > 0) {
    std::memcpy(op.data, u.data.data(), op.nbytes);
  }
  op.moved = u.h.nbytes;
  finish(op);
  auto it = std::find_if(p.unexpected.begin(), p.unexpected.end(),
                         [&](const auto& e) { return e.get() == &u; });
  p.unexpected.erase(it);
}

void ShmP2p::finish(Op& op) {
  if (op.detached) {
    detached_.erase(std::find(detached_.begin(), detached_.end(), &op));
  }
  op.done.store(true, std::memory_order_release);
  if (in_wait_ > 1) ring_self();
}

void ShmP2p::fail(Op& op, const std::string& why) {
  if (op.done.load(std::memory_order_relaxed)) return;
  op.failure = why;
  finish(op);
}

void ShmP2p::time_out(Op& op) {
  Peer& p = *peer_of(op.peer);
  op.timed_out = true;
  op.failure = stage_of(op);
  // Its payload may be half way through the ring: the pair's stream can
  // no longer be parsed, so the pair goes, as a TCP pair does.
  kill(p, std::string("an earlier ") + (op.is_send ? "send to" : "recv from") +
              " rank " + std::to_string(p.rank) + " (tag " +
              std::to_string(op.tag) + ") timed out; the pair is unusable");
  finish(op);
}

void ShmP2p::kill(Peer& p, const std::string& why) {
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
    p.why = why;
    p.out->broken.store(1, std::memory_order_seq_cst);
    ring(p);
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
    progress(p);
    kill(p, "connection to rank " + std::to_string(p.rank) +
                " lost (it exited, failed or destroyed the group)");
  }
}

void ShmP2p::expire(Clock::time_point now) {
  std::vector<Op*> late;
  for (Op* o : detached_) {
    if (o->deadline <= now) late.push_back(o);
  }
  for (Op* o : late) {
    if (!o->done.load(std::memory_order_relaxed)) time_out(*o);
  }
}

void ShmP2p::ring(Peer& p) {
  p.their->bell.fetch_add(1, std::memory_order_seq_cst);
  if (p.their->sleepers.load(std::memory_order_seq_cst) > 0) {
    futex_wake(&p.their->bell);
  }
}

// The peer's waiters poll what they expect next (watch()) while they spin;
// only a sleeping one needs its bell rung. Dekker with sleep_until_rung:
// either its look at the watched words after it counted itself a sleeper
// sees this write, or this look sees the sleeper. A bell rung on every
// message cost a locked write to a line the peer polls, and the peer a
// third cache miss (bell, head, ring) before it saw a small payload.
// Cells defer this to settle(), at the end of the round.
void ShmP2p::notify(Peer& p) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (p.their->sleepers.load(std::memory_order_relaxed) > 0) {
    p.their->bell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&p.their->bell);
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
  std::vector<int> taken{cpu};
  for (const auto& p : peers_) {
    taken.push_back(p->their ? p->their->cpu.load(std::memory_order_relaxed)
                             : -1);
  }
  move_off_cpu(cpu, taken, seg_->cpu);
}

bool ShmP2p::wait(Op& op, std::chrono::milliseconds timeout,
                  std::chrono::milliseconds deadline_in) {
  // Counted in in_wait_ (under mu_, as every return is) from its first
  // round on.
  bool counted = false;
  bool waited = false;  // spun or slept
  auto leave = [&](bool done) {
    if (counted) --in_wait_;
    if (waited && rank_ > op.peer) move_if_shared(op.peer);
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
      if (progress(&op)) {
        spin.reset();
        spinning = true;
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
      if (now >= until) return leave(false);
      if (!spinning) {
        check_peers();
        if (op.done.load(std::memory_order_relaxed)) return leave(true);
      }
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
void ShmP2p::loop() {
  std::unique_lock lock(mu_);
  ++in_wait_;
  Watches w;
  while (!stop_) {
    if (detached_.empty()) {
      detach_cv_.wait(lock);
      continue;
    }
    const uint32_t seen = seg_->bell.load(std::memory_order_acquire);
    progress();
    expire(Clock::now());
    check_peers();
    free_reads();
    if (detached_.empty()) continue;
    watch(w);
    auto next = Clock::time_point::max();
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
  for (auto& p : peers_) kill(*p, "the group failed: " + why);
  if (seg_) seg_->closed.store(1, std::memory_order_seq_cst);
  for (auto& p : peers_) ring(*p);
}

}  // namespace dlaunch::comm::gloo
