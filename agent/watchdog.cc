#include "agent/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>

#include "agent/temp_dir.h"
#include "agent/watchdog_loop.h"
#include "comm/pidfd.h"

namespace dlaunch::agent {
namespace {

// The watchdog, in the child forked for it: the read end of the agent's
// pipe moves to kWatchdogPipeFd, it leaves dlaunch's session, then it
// becomes dlaunch-watchdog (`program`), or runs the same code as this fork
// when that is missing or will not run. (Until exec, only
// async-signal-safe calls: the agent may have threads.)
[[noreturn]] void become_watchdog(const int p[2], const char* program,
                                  const char* const* argv, int argc) {
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
  if (null_fd > 2) ::close(null_fd);
  if (*program != '\0') {
    // One entry: another job's watchdog scanning /proc takes an empty
    // environment for a process in execve, and waits for it to read.
    const char* const envp[] = {"DLAUNCH_WATCHDOG=1", nullptr};
    ::execve(program, const_cast<char* const*>(argv),
             const_cast<char* const*>(envp));
  }
  run_watchdog(kWatchdogPipeFd, argv[1], argv + 2, argc - 2);
}

// `tmpl` with its trailing XXXXXX replaced by random letters and digits,
// as mkdtemp would, but not made.
std::string random_name(std::string tmpl) {
  static constexpr char kChars[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  unsigned char bytes[6] = {};
  if (::getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != sizeof bytes) {
    std::random_device rd;
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rd());
  }
  const size_t x = tmpl.size() >= 6 ? tmpl.size() - 6 : 0;
  for (size_t i = x; i < tmpl.size(); ++i) {
    if (tmpl[i] == 'X') tmpl[i] = kChars[bytes[i - x] % (sizeof kChars - 1)];
  }
  return tmpl;
}

}  // namespace

bool may_run_dlaunch(pid_t pid, const std::filesystem::path& proc) {
  std::error_code ec;
  const auto exe =
      std::filesystem::read_symlink(proc / std::to_string(pid) / "exe", ec);
  // Exited (a zombie's link reads ENOENT too): it holds nothing.
  if (ec) return ec != std::errc::no_such_file_or_directory;
  const auto self = std::filesystem::read_symlink(proc / "self" / "exe", ec);
  // Cannot compare: it may be a fork of dlaunch (the guess that waits a
  // bounded second rather than leave dlaunch's binary busy).
  return ec || exe == self;
}

std::string Watchdog::start(const std::string& tag,
                            std::vector<std::string> dir_templates) {
  // Everything the child uses is made before it exists; the folders'
  // names too (the watchdog gets them in argv), though not the folders.
  std::error_code ec;
  std::string program = std::filesystem::read_symlink("/proc/self/exe", ec)
                            .replace_filename(kWatchdogProgram)
                            .string();
  if (ec) program.clear();
  if (dir_templates.size() > kWatchdogMaxDirs) {
    throw std::logic_error("more folder templates than the watchdog takes");
  }
  std::vector<std::string>& dirs = dir_templates;  // named in place
  for (std::string& t : dirs) t = random_name(std::move(t));
  std::vector<const char*> argv = {kWatchdogProgram, tag.c_str()};
  for (const std::string& d : dirs) argv.push_back(d.c_str());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(argv.size()) - 1;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "watchdog pipe");
  }
  // Started with every signal blocked, which it keeps (watchdog_loop.h).
  // A fork, not a vfork: the agent goes on at once instead of waiting for
  // the child to be scheduled and exec (a wait a loaded machine makes
  // long: +7-10 ms per launch at load 5-10); the child's copy of the
  // agent's memory goes at its exec.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) become_watchdog(p, program.c_str(), argv.data(), argc);
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
  // Made only now, by name: the watchdog already knows each name, so from
  // the moment a folder exists a killed agent leaves it to the watchdog.
  // The names not made (an error; EEXIST: someone else's) it forgets, each
  // at once, so that a kill of the agent right after leaves none of them
  // to the watchdog.
  std::vector<int> errnos(dirs.size(), 0);
  size_t made = dirs.size();
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (made == dirs.size()) {
      if (::mkdir(dirs[i].c_str(), 0700) == 0) {
        made = i;
        continue;
      }
      errnos[i] = errno;
    }
    send(kWatchdogForgetDir + static_cast<int>(i));
  }
  if (made == dirs.size() && !dirs.empty()) {
    throw std::runtime_error(temp_dir_error(dirs, errnos));
  }
  return made < dirs.size() ? dirs[made] : "";
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
  if (clean_ && groups_.empty() && !may_run_dlaunch(pid_)) {
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
