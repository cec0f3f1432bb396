#pragma once

// Waiting and liveness between processes that share memory: the futex
// calls, the spin-then-sleep constants and the peer-process checks that the
// shared-memory channel (shm_channel.h) and point to point (shm_p2p.h) use.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace dlaunch::comm::gloo {

// Spinning first catches a peer that is microseconds behind without a
// sleep and a wake-up (each costs tens of microseconds). Measured with
// dl-sgd on 2 cores: 200 spins and yields made 2-rank epochs 1.6x slower,
// 20000 spins made 4 ranks (oversubscribed) 1.7x slower.
constexpr int kSpins = 2000;
// A sleeper wakes at least this often to check whether its peers still run.
constexpr auto kLivenessSlice = std::chrono::milliseconds(100);

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
