#include "comm/gloo/shm_sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/pidfd.h"

namespace dlaunch::comm::gloo {

bool SpinWait::once(bool shares_core) {
  if (!started_) {
    started_ = true;
    pausing_ = true;
    timed_ = false;
    pauses_ = 0;
  }
  // Reading the clock costs about as much as a pause: every 8th pause only,
  // the first read with the 8th (a peer on another core often answers
  // within those).
  if (pausing_ && !shares_core && ++pauses_ % 8 != 0) {
    cpu_relax();
    return true;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!timed_) {
    timed_ = true;
    start_ = now;
  }
  const auto spent = now - start_;
  if (pausing_ && !shares_core && spent < kSpinFor) {
    cpu_relax();
    return true;
  }
  pausing_ = false;
  if (spent < kSpinFor + kYieldFor) {
    ::sched_yield();
    return true;
  }
  return false;
}

int current_cpu() { return ::sched_getcpu(); }

int publish_cpu(std::atomic<int32_t>& where) {
  const int cpu = current_cpu();
  if (where.load(std::memory_order_relaxed) != cpu) {
    where.store(cpu, std::memory_order_relaxed);
  }
  return cpu;
}

namespace {

std::atomic<uint64_t> moves{0};  // cpu_moves()

// Gives the thread its CPUs back after a move. Setting the mask read
// before the move again would store it as the thread's own request (Linux
// 6.2 on), so that CPUs its cpuset gains later stay out of its reach: so
// the full mask goes first (the kernel narrows it to the cpuset), and the
// old one only where the full one gives something else (the thread had a
// narrower mask of its own, which it keeps).
void give_back(const cpu_set_t& before) {
  cpu_set_t full, now;
  std::memset(&full, 0xff, sizeof(full));
  CPU_ZERO(&now);
  const bool widened = ::sched_setaffinity(0, sizeof(full), &full) == 0;
  if (widened && ::sched_getaffinity(0, sizeof(now), &now) == 0 &&
      CPU_EQUAL(&now, &before)) {
    return;
  }
  if (::sched_setaffinity(0, sizeof(before), &before) == 0) return;
  const int err = errno;
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr,
                 "dlaunch comm: warning: could not give a thread its CPU mask "
                 "back after moving it off a CPU it shared with its peer "
                 "(%s); %s. Bind ranks yourself (dlaunch --cpu-bind core) to "
                 "avoid the move.\n",
                 std::strerror(err),
                 widened ? "it may run on any CPU of its cpuset"
                         : "it stays on one CPU");
  });
}

}  // namespace

int move_off_cpu(int cpu, std::span<const int> taken,
                 std::atomic<int32_t>& where) {
  if (cpu < 0 || std::find(taken.begin(), taken.end(), -1) != taken.end()) {
    return -1;
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  // A mask wider than cpu_set_t (over 1024 CPUs) fails here: no move.
  if (::sched_getaffinity(0, sizeof(mask), &mask) != 0) return -1;
  // Ranks outnumbering the CPUs share some whatever happens.
  if (static_cast<size_t>(CPU_COUNT(&mask)) < taken.size()) return -1;
  // The free CPU nearest by number: numbering usually follows the
  // sockets, so it most likely shares `cpu`'s caches.
  int to = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (c != cpu && CPU_ISSET(c, &mask) &&
        std::find(taken.begin(), taken.end(), c) == taken.end() &&
        (to < 0 || std::abs(c - cpu) < std::abs(to - cpu))) {
      to = c;
    }
  }
  if (to < 0) return -1;
  // Published first: a peer deciding at the same time sees `to` taken.
  where.store(to, std::memory_order_relaxed);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(to, &one);
  if (::sched_setaffinity(0, sizeof(one), &one) != 0) {
    where.store(cpu, std::memory_order_relaxed);
    return -1;
  }
  give_back(mask);
  moves.fetch_add(1, std::memory_order_relaxed);
  return to;
}

uint64_t cpu_moves() { return moves.load(std::memory_order_relaxed); }

bool cpu_move_due() {
  thread_local std::chrono::steady_clock::time_point last{};
  const auto now = std::chrono::steady_clock::now();
  if (last != std::chrono::steady_clock::time_point{} &&
      now - last < kMoveEvery) {
    return false;
  }
  last = now;
  return true;
}

void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected,
                std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0) return;
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
            &ts, nullptr, 0);
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
}

int watch_process(int32_t pid, uint64_t pid_ns) {
  if (pid == ::getpid() || pid_ns == 0 || pid_ns != pid_namespace()) return -1;
  return dlaunch::pidfd_open(pid);
}

bool process_exited(int pidfd) {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace dlaunch::comm::gloo
