// Single copy between ranks on one host: each rank reads its peers' data
// straight out of their memory (and writes part of it into theirs) with
// process_vm_readv / process_vm_writev ("CMA", as OpenMPI's shared-memory
// transport does), instead of one copy into a shared segment and one out.
// Used, when DLAUNCH_COMM_CMA=on, for the collectives that only move data
// (broadcast, scatter, gather, all_gather, all_to_all) where they would
// take the segment steps. The
// ranks meet twice on the channel: first each posts where its data lies,
// then, after the copies, whether they all succeeded; if the kernel refused
// any copy (ptrace restrictions, a kernel without CMA) every rank turns
// single copy off for the group and redoes the call through the segments.

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "comm/gloo/gloo_group.h"
#include "comm/gloo/shm_sync.h"

namespace dlaunch::comm::gloo {
namespace {

// Words each rank posts before the copies: 0 if it cannot take part, else
// 1 + the bytes it copies within itself; its pid and pid namespace, then per
// rank d where its bytes for d lie, how many, and where it wants d's bytes.
constexpr size_t kHeadWords = 3;
constexpr size_t kPerRank = 3;

// Lets peers of the same user read this process where Yama restricts
// ptrace to descendants (ptrace_scope 1), as OpenMPI does; once a process.
void allow_peers() {
  static const bool done = [] {
    std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
    int scope = 0;
    if (f >> scope && scope == 1) {
      ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    }
    return true;
  }();
  (void)done;
}

bool overlaps(const char* a, size_t an, const char* b, size_t bn) {
  return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

// Moves `n` bytes between this process at `local` and process `pid` at
// `remote`: reads when `read`, else writes. 0, or the errno.
int cma_move(pid_t pid, char* local, uint64_t remote, size_t n, bool read) {
  while (n > 0) {
    iovec l{local, n};
    iovec r{reinterpret_cast<void*>(remote), n};
    const ssize_t k = read ? ::process_vm_readv(pid, &l, 1, &r, 1, 0)
                           : ::process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return k < 0 ? errno : EIO;
    local += k;
    remote += static_cast<uint64_t>(k);
    n -= static_cast<size_t>(k);
  }
  return 0;
}

// How many bytes of each transfer s -> d (at [s * n + d]; bytes(s, d) of
// them) its reader d copies; its writer s copies the rest. Chosen so that
// every rank copies about as much as any other, counting `own`, the bytes
// each copies within itself: a gather's root, busy with its own piece,
// leaves its peers to write theirs, and a broadcast's root serving n - 1
// peers copies 1/n of each transfer. A few passes that move each split
// toward its less busy end; every rank computes the same from the same
// words. Splits fall on page boundaries (each side pins its own pages).
template <class Bytes>
std::vector<uint64_t> balance(int n, const std::vector<uint64_t>& own,
                              Bytes&& bytes) {
  const auto idx = [n](int s, int d) { return static_cast<size_t>(s) * n + d; };
  std::vector<uint64_t> reads(static_cast<size_t>(n) * n, 0);
  std::vector<int64_t> load(own.begin(), own.end());
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      reads[idx(s, d)] = bytes(s, d) / 2;
      load[d] += static_cast<int64_t>(reads[idx(s, d)]);
      load[s] += static_cast<int64_t>(bytes(s, d) - reads[idx(s, d)]);
    }
  }
  for (int pass = 0; pass < 8; ++pass) {
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        const auto b = static_cast<int64_t>(bytes(s, d));
        if (s == d || b == 0) continue;
        auto& r = reads[idx(s, d)];
        const int64_t rest_s = load[s] - (b - static_cast<int64_t>(r));
        const int64_t rest_d = load[d] - static_cast<int64_t>(r);
        const int64_t want =
            std::clamp((b + rest_s - rest_d) / 2, int64_t{0}, b);
        r = static_cast<uint64_t>(want);
        load[s] = rest_s + (b - want);
        load[d] = rest_d + want;
      }
    }
  }
  for (auto& r : reads) {
    if (r > 4096) r &= ~uint64_t{4095};
  }
  return reads;
}

}  // namespace

// Off unless asked for: on this project's machines (2-core VMs) a copy
// through the kernel ran at half memcpy's rate (page pinning), and the
// segments' pipelined two copies were as fast or faster (docs/performance.md).
bool GlooProcessGroup::cma_allowed() {
  const char* v = std::getenv("DLAUNCH_COMM_CMA");
  if (!v || std::string(v) != "on") return false;
  allow_peers();
  return true;
}

bool GlooProcessGroup::shm_cma(std::span<const std::span<const char>> srcs,
                               std::span<const std::span<char>> dsts,
                               LocalCopy local) {
  const int n = size();
  const int me = rank();
  const size_t words = kHeadWords + kPerRank * static_cast<size_t>(n);
  if (!channel_ || !cma_ || channel_->slot_bytes() < words * 8) return false;

  // Where this rank's data lies; it takes part only when no region that
  // peers write overlaps one that they read (in-place calls), as a peer may
  // still read a source while another writes; its own copy must not write
  // what peers read either (unless it copies a region onto itself, a no-op).
  bool ok = true;
  for (const auto& s : srcs) {
    for (const auto& d : dsts) {
      if (overlaps(d.data(), d.size(), s.data(), s.size())) ok = false;
    }
    if (local.dst.data() != local.src.data() &&
        overlaps(local.dst.data(), local.src.size(), s.data(), s.size())) {
      ok = false;
    }
  }
  const size_t own =
      local.dst.data() == local.src.data() ? 0 : local.src.size();
  std::vector<uint64_t> mine(words, 0);
  mine[0] = ok ? 1 + own : 0;
  mine[1] = static_cast<uint64_t>(::getpid());
  mine[2] = pid_namespace();
  for (int d = 0; d < n; ++d) {
    uint64_t* w = mine.data() + kHeadWords + kPerRank * d;
    w[0] = reinterpret_cast<uint64_t>(srcs[d].data());
    w[1] = srcs[d].size();
    w[2] = reinterpret_cast<uint64_t>(dsts[d].data());
  }
  channel_->post({reinterpret_cast<const char*>(mine.data()), words * 8}, {});
  channel_wait();
  std::vector<const uint64_t*> all(n);
  for (int j = 0; j < n; ++j) {
    all[j] = j == me ? mine.data()
                     : reinterpret_cast<const uint64_t*>(channel_->slot(j));
  }
  // Every rank decides alike from the same words. pids name the same
  // processes only within one known pid namespace: single copy stays off.
  for (int j = 0; j < n; ++j) {
    if (all[j][2] == 0 || all[j][2] != all[0][2]) {
      cma_ = false;
      return false;
    }
  }
  for (int j = 0; j < n; ++j) {
    if (all[j][0] == 0) return false;  // in place somewhere: this call
  }
  auto src_of = [&](int s, int d) {
    return all[s] + kHeadWords + kPerRank * d;
  };
  std::vector<uint64_t> own_bytes(n);
  for (int j = 0; j < n; ++j) own_bytes[j] = all[j][0] - 1;
  const std::vector<uint64_t> reads =
      balance(n, own_bytes, [&](int s, int d) { return src_of(s, d)[1]; });

  int error = 0;
  if (own > 0) std::memcpy(local.dst.data(), local.src.data(), own);
  for (int step = 1; step < n && error == 0; ++step) {
    // Peers in a different order on every rank, so that they spread out.
    for (const bool reading : {true, false}) {
      const int s = reading ? (me + step) % n : me;
      const int d = reading ? me : (me + n - step) % n;
      const uint64_t* w = src_of(s, d);
      const uint64_t bytes = w[1];
      if (bytes == 0) continue;
      const uint64_t split = reads[static_cast<size_t>(s) * n + d];
      const auto dst = src_of(d, s)[2];  // where d wants s's bytes
      const int peer = reading ? s : d;
      const pid_t pid = static_cast<pid_t>(all[peer][1]);
      if (reading) {
        error = cma_move(pid, reinterpret_cast<char*>(dst), w[0], split, true);
      } else {
        error = cma_move(pid, reinterpret_cast<char*>(w[0] + split),
                         dst + split, bytes - split, false);
      }
      if (error) break;
    }
  }
  // Test-only: this rank's copies count as refused by the kernel.
  const char* refused = std::getenv("DLAUNCH_COMM_TEST_CMA_REFUSED");
  if (error == 0 && refused && *refused &&
      std::string(refused) == std::to_string(me)) {
    error = EPERM;
  }

  // The second meeting: nobody's sources are released before every copy is
  // done, and a refusal anywhere sends every rank to the segments.
  const uint64_t status = static_cast<uint64_t>(error);
  channel_->post({reinterpret_cast<const char*>(&status), 8}, {});
  channel_wait();
  for (int j = 0; j < n; ++j) {
    if (j != me && *reinterpret_cast<const uint64_t*>(channel_->slot(j)) != 0) {
      error = -1;
    }
  }
  if (error != 0) {
    cma_ = false;  // every rank alike: each saw every status
    return false;
  }
  took("shm-cma");
  return true;
}

}  // namespace dlaunch::comm::gloo
