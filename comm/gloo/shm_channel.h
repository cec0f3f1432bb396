#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/gloo/shm_segment.h"
#include "comm/gloo/shm_sync.h"

namespace dlaunch::comm::gloo {

// The per-call meeting point of a group whose ranks share a host: each rank
// posts a call (its argument words and an optional payload) into its own
// shared-memory segment and waits, spinning briefly and then on a futex,
// until every peer has posted the same call; then everyone reads the
// others' posts in place. No message and no thread hop: a call costs a
// copy of the payload and a wake-up. Two slots per rank alternate, so one
// meeting per call is enough: a rank reuses a slot only after every peer
// has posted the next call, that is, after it finished reading this one.
// Owned by one process group and used by its one calling thread.
class ShmChannel {
 public:
  // Why wait() gave up: the ranks it was still waiting for, and whether
  // they left (failed, exited or destroyed the group) or were late.
  struct WaitError {
    std::vector<int> ranks;
    bool timed_out = false;
  };

  // Creates this rank's segment, named `base` + rank, with room for
  // `slot_bytes` per call. Empty (ok() false) with `error` set on failure.
  ShmChannel(const std::string& base, int rank, int size, size_t slot_bytes,
             std::string& error);
  // Marks this rank gone and wakes its waiters (see close()).
  ~ShmChannel();
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  bool ok() const { return mine_.ok(); }
  size_t slot_bytes() const { return slot_bytes_; }
  // Maps every peer's segment (call once all ranks have created theirs);
  // false with `error` set when one cannot be mapped.
  bool open_peers(std::string& error);
  // Removes this rank's segment name (the mappings stay).
  void unlink() { mine_.unlink(); }

  // Starts the next call: copies `head` and then `payload` (together at
  // most slot_bytes()) into this rank's slot and tells the peers.
  void post(std::span<const char> head, std::span<const char> payload);
  // The same with the payload in several parts, copied one after another.
  void post_parts(std::span<const char> head,
                  std::span<const std::span<const char>> parts);
  // Waits until every peer has posted the current call, at most until
  // `deadline`; throws WaitError otherwise. Between futex sleeps of at
  // most 100 ms it checks whether any peer has left: every rank takes part
  // in every call, so one that left fails the call even while this rank
  // waits for another (a stopped or slow one). WaitError then names every
  // peer that has left; at the deadline, every peer missing from the call.
  void wait(std::chrono::steady_clock::time_point deadline);
  // Waits until rank `j` alone has posted call number `seq` (pipelined
  // steps wait for the ranks they read from); fails as wait() does, except
  // that a timeout names only `j`.
  void wait_for(int j, uint32_t seq,
                std::chrono::steady_clock::time_point deadline);
  // The number of this rank's current call (its count of posts).
  uint32_t seq() const { return seq_; }
  // Rank j's post of the current call (this rank's own included).
  const char* slot(int j) const;
  // Marks this rank as gone (idempotent) and wakes peers waiting for it,
  // so that they fail at once instead of at their timeout.
  void close();

  // The group's first failure, written once for every rank to read: it
  // lives in rank 0's segment, which stays mapped while any rank runs, so
  // it outlives the store (rank 0 may host it and take it down when it
  // leaves) and the rank that wrote it. Records `cause` (cut to
  // kFailureBytes) unless a failure is recorded already; returns whether
  // it did. Call it before close(), so that a peer that sees this rank
  // leave finds the cause. Any thread, any rank.
  bool record_failure(std::string_view cause);
  // The recorded first failure, or "" when none is (or its writer died
  // while writing it).
  std::string first_failure() const;
  static constexpr size_t kFailureBytes = 448;

  // How many waits slept at once because the awaited peer kept sharing this
  // rank's CPU (see sleep_instead(); tests).
  uint64_t shared_sleeps() const { return shared_sleeps_; }
  // CPUs the ranks may run on together (the union of their affinity masks
  // at set-up; the same on every rank once open_peers() succeeded).
  int cpus() const { return cpus_; }

 private:
  struct Header;
  char* segment(int j) const;  // rank j's mapping (this rank's own too)
  Header* header(int j) const;
  bool gone(int j) const;
  // Waits for rank j to reach call `seq`, spending what is left of `spin`
  // before it sleeps; fails as wait() and wait_for() say (`all`: a
  // timeout names every rank missing from the current call, else `j`).
  void wait_rank(int j, uint32_t seq,
                 std::chrono::steady_clock::time_point deadline, bool all,
                 SpinWait& spin);
  // wait_rank's wait; whether it had to wait (`j` had not posted yet).
  bool await_rank(int j, uint32_t seq,
                  std::chrono::steady_clock::time_point deadline, bool all,
                  SpinWait& spin);
  // After a wait for `j` (a lower rank): moves this rank off its CPU when
  // j's post was made on it (move_off_cpu in shm_sync.h).
  void move_if_shared(int j);
  // Whether a wait whose peer (`shares_cpu`) last ran on this rank's CPU
  // should sleep at once rather than yield (co-location for too long).
  bool sleep_instead(bool shares_cpu);
  // Every peer missing from the current call (at the deadline).
  WaitError missing() const;
  // Every peer that has left.
  std::vector<int> left() const;

  std::string base_;
  int rank_;
  int size_;
  size_t slot_bytes_;
  size_t segment_bytes_;
  uint32_t seq_ = 0;  // number of the current call
  bool closed_ = false;
  // Since when every wait found its peer on this rank's CPU (sharing_).
  bool sharing_ = false;
  std::chrono::steady_clock::time_point sharing_since_;
  uint64_t shared_sleeps_ = 0;
  int cpus_ = 0;
  ShmSegment mine_;
  std::vector<ShmSegment> peers_;  // index = rank; this rank's stays empty
  // Peers in other processes of this pid namespace, else -1 (those leave
  // through close() alone, or are found at the deadline).
  std::vector<int> pidfds_;
  // move_if_shared's look at where the ranks run (sized once: the small
  // collectives allocate nothing).
  std::vector<int> taken_;
};

}  // namespace dlaunch::comm::gloo
