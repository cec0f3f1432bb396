#include "agent/watchdog_loop.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "agent/watchdog_sys.h"

// System calls only (agent/watchdog_sys.h): no C library function, no C++
// runtime, no errno, so that dlaunch-watchdog can be built without them.
namespace dlaunch::agent {
namespace {

using sys::arg;
using sys::call;

size_t length(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

bool same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// One record of getdents64(2).
struct DirEntry {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[1];
};

// Calls `fn(name)` for each entry of the open folder `fd` but . and ..,
// reading it from where it stands.
template <typename Fn>
void each_entry(int fd, Fn&& fn) {
  alignas(8) char buf[4096];
  long n;
  while ((n = call(SYS_getdents64, fd, arg(buf), sizeof buf)) > 0 ||
         n == -EINTR) {
    for (long at = 0; at < n;) {
      auto* e = reinterpret_cast<DirEntry*>(buf + at);
      at += e->reclen;
      if (!same(e->name, ".") && !same(e->name, "..")) fn(e->name);
    }
  }
}

// Removes `name` in folder `dir` (an fd, or AT_FDCWD), with what it holds
// when it is a folder; links are removed, never followed.
void remove_tree(int dir, const char* name, int depth) {
  long r = call(SYS_unlinkat, dir, arg(name), 0);
  if (r != -EISDIR || depth > 64) {
    if (r == -EISDIR) call(SYS_unlinkat, dir, arg(name), AT_REMOVEDIR);
    return;
  }
  const long fd = call(SYS_openat, dir, arg(name),
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    // Entries removed while the folder is read may hide others from that
    // read: a few passes, until one finds nothing.
    for (int pass = 0; pass < 8; ++pass) {
      bool found = false;
      call(SYS_lseek, fd, 0, SEEK_SET);
      each_entry(static_cast<int>(fd), [&](const char* entry) {
        found = true;
        remove_tree(static_cast<int>(fd), entry, depth + 1);
      });
      if (!found) break;
    }
    call(SYS_close, fd);
  }
  call(SYS_unlinkat, dir, arg(name), AT_REMOVEDIR);
}

// Whether the NUL-separated entries read from `fd` (an environ file)
// include `entry` (`len` bytes), read a block at a time; `empty` tells
// whether it read nothing at all.
bool has_entry(int fd, const char* entry, size_t len, bool& empty) {
  char buf[8192];
  size_t at = 0;      // bytes of the current entry seen so far
  bool match = true;  // the current entry matches `entry` so far
  empty = true;
  long n;
  while ((n = call(SYS_read, fd, arg(buf), sizeof buf)) > 0 || n == -EINTR) {
    if (n > 0) empty = false;
    for (long i = 0; i < n; ++i) {
      if (buf[i] == '\0') {
        if (match && at == len) return true;
        at = 0;
        match = true;
        continue;
      }
      match = match && at < len && entry[at] == buf[i];
      ++at;
    }
  }
  return !empty && match && at == len;  // a last entry without its NUL
}

// CLOCK_MONOTONIC in nanoseconds.
long now_ns() {
  struct timespec t = {0, 0};
  call(SYS_clock_gettime, CLOCK_MONOTONIC, arg(&t));
  return t.tv_sec * 1'000'000'000L + t.tv_nsec;
}

// Whether /proc/`path` (a "PID/stat" relative to the open /proc) is a live
// process of user space: not a zombie, not a kernel thread.
bool live_user_process(int proc, const char* path) {
  const long fd = call(SYS_openat, proc, arg(path), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  long n;
  while ((n = call(SYS_read, fd, arg(buf), sizeof buf - 1)) == -EINTR) {
  }
  call(SYS_close, fd);
  if (n <= 0) return false;
  // "PID (comm) S ppid pgrp session tty tpgid flags ...": after the last
  // ')' (comm may hold one), the state, then the flags six fields on.
  long close = -1;
  for (long i = 0; i < n; ++i) {
    if (buf[i] == ')') close = i;
  }
  if (close < 0 || close + 2 >= n) return false;
  const char state = buf[close + 2];
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  long at = close + 2;
  for (int spaces = 0; at < n && spaces < 6; ++at) {
    if (buf[at] == ' ') ++spaces;
  }
  unsigned long flags = 0;
  for (; at < n && buf[at] >= '0' && buf[at] <= '9'; ++at) {
    flags = flags * 10 + static_cast<unsigned long>(buf[at] - '0');
  }
  constexpr unsigned long kKernelThread = 0x00200000;  // PF_KTHREAD
  return (flags & kKernelThread) == 0;
}

// SIGKILLs every process whose environment holds `tag`; the number found.
// `unsure` counts the live processes of user space whose environment read
// empty: one in the middle of execve does until its new stack is set up.
int kill_tagged(const char* tag, int& unsure) {
  const long proc = call(SYS_openat, AT_FDCWD, arg("/proc"),
                         O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return 0;
  const size_t tag_len = length(tag);
  const long self = call(SYS_getpid);
  int found = 0;
  each_entry(static_cast<int>(proc), [&](const char* name) {
    long pid = 0;
    char path[32];  // "PID/environ", relative to /proc
    size_t n = 0;
    for (; name[n] != '\0'; ++n) {
      if (name[n] < '0' || name[n] > '9' || n > 10) return;
      pid = pid * 10 + (name[n] - '0');
      path[n] = name[n];
    }
    if (pid <= 1 || pid == self) return;
    // "PID/<file>" (the pid's digits stay; the rest is rewritten).
    auto file = [&](const char* name_in_pid) {
      size_t at = n;
      for (const char* s = name_in_pid; *s != '\0'; ++s) path[at++] = *s;
      path[at] = '\0';
      return path;
    };
    const long fd =
        call(SYS_openat, proc, arg(file("/environ")), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    bool empty = false;
    const bool tagged = has_entry(static_cast<int>(fd), tag, tag_len, empty);
    call(SYS_close, fd);
    if (tagged) {
      call(SYS_kill, pid, SIGKILL);
      ++found;
    } else if (empty &&
               live_user_process(static_cast<int>(proc), file("/stat"))) {
      ++unsure;
    }
  });
  call(SYS_close, proc);
  return found;
}

// The registered process groups, unordered, in memory reserved for as
// many as there can be processes (PID_MAX_LIMIT): pages are only used as
// the array grows into them.
struct Groups {
  static constexpr size_t kMax = size_t{1} << 22;
  int* pgids = nullptr;
  size_t size = 0;

  void add(int pgid) {
    if (pgids == nullptr) {
      long p = call(SYS_mmap, 0, kMax * sizeof(int), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p < 0 && p > -4096) return;  // unrecorded: the tag finds it
      pgids = reinterpret_cast<int*>(p);
    }
    if (size < kMax) pgids[size++] = pgid;
  }
  void remove(int pgid) {
    for (size_t i = 0; i < size; ++i) {
      if (pgids[i] == pgid) {
        pgids[i] = pgids[--size];
        return;
      }
    }
  }
};

}  // namespace

int watchdog_main(int argc, char** argv) {
  // The pipe: lseek fails with ESPIPE on a pipe (EBADF on no file).
  if (argc < 2 || call(SYS_lseek, kWatchdogPipeFd, 0, SEEK_CUR) != -ESPIPE) {
    static constexpr char kUsage[] =
        "dlaunch-watchdog: dlaunch starts this program (TAG DIR..., its "
        "pipe on fd 3); it is not run by hand\n";
    call(SYS_write, 2, arg(kUsage), sizeof kUsage - 1);
    return 2;
  }
  run_watchdog(kWatchdogPipeFd, argv[1], argv + 2, argc - 2);
}

void run_watchdog(int read_fd, const char* tag, const char* const* dirs,
                  int n_dirs) {
  // Every catchable signal stays blocked (the agent started us so): as
  // good as ignored for a process that never unblocks them (`pkill
  // dlaunch` must not end it). Hold nothing else that dlaunch inherited
  // (a pipe of whoever started dlaunch would keep its reader waiting; the
  // caller already put stdio on /dev/null).
  if (read_fd > 3) call(SYS_close_range, 3, read_fd - 1, 0);
  call(SYS_close_range, read_fd + 1, ~0U, 0);

  Groups groups;
  bool forgotten[kWatchdogMaxDirs] = {};  // per folder name
  bool clean = false;
  int value = 0;
  size_t have = 0;
  while (true) {
    long n =
        call(SYS_read, read_fd, arg(reinterpret_cast<char*>(&value) + have),
             sizeof value - have);
    if (n == -EINTR) continue;
    if (n <= 0) break;  // the agent is gone (or closed the pipe)
    have += static_cast<size_t>(n);
    if (have < sizeof value) continue;
    have = 0;
    if (value == kWatchdogCleanStop) {
      clean = true;
    } else if (value >= kWatchdogForgetDir) {
      const int i = value - kWatchdogForgetDir;
      if (i < kWatchdogMaxDirs) forgotten[i] = true;
    } else if (value > 0) {
      groups.add(value);
    } else {
      groups.remove(-value);
    }
  }
  for (size_t i = 0; i < groups.size; ++i) {
    call(SYS_kill, -groups.pgids[i], SIGKILL);
  }
  // Children that left their group carry the tag. Scanned again each
  // millisecond, for at most kLookForNs, while a scan finds one (killed but
  // not gone yet, or forked meanwhile) or some process's environment reads
  // empty (one in execve: a shell's `exec sleep` caught by the kill; a
  // process started with an empty environment costs that wait).
  if (!clean && *tag != '\0') {
    constexpr long kLookForNs = 200'000'000;
    const long until = now_ns() + kLookForNs;
    for (;;) {
      int unsure = 0;
      if (kill_tagged(tag, unsure) == 0 && unsure == 0) break;
      if (now_ns() >= until) break;
      const struct timespec ms = {0, 1000000};
      call(SYS_nanosleep, arg(&ms), 0);
    }
  }
  // Depth first, links not followed: only what the agent made goes.
  for (int i = 0; i < n_dirs && i < kWatchdogMaxDirs; ++i) {
    if (!forgotten[i] && *dirs[i] != '\0') remove_tree(AT_FDCWD, dirs[i], 0);
  }
  sys::exit(0);
}

}  // namespace dlaunch::agent
