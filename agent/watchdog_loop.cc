#include "agent/watchdog_loop.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

namespace dlaunch::agent {
namespace {

int remove_entry(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

// SIGKILLs every process whose environment holds `tag`; the number found.
// (The watchdog's memory is its own, even as a fork: allocating is fine.)
int kill_tagged(const char* tag) {
  int found = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  const size_t tag_len = std::strlen(tag);
  std::string env;
  char buf[8192];
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 1 || pid == ::getpid()) continue;
    std::string path = std::string("/proc/") + e->d_name + "/environ";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    env.clear();
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) env.append(buf, n);
    ::close(fd);
    for (size_t at = 0; at < env.size();) {
      size_t nul = env.find('\0', at);
      if (nul == std::string::npos) nul = env.size();
      if (nul - at == tag_len && env.compare(at, tag_len, tag) == 0) {
        ::kill(static_cast<pid_t>(pid), SIGKILL);
        ++found;
        break;
      }
      at = nul + 1;
    }
  }
  ::closedir(proc);
  return found;
}

}  // namespace

void run_watchdog(int read_fd, const char* orphan_dir, const char* tag) {
  // Every catchable signal stays blocked (the agent started us so): as
  // good as ignored for a process that never unblocks them (`pkill
  // dlaunch` must not end it), and a fork's copy of the agent's handlers
  // never runs. Hold nothing else of the agent's (its stdout pipe would
  // keep readers waiting; the caller already put stdio on /dev/null).
  if (read_fd > 3) ::close_range(3, static_cast<unsigned>(read_fd) - 1, 0);
  ::close_range(static_cast<unsigned>(read_fd) + 1, ~0U, 0);

  std::set<int> groups;
  bool clean = false;
  int value = 0;
  size_t have = 0;
  while (true) {
    ssize_t n = ::read(read_fd, reinterpret_cast<char*>(&value) + have,
                       sizeof value - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the agent is gone (or closed the pipe)
    have += static_cast<size_t>(n);
    if (have < sizeof value) continue;
    have = 0;
    if (value == kWatchdogCleanStop) {
      clean = true;
    } else if (value > 0) {
      groups.insert(value);
    } else {
      groups.erase(-value);
    }
  }
  for (int g : groups) ::kill(-g, SIGKILL);
  // Children that left their group carry the tag; a few passes catch those
  // forked while the first one ran.
  if (!clean && *tag != '\0') {
    for (int pass = 0; pass < 8 && kill_tagged(tag) > 0; ++pass) {
    }
  }
  // Depth first, links not followed: only what the agent made goes.
  if (*orphan_dir != '\0') {
    ::nftw(orphan_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  ::_exit(0);
}

}  // namespace dlaunch::agent
