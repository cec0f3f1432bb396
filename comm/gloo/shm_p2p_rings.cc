// Point to point over shared memory: the ring protocol. A round of progress
// with one peer (progress, settle) writes and reads its header, control and
// payload rings, frees what was read, and wakes the peer (ring, notify).

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "comm/gloo/shm_p2p.h"
#include "comm/gloo/shm_p2p_internal.h"
#include "comm/gloo/shm_sync.h"

namespace dlaunch::comm::gloo {
namespace {

// A sender publishes (and a receiver frees) ring space in steps of at most
// this, so that the other side starts while the rest is copied.
constexpr uint64_t kStepBytes = 64 << 10;

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

}  // namespace

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

}  // namespace dlaunch::comm::gloo
