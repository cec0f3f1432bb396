#pragma once

// The watchdog's own code (agent/watchdog.h), shared by the program
// dlaunch-watchdog and the fork of dlaunch that stands in for it when that
// program is not beside dlaunch: nothing of the agent's, so the program
// stays small.

namespace dlaunch::agent {

// Written by the agent before its pipe closes: it ended its strays itself.
inline constexpr int kWatchdogCleanStop = 0;
// Where dlaunch-watchdog finds the read end of the agent's pipe.
inline constexpr int kWatchdogPipeFd = 3;

// Runs the watchdog until the agent's pipe (`read_fd`) reaches end-of-file,
// every fd but stdio and `read_fd` closed; then SIGKILLs
// the process groups still registered (ints written to the pipe: pgid to
// add, -pgid to remove), and, unless kWatchdogCleanStop came, every process
// whose environment holds `tag` ("K=V"; "" for none); then removes
// `orphan_dir` ("" for none) with its contents, and exits. Catchable
// signals are expected blocked by the caller, and stay so; the caller also
// made it a session of its own with stdio on /dev/null (the agent's
// become_watchdog, before the exec that starts dlaunch-watchdog).
[[noreturn]] void run_watchdog(int read_fd, const char* orphan_dir,
                               const char* tag);

}  // namespace dlaunch::agent
