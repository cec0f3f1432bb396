// dlaunch-watchdog: the agent's watchdog as a small program of its own
// (agent/watchdog.h), started by dlaunch from its own folder with the
// read end of a pipe on fd 3. With DLAUNCH_WATCHDOG_NOLIBC (x86-64) it is
// built without the C library: its own entry point, and the few memory
// functions a compiler may call; the C library's start-up would cost ten
// times the rest of its exec (docs/performance.md).
#include "agent/watchdog_loop.h"

#ifdef DLAUNCH_WATCHDOG_NOLIBC
#include <cstddef>

#include "agent/watchdog_sys.h"

extern "C" {

// The entry point's C++ half: argc and argv from the initial stack.
[[noreturn]] void dlaunch_watchdog_start(long* sp) {
  const int argc = static_cast<int>(sp[0]);
  char** argv = reinterpret_cast<char**>(sp + 1);
  dlaunch::agent::sys::exit(dlaunch::agent::watchdog_main(argc, argv));
}

void* memset(void* dst, int c, size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<unsigned char>(c);
  return dst;
}

void* memcpy(void* dst, const void* src, size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = s[i];
  return dst;
}

size_t strlen(const char* s) {
  const volatile char* p = s;
  while (*p != '\0') ++p;
  return static_cast<size_t>(p - s);
}

}  // extern "C"

// The stack pointer at entry points at argc; the call leaves it aligned
// as a function expects.
asm(".globl _start\n"
    "_start:\n"
    "  xor %ebp, %ebp\n"
    "  mov %rsp, %rdi\n"
    "  and $-16, %rsp\n"
    "  call dlaunch_watchdog_start\n"
    "  hlt\n");

#else

int main(int argc, char** argv) {
  return dlaunch::agent::watchdog_main(argc, argv);
}

#endif
