#include "agent/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <system_error>

#include "agent/watchdog_loop.h"
#include "comm/pidfd.h"

namespace dlaunch::agent {
namespace {

// Starts dlaunch-watchdog (`program`) on the pipe's read end; its pid, or
// -1 with errno set when vfork or the exec failed (then nothing runs).
pid_t exec_program(const std::filesystem::path& program, int read_fd,
                   const char* const* argv) {
  // Everything the child uses is made before it exists: a vfork child
  // shares the agent's memory and may only move an fd, exec and _exit.
  const char* const envp[] = {nullptr};
  volatile int exec_errno = 0;  // set by the child when exec fails
  pid_t pid = ::vfork();
  if (pid == 0) {
    // The read end on the fd the program expects, without close-on-exec
    // (dup2 onto itself would keep that flag).
    const int moved = read_fd == kWatchdogPipeFd
                          ? ::fcntl(kWatchdogPipeFd, F_SETFD, 0)
                          : ::dup2(read_fd, kWatchdogPipeFd);
    if (moved >= 0) {
      ::execve(program.c_str(), const_cast<char* const*>(argv),
               const_cast<char* const*>(envp));
    }
    exec_errno = errno;
    ::_exit(127);
  }
  if (pid > 0 && exec_errno != 0) {
    ::waitpid(pid, nullptr, 0);  // already exited: vfork resumes us then
    errno = exec_errno;
    return -1;
  }
  return pid;
}

}  // namespace

void Watchdog::start(const std::filesystem::path& orphan_dir,
                     const std::string& tag) {
  const std::string dir = orphan_dir.string();
  std::error_code ec;
  const std::filesystem::path program =
      std::filesystem::read_symlink("/proc/self/exe", ec)
          .replace_filename("dlaunch-watchdog");
  const char* const argv[] = {"dlaunch-watchdog", dir.c_str(), tag.c_str(),
                              nullptr};
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "watchdog pipe");
  }
  // Started with every signal blocked, which it keeps (watchdog_loop.h).
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = -1;
  if (!ec && ::access(program.c_str(), X_OK) == 0) {
    pid = exec_program(program, p[0], argv);
  }
  if (pid < 0) {
    // No program beside dlaunch (a copy of dlaunch alone), or it would not
    // run: a fork of dlaunch does the same job.
    pid = ::fork();
    if (pid == 0) {
      ::close(p[1]);
      run_watchdog(p[0], dir.c_str(), tag.c_str());
    }
  }
  const int start_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(p[0]);
  if (pid < 0) {
    ::close(p[1]);
    throw std::system_error(start_errno, std::generic_category(),
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

void Watchdog::stopped_cleanly() { send(kWatchdogCleanStop); }

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
