#pragma once

// System calls for the watchdog's code (watchdog_loop.h), which uses no C
// library function: dlaunch-watchdog is then built without the C library
// on x86-64 (DLAUNCH_WATCHDOG_NOLIBC), whose start-up alone costs this VM
// ten times the rest of the program's exec (docs/performance.md).
// Constants come from the C library's headers (macros only).
#include <sys/syscall.h>

#if !defined(__x86_64__)
#include <unistd.h>

#include <cerrno>
#endif

namespace dlaunch::agent::sys {

// System call `nr`: its result, or -errno.
inline long call(long nr, long a = 0, long b = 0, long c = 0, long d = 0,
                 long e = 0, long f = 0) {
#if defined(__x86_64__)
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  register long r9 asm("r9") = f;
  long ret;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
#else
  long ret = ::syscall(nr, a, b, c, d, e, f);
  return ret == -1 ? -errno : ret;
#endif
}

template <typename P>
long arg(P* p) {
  return reinterpret_cast<long>(p);
}

[[noreturn]] inline void exit(int code) {
  while (true) call(SYS_exit_group, code);
}

}  // namespace dlaunch::agent::sys
