#pragma once

// Waiting and liveness between processes that share memory: the futex
// calls, the spin-then-sleep constants and the peer-process checks that the
// shared-memory channel (shm_channel.h) and point to point (shm_p2p.h) use.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>

namespace dlaunch::comm::gloo {

// How a rank waiting for another process spends the time before it sleeps
// on a futex (a sleep and its wake-up cost tens of microseconds): first it
// spins with the CPU's pause, which catches a peer running on another core
// within a microsecond; then it yields the CPU between looks, which hands
// the core to a peer that shares it (ranks outnumbering cores, or two ranks
// the scheduler put on one core) instead of holding it. After both budgets
// it sleeps, so a rank that waits long burns at most kSpinFor + kYieldFor.
// One SpinWait per wait; single-threaded.
//
// Measured on 2 cores (dl-bench, 4 KiB): when two ranks share a core, each
// meeting took about 50 us with pause spins alone (the spinner held the
// core its peer needed until it slept) and 3 us with yields; 4 ranks on 2
// cores went from about 60 to 6-9 us per collective. dl-sgd's epochs did
// not change.
class SpinWait {
 public:
  // Pauses or yields once and returns true while the budget lasts; false
  // once it is spent (the caller then sleeps). `shares_core`: the awaited
  // peer last ran on this CPU, so spinning cannot help it: yield at once.
  bool once(bool shares_core = false);
  // Starts the budget over (the caller saw progress).
  void reset() {
    started_ = false;
    pausing_ = false;
  }

 private:
  // Pause spins (a peer on another core answers within them), then yields.
  static constexpr auto kSpinFor = std::chrono::microseconds(10);
  static constexpr auto kYieldFor = std::chrono::milliseconds(1);

  bool started_ = false;
  bool timed_ = false;    // start_ is set (at the first look at the clock)
  bool pausing_ = false;  // still in the pause phase
  uint32_t pauses_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// A sleeper wakes at least this often to check whether its peers still run.
constexpr auto kLivenessSlice = std::chrono::milliseconds(100);

// The CPU this thread runs on (-1 if unknown). Ranks publish it when they
// start waiting, so that a peer waiting for them knows whether they share
// its core (SpinWait::once).
int current_cpu();
// Stores current_cpu() into `where` unless it holds it already (a store
// would take the cache line from the peers that read it).
int publish_cpu(std::atomic<int32_t>& where);

// Two ranks that wait for each other on one core while another core idles
// pay a context switch per message (an 8 B ping-pong on 2 cores: 1.7 us
// against 0.2-0.4 us), and the kernel's balancer separates them only after
// tens of milliseconds (both are cache-hot). So when a wait ends with the
// awaited peer's post made on the waiter's CPU, the higher rank of the two
// moves itself: move_off_cpu() pins the calling thread to the CPU of its
// affinity mask nearest `cpu` by number that no rank in `taken` last ran
// on, which migrates it at once, then gives the mask back (the thread
// stays where it went). `taken`: where each rank of the group on this
// host, this one included, last posted or waited; -1 (unknown) stops the
// move, as do fewer CPUs in the mask than ranks (a rank bound to one CPU
// stays). `where`: this rank's published CPU, set to the destination
// before the move, so that a rank deciding later sees it taken (two that
// decide at the same instant may pick one CPU; a later shared wait, at
// least kMoveEvery on, separates them). Returns the CPU moved to, or -1.
int move_off_cpu(int cpu, std::span<const int> taken,
                 std::atomic<int32_t>& where);
// How many times move_off_cpu moved a thread of this process.
uint64_t cpu_moves();
// Whether the calling thread may try move_off_cpu now: true at most once
// per kMoveEvery on each thread, so that ranks a move cannot help (another
// job's processes on the free CPU, a sub-group that does not see the rest
// of the host's ranks) hop at most that often.
bool cpu_move_due();
constexpr auto kMoveEvery = std::chrono::milliseconds(50);

// Non-private futex operations: the word is in a MAP_SHARED mapping, which
// other processes (and this one, at another address) map too.
void futex_wake(std::atomic<uint32_t>* word);
// Sleeps while *word == expected, at most `timeout`.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected,
                std::chrono::nanoseconds timeout);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// This process's pid namespace (0 if unknown): containers may share
// /dev/shm but not pids, so a pid names the same process only within one.
uint64_t pid_namespace();

// A pidfd for the process `pid` that wrote `pid_ns` into shared memory, or
// -1 where it cannot be watched (this process: its ranks are threads that
// leave through a flag; another pid namespace; pidfd_open failed).
int watch_process(int32_t pid, uint64_t pid_ns);

// Whether the process behind `pidfd` (from watch_process) has exited; false
// for -1. A pidfd turns readable when its process exits (a zombie too).
bool process_exited(int pidfd);

}  // namespace dlaunch::comm::gloo
