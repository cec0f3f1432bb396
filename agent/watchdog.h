#pragma once

#include <sys/types.h>

#include <filesystem>
#include <set>
#include <string>

namespace dlaunch::agent {

// The process that outlives a killed agent to clean up after it: once the
// agent's pipe reaches end-of-file it SIGKILLs every registered process
// group (workers' children; PR_SET_PDEATHSIG covers only workers that keep
// it), then, unless the agent stopped cleanly, every process with the
// agent's tag (children that left their group), then removes the agent's
// temporary folder. The program dlaunch-watchdog beside dlaunch, or a fork
// of dlaunch where that is missing. Owned by PosixEnv; single-threaded.
class Watchdog {
 public:
  Watchdog() = default;
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Closes the pipe (the watchdog kills whatever is still registered) and
  // reaps it, waiting at most one second (it ends at once) unless it was
  // told a clean stop, no group is registered and it runs dlaunch-watchdog:
  // then it has nothing left to do and holds nothing of dlaunch's (a fork
  // of dlaunch holds dlaunch's binary busy while it lives).
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
  bool add_group(pid_t pgid);
  bool remove_group(pid_t pgid);
  // The agent has ended every worker and stray itself: the watchdog skips
  // its /proc scan when the pipe closes.
  void stopped_cleanly();

 private:
  bool send(int value);

  int write_fd_ = -1;
  pid_t pid_ = -1;
  bool clean_ = false;      // stopped_cleanly() told it
  std::set<pid_t> groups_;  // registered, not yet removed
};

}  // namespace dlaunch::agent
