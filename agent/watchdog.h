#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>

namespace dlaunch::agent {

// The process that makes sure nothing of the agent's outlives it: started
// by the agent (in a session of its own), it SIGKILLs every registered
// process group once the agent is gone (its pipe from the agent reaches
// end-of-file), so workers' children cannot outlive a SIGKILLed agent
// (PR_SET_PDEATHSIG only covers the workers themselves, and they may clear
// it); then every process whose environment carries the agent's tag
// (children that left their group, found in /proc), unless the agent said
// it stopped cleanly; then removes the agent's temporary folder if it was
// given one. It is the small program dlaunch-watchdog beside dlaunch
// (/proc/self/exe's folder), or a fork of dlaunch where that is missing
// (the same code, agent/watchdog_loop.h; slower to start and to end).
// Owned by PosixEnv; single-threaded.
class Watchdog {
 public:
  Watchdog() = default;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Closes the pipe (the watchdog kills whatever is still registered) and
  // reaps it, waiting at most one second (it ends at once: nothing of
  // dlaunch's outlives dlaunch, and a fork would hold its binary busy).
  ~Watchdog();

  // Starts the watchdog; `orphan_dir` (may be empty) is removed with its
  // contents once the agent is gone (already gone after a clean exit);
  // `tag` ("K=V", may be empty) marks the environment of processes to
  // SIGKILL if the agent dies. Throws std::system_error.
  void start(const std::filesystem::path& orphan_dir, const std::string& tag);
  bool started() const { return write_fd_ >= 0; }
  pid_t pid() const { return pid_; }
  // False (errno set) when the watchdog cannot be told: it is gone, and a
  // SIGKILLed agent would leave that group behind.
  bool add_group(pid_t pgid) { return send(pgid); }
  bool remove_group(pid_t pgid) { return send(-pgid); }
  // The agent has ended every worker and stray itself: the watchdog skips
  // its /proc scan when the pipe closes.
  void stopped_cleanly();

 private:
  bool send(int value);

  int write_fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace dlaunch::agent
