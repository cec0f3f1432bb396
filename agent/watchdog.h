#pragma once

#include <sys/types.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

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

  // Starts the watchdog, in a session of its own, with `tag` ("K=V", may
  // be empty) marking the environment of processes to SIGKILL if the agent
  // dies; then makes the agent's temporary folder from the first of
  // `dir_templates` (mkdtemp's, each ending in XXXXXX) that works. The
  // watchdog gets the folders' names before any exists and removes the
  // one made, with its contents, once the agent is gone: no moment exists
  // when the folder is there and a killed agent would leave it. Returns
  // that folder ("" without templates). Throws std::system_error when the
  // watchdog cannot start, std::runtime_error (temp_dir_error()) when no
  // template worked: then it runs without a folder.
  std::string start(const std::string& tag,
                    std::vector<std::string> dir_templates = {});
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

// Whether process `pid` may run dlaunch's own binary (a fork of dlaunch
// that has not exec'd, which holds the binary busy), from `proc`'s PID/exe
// and self/exe links: false once it has exited (no PID/exe) or when it
// runs another binary; true when they match, and when either link cannot
// be read otherwise (unknown: ~Watchdog then waits its bounded second).
bool may_run_dlaunch(pid_t pid, const std::filesystem::path& proc = "/proc");

}  // namespace dlaunch::agent
