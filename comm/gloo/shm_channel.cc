#include "comm/gloo/shm_channel.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "comm/check.h"
#include "comm/gloo/shm_sync.h"

namespace dlaunch::comm::gloo {
namespace {

constexpr size_t kHeaderBytes = 640;

// Header::failure_state.
constexpr uint32_t kNoFailure = 0;
constexpr uint32_t kWritingFailure = 1;
constexpr uint32_t kFailureWritten = 2;

// A rank whose awaited peers ran on its own CPU at every wait for this long
// sleeps on the futex once instead of yielding (see sleep_instead()).
constexpr auto kSharedYieldFor = std::chrono::milliseconds(1);

// Whether call `seq` has been posted by a rank whose counter reads `v`
// (counters wrap after 2^32 calls).
bool reached(uint32_t v, uint32_t seq) {
  return static_cast<int32_t>(v - seq) >= 0;
}

}  // namespace

// The start of every rank's segment; the two slots follow it.
struct ShmChannel::Header {
  std::atomic<uint32_t> seq;      // calls posted (the futex word)
  std::atomic<uint32_t> waiters;  // ranks sleeping on `seq`
  std::atomic<uint32_t> closed;   // 1 once the rank has left
  std::atomic<int32_t> cpu;       // where the owner last posted or waited
  int32_t pid;                    // the owner's process
  uint64_t pid_ns;                // ... in this pid namespace
  cpu_set_t cpus;                 // the owner's affinity mask at set-up
  // Rank 0's alone: the group's first failure (record_failure()).
  std::atomic<uint32_t> failure_state;  // kNoFailure, kWritingFailure, ...
  uint32_t failure_bytes;
  char failure[kFailureBytes];
};

ShmChannel::ShmChannel(const std::string& base, int rank, int size,
                       size_t slot_bytes, std::string& error)
    : base_(base),
      rank_(rank),
      size_(size),
      slot_bytes_((slot_bytes + 63) / 64 * 64),
      segment_bytes_(kHeaderBytes + 2 * slot_bytes_),
      peers_(static_cast<size_t>(size)),
      pidfds_(static_cast<size_t>(size), -1),
      taken_(static_cast<size_t>(size), -1) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  static_assert(std::atomic<uint32_t>::is_always_lock_free);  // address-free
  mine_ =
      ShmSegment::create(base + std::to_string(rank), segment_bytes_, error);
  if (!mine_.ok()) return;
  auto* h = new (mine_.data()) Header{};
  h->cpu.store(-1);
  h->pid = static_cast<int32_t>(::getpid());
  h->pid_ns = pid_namespace();
  // Unreadable (over 1024 CPUs): taken as every CPU there is.
  if (::sched_getaffinity(0, sizeof(h->cpus), &h->cpus) != 0) {
    std::memset(&h->cpus, 0xff, sizeof(h->cpus));
  }
}

ShmChannel::~ShmChannel() {
  close();
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

bool ShmChannel::open_peers(std::string& error) {
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    peers_[j] =
        ShmSegment::open(base_ + std::to_string(j), segment_bytes_, error);
    if (!peers_[j].ok()) return false;
    // A process can die without closing its channel: watch it. Ranks that
    // are threads of this process leave through close() alone.
    pidfds_[j] = watch_process(header(j)->pid, header(j)->pid_ns);
  }
  cpu_set_t any;
  CPU_ZERO(&any);
  for (int j = 0; j < size_; ++j) CPU_OR(&any, &any, &header(j)->cpus);
  cpus_ = CPU_COUNT(&any);
  return true;
}

char* ShmChannel::segment(int j) const {
  return j == rank_ ? mine_.data() : peers_[j].data();
}

ShmChannel::Header* ShmChannel::header(int j) const {
  return std::launder(reinterpret_cast<Header*>(segment(j)));
}

const char* ShmChannel::slot(int j) const {
  return segment(j) + kHeaderBytes + (seq_ % 2) * slot_bytes_;
}

void ShmChannel::post(std::span<const char> head,
                      std::span<const char> payload) {
  const std::span<const char> parts[] = {payload};
  post_parts(head, parts);
}

void ShmChannel::post_parts(std::span<const char> head,
                            std::span<const std::span<const char>> parts) {
  size_t bytes = head.size();
  for (auto p : parts) bytes += p.size();
  DLAUNCH_CHECK(bytes <= slot_bytes_, "channel post larger than its slot");
  ++seq_;
  char* dst = segment(rank_) + kHeaderBytes + (seq_ % 2) * slot_bytes_;
  if (!head.empty()) std::memcpy(dst, head.data(), head.size());
  dst += head.size();
  for (auto p : parts) {
    if (!p.empty()) std::memcpy(dst, p.data(), p.size());
    dst += p.size();
  }
  Header* h = header(rank_);
  publish_cpu(h->cpu);
  // seq_cst on both sides: either a sleeper's re-read of `seq` sees this
  // call, or this load sees the sleeper and wakes it.
  h->seq.store(seq_, std::memory_order_seq_cst);
  if (h->waiters.load(std::memory_order_seq_cst) > 0) futex_wake(&h->seq);
}

bool ShmChannel::gone(int j) const {
  if (header(j)->closed.load(std::memory_order_acquire) != 0) return true;
  return process_exited(pidfds_[j]);
}

void ShmChannel::wait(std::chrono::steady_clock::time_point deadline) {
  SpinWait spin;  // one budget for the whole meeting
  for (int j = 0; j < size_; ++j) {
    if (j != rank_) wait_rank(j, seq_, deadline, true, spin);
  }
}

void ShmChannel::wait_for(int j, uint32_t seq,
                          std::chrono::steady_clock::time_point deadline) {
  SpinWait spin;
  if (j != rank_) wait_rank(j, seq, deadline, false, spin);
}

void ShmChannel::wait_rank(int j, uint32_t seq,
                           std::chrono::steady_clock::time_point deadline,
                           bool all, SpinWait& spin) {
  if (await_rank(j, seq, deadline, all, spin) && rank_ > j) move_if_shared(j);
}

void ShmChannel::move_if_shared(int j) {
  // `j` made the post that ended the wait on this rank's CPU.
  const int cpu = current_cpu();
  if (cpu < 0 || header(j)->cpu.load(std::memory_order_relaxed) != cpu ||
      !cpu_move_due()) {
    return;
  }
  for (int k = 0; k < size_; ++k) {
    taken_[k] =
        k == rank_ ? cpu : header(k)->cpu.load(std::memory_order_relaxed);
  }
  move_off_cpu(cpu, taken_, header(rank_)->cpu);
}

bool ShmChannel::await_rank(int j, uint32_t seq,
                            std::chrono::steady_clock::time_point deadline,
                            bool all, SpinWait& spin) {
  Header* h = header(j);
  const int cpu = publish_cpu(header(rank_)->cpu);
  if (reached(h->seq.load(std::memory_order_acquire), seq)) return false;
  if (!sleep_instead(cpu >= 0 &&
                     h->cpu.load(std::memory_order_relaxed) == cpu)) {
    while (
        !reached(h->seq.load(std::memory_order_acquire), seq) &&
        spin.once(cpu >= 0 && h->cpu.load(std::memory_order_relaxed) == cpu)) {
    }
    if (reached(h->seq.load(std::memory_order_acquire), seq)) return true;
  }
  // Counted as a sleeper on `seq` for as long as this scope lasts.
  struct Sleeper {
    std::atomic<uint32_t>& n;
    explicit Sleeper(std::atomic<uint32_t>& w) : n(w) { n.fetch_add(1); }
    ~Sleeper() { n.fetch_sub(1); }
  } sleeper(h->waiters);
  while (true) {
    const uint32_t v = h->seq.load(std::memory_order_seq_cst);
    if (reached(v, seq)) return true;
    // Any peer, not only `j`: one that failed stops the call for all, and
    // naming every one that left names the rank that failed first too (a
    // root that left after seeing it fail is not the only one gone).
    std::vector<int> gone_ranks = left();
    if (!gone_ranks.empty()) {
      // A peer that finished this call may leave, but only after `j`
      // posted it: look again before blaming anyone.
      if (reached(h->seq.load(std::memory_order_seq_cst), seq)) return true;
      throw WaitError{std::move(gone_ranks), false};
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      if (all) throw missing();
      throw WaitError{{j}, true};
    }
    futex_wait(
        &h->seq, v,
        std::min<std::chrono::nanoseconds>(deadline - now, kLivenessSlice));
  }
}

// Ranks that share a CPU hand it to each other with sched_yield(), and
// each yield pushes the yielder's deadline in the kernel's fair scheduler
// (EEVDF) out by a time slice: after thousands of meetings a rank loses its
// CPU to any other task for whole slices. A sleep ends that (a woken task
// gets a fresh deadline) and lets the kernel wake the rank on an idle CPU
// when there is one. So once every wait for kSharedYieldFor has found the
// awaited peer on this rank's CPU, one wait sleeps on the futex at once.
bool ShmChannel::sleep_instead(bool shares_cpu) {
  if (!shares_cpu) {
    sharing_ = false;
    return false;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!sharing_) {
    sharing_ = true;
    sharing_since_ = now;
    return false;
  }
  if (now - sharing_since_ < kSharedYieldFor) return false;
  sharing_ = false;
  ++shared_sleeps_;
  return true;
}

ShmChannel::WaitError ShmChannel::missing() const {
  WaitError e;
  e.timed_out = true;
  for (int k = 0; k < size_; ++k) {
    if (k != rank_ && !reached(header(k)->seq.load(), seq_)) {
      e.ranks.push_back(k);
    }
  }
  return e;
}

std::vector<int> ShmChannel::left() const {
  std::vector<int> out;
  for (int k = 0; k < size_; ++k) {
    if (k != rank_ && gone(k)) out.push_back(k);
  }
  return out;
}

void ShmChannel::close() {
  if (closed_ || !mine_.ok()) return;
  closed_ = true;
  Header* h = header(rank_);
  h->closed.store(1, std::memory_order_seq_cst);
  futex_wake(&h->seq);
}

bool ShmChannel::record_failure(std::string_view cause) {
  if (segment(0) == nullptr) return false;  // rank 0's not mapped here
  Header* h = header(0);
  uint32_t none = kNoFailure;
  if (!h->failure_state.compare_exchange_strong(none, kWritingFailure,
                                                std::memory_order_acq_rel)) {
    return false;
  }
  const size_t n = std::min(cause.size(), kFailureBytes);
  std::memcpy(h->failure, cause.data(), n);
  h->failure_bytes = static_cast<uint32_t>(n);
  h->failure_state.store(kFailureWritten, std::memory_order_release);
  return true;
}

std::string ShmChannel::first_failure() const {
  if (segment(0) == nullptr) return "";
  const Header* h = header(0);
  if (h->failure_state.load(std::memory_order_acquire) != kFailureWritten) {
    return "";
  }
  return std::string(h->failure, h->failure_bytes);
}

}  // namespace dlaunch::comm::gloo
