#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/shm_segment.h"

namespace dlaunch::comm::gloo {

// Point to point between ranks on one host over shared memory. Each rank's
// segment holds, for every peer on its host, a ring of header cells (one
// cache line per send: its tag, dtype and size, the payload itself when it
// fits, and last a sequence word the receiver polls), a payload ring for
// larger payloads (written whole before the header when it fits, else
// streamed behind it as the receiver makes room), and a ring of control
// cells (each recv's header, posted when the recv is: the sender's proof
// that it matched). The k-th send with a tag to a peer matches the k-th
// recv with that tag from it, as over TCP; a payload that arrives before
// its recv stays in the ring, unless a recv from the same peer with another
// tag waits behind it, in which case it is copied aside.
// Waiters spin briefly (SpinWait) watching the cells (or the streamed
// payload's head) they expect next, then sleep on the rank's futex "bell",
// which a peer rings after it writes when the rank has sleepers (always for
// freed space and failures).
// Progress is made by whichever thread waits, under one mutex; operations
// handed over by detach() by a thread of its own.
// Owned by a group's state (shared with its Works).
class ShmP2p {
 public:
  using Clock = std::chrono::steady_clock;

  // The shared words a waiter watches: each is a sequence word or head a
  // peer writes, with the value at which there is something new to read.
  // Built under the engine's mutex; ready() reads without it.
  class Watches {
   public:
    void clear() {
      n_ = 0;
      more_.clear();
      all_ = false;
    }
    // Never throws: without memory for the mark, ready() is always true
    // (the waiter runs rounds instead of watching).
    void add(const std::atomic<uint64_t>* word, uint64_t at_least) {
      if (n_ < kInline) {
        marks_[n_++] = {word, at_least};
        return;
      }
      try {
        more_.push_back({word, at_least});
      } catch (const std::bad_alloc&) {
        all_ = true;
      }
    }
    // Whether some word reached its mark (relaxed loads: the caller runs a
    // round of progress, or a fence came before, as the sleeper's Dekker
    // needs).
    bool ready() const {
      if (all_) return true;
      for (uint32_t i = 0; i < n_; ++i) {
        if (marks_[i].word->load(std::memory_order_relaxed) >=
            marks_[i].at_least) {
          return true;
        }
      }
      for (const Mark& m : more_) {
        if (m.word->load(std::memory_order_relaxed) >= m.at_least) return true;
      }
      return false;
    }

   private:
    struct Mark {
      const std::atomic<uint64_t>* word;
      uint64_t at_least;
    };
    // Two words a peer at most: up to four peers allocate nothing.
    static constexpr uint32_t kInline = 8;
    Mark marks_[kInline];
    uint32_t n_ = 0;
    std::vector<Mark> more_;
    bool all_ = false;
  };

  // One isend or irecv, owned by its Work. Registered by post(); the engine
  // forgets it once `done` (success or failure), so the Work may go then.
  struct Op {
    bool is_send = false;
    int peer = 0;
    int tag = 0;
    char* data = nullptr;
    uint64_t nbytes = 0;
    uint32_t dtype = 0;

    // Set under the engine's mutex; readable by the Work once `done`.
    std::atomic<bool> done{false};
    bool mismatch = false;  // the other side's size or dtype differs
    uint32_t their_dtype = 0;
    uint64_t their_nbytes = 0;
    bool timed_out = false;  // failed at `deadline`
    std::string failure;     // why it failed; the stage when timed out

    // The engine's bookkeeping (under its mutex).
    Clock::time_point deadline = Clock::time_point::max();
    bool detached = false;
    bool matched = false;  // send: its recv's header came; recv: its send's
    bool written = false;  // send: header and payload are in the ring
    uint64_t moved = 0;    // payload bytes written (send) or read (recv)
    // The post() round, for the op's first wait to spin on at once rather
    // than run another round: the bell before it and what to watch after
    // it. Read by the posting thread only.
    bool fresh = false;
    uint32_t posted_bell = 0;
    Watches watch;
  };

  // Creates this rank's segment, named `base` + rank, with rings for every
  // other rank of `local` (the sorted group ranks on this host, this rank
  // among them). `timeout` (the group's) bounds the destructor's flush.
  // ok() false with `error` set on failure.
  ShmP2p(const std::string& base, int rank, std::vector<int> local,
         std::chrono::milliseconds timeout, std::string& error);
  // Writes the recv headers still queued (flush_control), marks this rank
  // gone, wakes its peers, joins the progress thread.
  ~ShmP2p();
  ShmP2p(const ShmP2p&) = delete;
  ShmP2p& operator=(const ShmP2p&) = delete;

  bool ok() const { return mine_.ok(); }
  // Maps every local peer's segment (once all have created theirs).
  bool open_peers(std::string& error);
  // Removes this rank's segment name (the mappings stay).
  void unlink() { mine_.unlink(); }
  // Whether point to point with group rank `peer` goes through here.
  bool serves(int peer) const;

  // The in-flight check of point to point with local peer `peer`: claim()
  // takes the (direction, tag) slot, false when an operation holds it;
  // release() frees it. No lock: one thread posts at a time (the group's
  // contract), and a slot is released only by the one holding it, from any
  // thread.
  bool claim(bool is_send, int peer, int tag);
  void release(bool is_send, int peer, int tag);

  // Starts `op`; false with `error` set when the pair is unusable.
  bool post(Op& op, std::string& error);
  // Makes progress until `op` is done (true) or `timeout` passes (false).
  // `deadline_in` > 0 arms op.deadline that far from the first look at the
  // clock (unless armed): at op.deadline the op fails as timed out (done,
  // true). An op done by its first round of progress reads no clock.
  // Throws bad_alloc when a round runs out of memory (setting an early
  // payload aside) before op.deadline; `op` stays registered, to be
  // waited for again.
  bool wait(Op& op, std::chrono::milliseconds timeout,
            std::chrono::milliseconds deadline_in);
  // One round of progress; whether `op` is done. Never blocks; throws
  // bad_alloc as wait() does.
  bool test(Op& op);
  // Sets op.deadline to `deadline` unless it has one.
  void arm(Op& op, Clock::time_point deadline);
  // The engine's thread drives `op` from now on (failing it at its
  // deadline, which must be set), while nobody waits for it.
  void detach(Op& op);
  // Where `op` stands, for a timeout message ("no matching recv posted
  // there yet", "payload of 4096 bytes in transfer (1024 moved)").
  std::string stage(const Op& op);
  // Saturating `now + d`: a wait of milliseconds::max() must not wrap.
  static Clock::time_point after(Clock::time_point now,
                                 std::chrono::milliseconds d);

  // The connection watch saw these ranks' TCP connections fail: wakes the
  // waiters, which fail the operations those ranks can no longer complete.
  // Callable from any thread (takes no lock).
  void peers_lost(const std::vector<int>& ranks);
  // Marks this rank gone (its group failed): every operation in flight
  // here and at the peers with this rank fails.
  void close(const std::string& why);

 private:
  struct Seg;
  struct Pair;
  struct Cell;
  struct Rec;
  struct Unexpected;
  struct Peer;

  Peer* peer_of(int rank);
  // Under mu_; whether anything moved. With `mine`, stops once it is done.
  bool progress(const Op* mine = nullptr);
  bool progress(Peer& p, const Op* mine = nullptr);
  bool read_control(Peer& p);
  bool write_control(Peer& p);
  bool write_data(Peer& p);
  // Stops once `mine` is done.
  bool read_data(Peer& p, const Op* mine = nullptr);
  void free_read(Peer& p);
  // free_read for every live peer.
  void free_reads();
  // free_read in two: stores the tails of what was read since the last
  // call (whether any), and, after a seq_cst fence, rings the owner if it
  // asked for space.
  bool store_tails(Peer& p);
  void answer_want(Peer& p);
  // The end of a round with `p`: one fence for the Dekker of the cells
  // written in it (the peer's sleepers) and of the space freed at its start
  // (`freed`: the peer's want_space).
  void settle(Peer& p, bool freed);
  // Whether the ring of header cells to `p` has a free cell (asking to be
  // rung when not).
  bool cell_space(Peer& p);
  // Payload ring bytes free for writing to `p`, looking at the reader's
  // tail again when fewer than `want`.
  uint64_t data_space(Peer& p, uint64_t want);
  static Op* match(std::vector<Op*>& ops, const Rec& r);
  void deliver(Peer& p, Unexpected& u);
  void finish(Op& op);
  // These three never throw: words that cannot be allocated read "out of
  // memory".
  void fail(Op& op, const std::string& why) noexcept;
  void time_out(Op& op) noexcept;
  std::string stage_of(const Op& op) const;
  void kill(Peer& p, const std::string& why) noexcept;
  void check_peers();
  void expire(Clock::time_point now) noexcept;
  // Wakes the peer's waiters (space freed, a failure, leaving).
  void ring(Peer& p);
  // After this rank published a streamed payload's head: wakes the peer's
  // sleepers, if any (its spinners watch the head).
  void notify(Peer& p);
  void ring_self();
  // Waits (at most the group timeout) until every recv header queued for a
  // live peer is in its control ring: a recv may complete from a payload
  // that came before its header went out (the ring was full), and the send
  // it matches completes only with that header, which the peer reads even
  // after this rank left (as a TCP pair delivers what was sent before its
  // close).
  void flush_control();
  // What a waiter watches after a round: for each live peer the next header
  // cell (when a recv from it is posted) or its streamed payload's head,
  // and its next control cell (when a send to it waits for its recv).
  void watch(Watches& w) const;
  // Sleeps unless the bell moved from `seen` or `w` is ready.
  void sleep_until_rung(uint32_t seen, const Watches& w,
                        Clock::time_point until);
  // After a wait for `peer` (a lower rank): moves this thread off its CPU
  // when the peer last published it (move_off_cpu in shm_sync.h).
  void move_if_shared(int peer);
  void loop();

  const std::string base_;
  const int rank_;
  const std::chrono::milliseconds timeout_;
  const std::vector<int> local_;
  size_t segment_bytes_ = 0;
  ShmSegment mine_;
  Seg* seg_ = nullptr;  // this rank's header, in mine_
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<int> peer_index_;  // group rank -> index in peers_, or -1
  // move_if_shared's look at where the ranks run, this one first (sized
  // by open_peers: a send or recv allocates nothing); under mu_.
  std::vector<int> taken_;
  // Ranks the connection watch reported (index = group rank).
  std::unique_ptr<std::atomic<bool>[]> lost_;

  std::mutex mu_;  // guards the progress state and every registered Op
  // Threads in wait() or the engine's loop (under mu_): above one,
  // finishing an op rings this rank's own bell, so that a thread waiting
  // for it wakes.
  int in_wait_ = 0;
  std::vector<Op*> detached_;
  bool stop_ = false;
  std::condition_variable detach_cv_;  // an op was detached, or stop_
  std::thread thread_;                 // started by the first detach()
};

}  // namespace dlaunch::comm::gloo
