#pragma once

// The watchdog's own code (agent/watchdog.h), shared by the program
// dlaunch-watchdog and dlaunch itself, which stands in for it when started
// under that name (the agent does so where the program is not beside
// dlaunch): nothing of the agent's, and system calls only, no C library
// function (watchdog_sys.h), so the program stays small and quick to start.

namespace dlaunch::agent {

// Written by the agent before its pipe closes: it ended its strays itself.
inline constexpr int kWatchdogCleanStop = 0;
// Where dlaunch-watchdog finds the read end of the agent's pipe.
inline constexpr int kWatchdogPipeFd = 3;
// The watchdog's program name, and its argv[0] (dlaunch's stand-in too).
inline constexpr const char* kWatchdogProgram = "dlaunch-watchdog";

// Whether a program started as `argv0` is to run as the watchdog: its
// last path component is kWatchdogProgram.
bool called_as_watchdog(const char* argv0);

// dlaunch-watchdog's main: ORPHAN_DIR TAG, the agent's pipe on
// kWatchdogPipeFd, as the agent's become_watchdog starts it (then
// run_watchdog()); anything else is refused with exit 2 and a line saying
// it is not run by hand.
int watchdog_main(int argc, char** argv);

// Runs the watchdog until the agent's pipe (`read_fd`) reaches end-of-file,
// every fd but stdio and `read_fd` closed; then SIGKILLs
// the process groups still registered (ints written to the pipe: pgid to
// add, -pgid to remove), and, unless kWatchdogCleanStop came, every process
// whose environment holds `tag` ("K=V"; "" for none); then removes
// `orphan_dir` ("" for none) with its contents, and exits. Catchable
// signals are expected blocked by the caller, and stay so; the caller also
// made it a session of its own with stdio on /dev/null (the agent's
// become_watchdog, before its exec).
[[noreturn]] void run_watchdog(int read_fd, const char* orphan_dir,
                               const char* tag);

}  // namespace dlaunch::agent
