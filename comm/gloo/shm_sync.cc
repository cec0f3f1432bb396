#include "comm/gloo/shm_sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

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
