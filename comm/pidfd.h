#pragma once

// pidfd_open(2) in one place for every user (the agent, its watchdog, the
// shared-memory channel, the tests): glibc 2.36 does not wrap it yet.

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace dlaunch {

// A file descriptor (close-on-exec) that polls readable once process `pid`
// has exited (Linux >= 5.3); -1 with errno set when it cannot be opened.
inline int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

}  // namespace dlaunch
