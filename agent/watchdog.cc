#include "agent/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <string>
#include <system_error>

#include "agent/watchdog_loop.h"
#include "comm/pidfd.h"

namespace dlaunch::agent {
namespace {

// The watchdog, in the child forked for it: the read end of the agent's
// pipe moves to kWatchdogPipeFd, then it becomes dlaunch-watchdog
// (`program`, when not empty), or runs the same code as this fork when
// that is missing or will not run. (Until exec, only async-signal-safe
// calls: the agent may have threads.)
[[noreturn]] void become_watchdog(const int p[2], const char* program,
                                  const char* const* argv) {
  if (p[0] == kWatchdogPipeFd) {
    ::fcntl(kWatchdogPipeFd, F_SETFD, 0);  // dup2 onto itself keeps CLOEXEC
  } else {
    ::dup2(p[0], kWatchdogPipeFd);  // over p[1] too when that was fd 3
    ::close(p[0]);
  }
  if (p[1] != kWatchdogPipeFd) ::close(p[1]);
  // Before exec, not when it first runs: a kill of dlaunch's process group
  // must not reach it, and it must not hold dlaunch's stdout (whoever reads
  // that waits for end-of-file) once dlaunch has exited.
  ::setsid();
  const int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);
  if (*program != '\0') {
    const char* const envp[] = {nullptr};
    ::execve(program, const_cast<char* const*>(argv),
             const_cast<char* const*>(envp));
  }
  run_watchdog(kWatchdogPipeFd, argv[1], argv[2]);
}

// Whether process `pid` runs dlaunch's own binary (a fork of dlaunch that
// has not exec'd, which holds the binary busy); false once it has exited.
bool runs_dlaunch(pid_t pid) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink(
      "/proc/" + std::to_string(pid) + "/exe", ec);
  return !ec && exe == std::filesystem::read_symlink("/proc/self/exe", ec);
}

}  // namespace

void Watchdog::start(const std::filesystem::path& orphan_dir,
                     const std::string& tag) {
  // Everything the child uses is made before it exists.
  const std::string dir = orphan_dir.string();
  std::error_code ec;
  std::string program = std::filesystem::read_symlink("/proc/self/exe", ec)
                            .replace_filename("dlaunch-watchdog")
                            .string();
  if (ec || ::access(program.c_str(), X_OK) != 0) program.clear();
  const char* const argv[] = {"dlaunch-watchdog", dir.c_str(), tag.c_str(),
                              nullptr};
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "watchdog pipe");
  }
  // Started with every signal blocked, which it keeps (watchdog_loop.h).
  // A fork, not a vfork: the agent goes on at once instead of waiting for
  // the child to be scheduled and exec (a wait a loaded machine makes
  // long); the child's copy of the agent's memory goes at its exec.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) become_watchdog(p, program.c_str(), argv);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(p[0]);
  if (pid < 0) {
    ::close(p[1]);
    throw std::system_error(fork_errno, std::generic_category(),
                            "watchdog fork");
  }
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

bool Watchdog::add_group(pid_t pgid) {
  if (!send(pgid)) return false;
  groups_.insert(pgid);
  return true;
}

bool Watchdog::remove_group(pid_t pgid) {
  groups_.erase(pgid);
  return send(-pgid);
}

void Watchdog::stopped_cleanly() { clean_ = send(kWatchdogCleanStop); }

Watchdog::~Watchdog() {
  if (write_fd_ < 0) return;
  ::close(write_fd_);
  if (clean_ && groups_.empty() && !runs_dlaunch(pid_)) {
    // Nothing left for it to do but exit, and it holds nothing of
    // dlaunch's (it is dlaunch-watchdog, or gone): dlaunch need not wait
    // for it to be scheduled, which a loaded machine makes long. Reaped
    // here if it has ended; else by whoever adopts it.
    ::waitpid(pid_, nullptr, WNOHANG);
    return;
  }
  int pidfd = dlaunch::pidfd_open(pid_);
  if (pidfd >= 0) {
    pollfd pfd{pidfd, POLLIN, 0};
    ::poll(&pfd, 1, 1000);  // it exits at once; never wait without bound
    ::close(pidfd);
  }
  ::waitpid(pid_, nullptr, WNOHANG);
}

}  // namespace dlaunch::agent
