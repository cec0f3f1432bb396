#include "agent/watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <system_error>

#include "comm/pidfd.h"

namespace dlaunch::agent {
namespace {

int remove_entry(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

// Sent before the pipe closes: the agent ended its strays itself.
constexpr int kCleanStop = 0;

// SIGKILLs every process whose environment holds `tag`; the number found.
// (The watchdog's memory is its own after fork: allocating is fine here.)
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

[[noreturn]] void watchdog_main(int read_fd, const char* orphan_dir,
                                const char* tag) {
  ::setsid();  // no terminal signals; survives a kill of the agent's group
  // Every catchable signal stays blocked, as Watchdog::start() forked it:
  // as good as ignored for a process that never unblocks them (`pkill
  // dlaunch` must not end it), and the agent's handlers, copied by fork,
  // never run here.
  int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(null_fd, fd);
  // Hold nothing of the agent's (its stdout pipe would keep readers waiting).
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
    if (value == kCleanStop) {
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

}  // namespace

void Watchdog::start(const std::filesystem::path& orphan_dir,
                     const std::string& tag) {
  // Copied before fork.
  const std::string dir = orphan_dir.string();
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "watchdog pipe");
  }
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  const int fork_errno = errno;
  if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    int e = fork_errno;
    ::close(p[0]);
    ::close(p[1]);
    throw std::system_error(e, std::generic_category(), "watchdog fork");
  }
  if (pid == 0) {
    ::close(p[1]);
    watchdog_main(p[0], dir.c_str(), tag.c_str());
  }
  ::close(p[0]);
  write_fd_ = p[1];
  pid_ = pid;
}

bool Watchdog::send(int value) {
  if (write_fd_ < 0) return false;
  // 4 bytes to a pipe: one atomic write.
  ssize_t n;
  do {
    n = ::write(write_fd_, &value, sizeof value);
  } while (n < 0 && errno == EINTR);
  return n == sizeof value;
}

void Watchdog::stopped_cleanly() { send(kCleanStop); }

Watchdog::~Watchdog() {
  if (write_fd_ < 0) return;
  ::close(write_fd_);
  int pidfd = dlaunch::pidfd_open(pid_);
  if (pidfd >= 0) {
    pollfd pfd{pidfd, POLLIN, 0};
    ::poll(&pfd, 1, 1000);  // it exits at once; never wait without bound
    ::close(pidfd);
  }
  ::waitpid(pid_, nullptr, WNOHANG);
}

}  // namespace dlaunch::agent
