#pragma once

// Internal to shm_p2p.cc and shm_p2p_rings.cc (not a public header): the
// ring sizes and the shared-memory layout (ShmP2p's nested structs).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/gloo/shm_p2p.h"
#include "comm/gloo/shm_segment.h"

namespace dlaunch::comm::gloo {

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
// In-flight slots per peer and direction: tags are 0..65535 (kMaxTag,
// checked before claim()).
constexpr size_t kTagSlots = size_t{1} << 16;

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

// The payload (larger than kInlineBytes) is in the payload ring, written
// before the header cell: no need to watch data_head for it.
constexpr uint16_t kWhole = 1;

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

}  // namespace dlaunch::comm::gloo
