#include "agent/watchdog.h"

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <set>
#include <system_error>

namespace dlaunch::agent {
namespace {

int remove_entry(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

[[noreturn]] void watchdog_main(int read_fd, const char* orphan_dir) {
  ::setsid();  // no terminal signals; survives a kill of the agent's group
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP && s != SIGCHLD) ::signal(s, SIG_IGN);
  }
  int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(null_fd, fd);
  // Hold nothing of the agent's (its stdout pipe would keep readers waiting).
  for (int fd = 3; fd < read_fd; ++fd) ::close(fd);
  ::close_range(static_cast<unsigned>(read_fd) + 1, ~0U, 0);

  std::set<int> groups;
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
    if (value > 0) {
      groups.insert(value);
    } else {
      groups.erase(-value);
    }
  }
  for (int g : groups) ::kill(-g, SIGKILL);
  // Depth first, links not followed: only what the agent made goes.
  if (*orphan_dir != '\0') {
    ::nftw(orphan_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  ::_exit(0);
}

}  // namespace

void Watchdog::start(const std::filesystem::path& orphan_dir) {
  // Copied before fork: the child must not allocate for it.
  const std::string dir = orphan_dir.string();
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "watchdog pipe");
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(p[0]);
    ::close(p[1]);
    throw std::system_error(e, std::generic_category(), "watchdog fork");
  }
  if (pid == 0) {
    ::close(p[1]);
    watchdog_main(p[0], dir.c_str());
  }
  ::close(p[0]);
  write_fd_ = p[1];
  pid_ = pid;
}

void Watchdog::send(int value) {
  if (write_fd_ < 0) return;
  // 4 bytes to a pipe: one atomic write.
  while (::write(write_fd_, &value, sizeof value) < 0 && errno == EINTR) {
  }
}

Watchdog::~Watchdog() {
  if (write_fd_ < 0) return;
  ::close(write_fd_);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    pollfd pfd{pidfd, POLLIN, 0};
    ::poll(&pfd, 1, 1000);  // it exits at once; never wait without bound
    ::close(pidfd);
  }
  ::waitpid(pid_, nullptr, WNOHANG);
}

}  // namespace dlaunch::agent
