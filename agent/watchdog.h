#pragma once

#include <sys/types.h>

#include <filesystem>

namespace dlaunch::agent {

// A tiny process, forked from the agent and in a session of its own, that
// SIGKILLs every registered process group once the agent is gone (its pipe
// from the agent reaches end-of-file), so workers' children cannot outlive
// a SIGKILLed agent (PR_SET_PDEATHSIG only covers the workers themselves),
// and then removes the agent's temporary folder if it was given one.
// Owned by PosixEnv; single-threaded.
class Watchdog {
 public:
  Watchdog() = default;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Closes the pipe (the watchdog kills whatever is still registered) and
  // reaps it, waiting at most one second.
  ~Watchdog();

  // Forks the watchdog; `orphan_dir` (may be empty) is removed with its
  // contents once the agent is gone (already gone after a clean exit).
  // Throws std::system_error.
  void start(const std::filesystem::path& orphan_dir);
  bool started() const { return write_fd_ >= 0; }
  void add_group(pid_t pgid) { send(pgid); }
  void remove_group(pid_t pgid) { send(-pgid); }

 private:
  void send(int value);

  int write_fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace dlaunch::agent
