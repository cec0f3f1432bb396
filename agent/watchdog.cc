#include "agent/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "agent/temp_dir.h"
#include "agent/watchdog_loop.h"
#include "comm/pidfd.h"

namespace dlaunch::agent {
namespace {

// What the watchdog's child shares with the agent: it is a vfork, so it
// runs in the agent's memory until its exec and writes its results here.
struct Child {
  int pipe[2] = {-1, -1};
  const char* program = "";  // dlaunch-watchdog beside dlaunch, or ""
  const char* argv[4] = {};  // argv[1]: set to the folder made
  char* const* templates = nullptr;
  size_t n_templates = 0;
  int* errnos = nullptr;  // why each template failed
  int exec_errno = 0;     // set when no exec worked
};

// The watchdog, in the vfork child: the read end of the agent's pipe moves
// to kWatchdogPipeFd, it leaves dlaunch's session, makes the folder, then
// becomes dlaunch-watchdog, or dlaunch itself under that name when that is
// missing or will not run. Only async-signal-safe calls (mkdtemp makes a
// name from getrandom and calls mkdir): this is the agent's memory, and
// the agent may have threads.
[[noreturn]] void become_watchdog(Child& c) {
  const int* p = c.pipe;
  if (p[0] == kWatchdogPipeFd) {
    ::fcntl(kWatchdogPipeFd, F_SETFD, 0);  // dup2 onto itself keeps CLOEXEC
  } else {
    ::dup2(p[0], kWatchdogPipeFd);  // over p[1] too when that was fd 3
    ::close(p[0]);
  }
  if (p[1] != kWatchdogPipeFd) ::close(p[1]);
  // A kill of dlaunch's process group must not reach it, and it must not
  // hold dlaunch's stdout (whoever reads that waits for end-of-file) once
  // dlaunch has exited.
  ::setsid();
  const int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);
  if (null_fd > 2) ::close(null_fd);
  // Made only now, in its own session: from the moment it exists, the one
  // process that removes it is already there.
  for (size_t i = 0; i < c.n_templates; ++i) {
    if (::mkdtemp(c.templates[i]) != nullptr) {
      c.argv[1] = c.templates[i];
      break;
    }
    c.errnos[i] = errno;
  }
  auto argv = const_cast<char* const*>(c.argv);
  char* const envp[] = {nullptr};
  if (*c.program != '\0') ::execve(c.program, argv, envp);
  ::execve("/proc/self/exe", argv, envp);  // watchdog_loop.h's stand-in
  c.exec_errno = errno;
  if (*c.argv[1] != '\0') ::rmdir(c.argv[1]);
  ::_exit(127);
}

// Starts the watchdog's child; its pid, or -1 with errno set. A vfork: no
// copy of the agent's page tables to make, for the agent to fault back in
// page by page as it writes its memory again, nor for the child to tear
// down at its exec. The agent waits for the exec (the kernel's part; the
// program's start-up runs alongside the agent). Every signal is blocked
// across it, and the watchdog keeps them so (watchdog_loop.h).
pid_t spawn(Child& c) {
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::vfork();
  if (pid == 0) become_watchdog(c);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = fork_errno;
  return pid;
}

// Whether process `pid` runs dlaunch's own binary (the stand-in for a
// missing dlaunch-watchdog, which holds the binary busy); false once it
// has exited.
bool runs_dlaunch(pid_t pid) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink(
      "/proc/" + std::to_string(pid) + "/exe", ec);
  return !ec && exe == std::filesystem::read_symlink("/proc/self/exe", ec);
}

}  // namespace

std::string Watchdog::start(const std::string& tag,
                            std::vector<std::string> dir_templates) {
  // Everything the child uses is made before it exists. (Whether the
  // program is there is the exec's to find out.)
  std::error_code ec;
  std::string program = std::filesystem::read_symlink("/proc/self/exe", ec)
                            .replace_filename(kWatchdogProgram)
                            .string();
  if (ec) program.clear();
  std::vector<char*> templates;
  for (std::string& t : dir_templates) templates.push_back(t.data());
  std::vector<int> errnos(templates.size(), 0);
  Child c;
  c.program = program.c_str();
  c.argv[0] = kWatchdogProgram;
  c.argv[1] = "";
  c.argv[2] = tag.c_str();
  c.templates = templates.data();
  c.n_templates = templates.size();
  c.errnos = errnos.data();
  if (::pipe2(c.pipe, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "watchdog pipe");
  }
  const pid_t pid = spawn(c);
  const int fork_errno = errno;
  ::close(c.pipe[0]);
  if (pid < 0 || c.exec_errno != 0) {
    ::close(c.pipe[1]);
    if (pid < 0) {
      throw std::system_error(fork_errno, std::generic_category(),
                              "watchdog vfork");
    }
    ::waitpid(pid, nullptr, 0);  // it has _exit()ed: vfork resumes us then
    throw std::system_error(
        c.exec_errno, std::generic_category(),
        "watchdog exec (" + program + ", then dlaunch itself)");
  }
  write_fd_ = c.pipe[1];
  pid_ = pid;
  if (*c.argv[1] == '\0' && !dir_templates.empty()) {
    throw std::runtime_error(temp_dir_error(dir_templates, errnos));
  }
  return c.argv[1];
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
