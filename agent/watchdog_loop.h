#pragma once

// The watchdog's own code (agent/watchdog.h), shared by the program
// dlaunch-watchdog and the fork of dlaunch that stands in for it when that
// program is not beside dlaunch: nothing of the agent's, and system calls only,
// no C library function (watchdog_sys.h), so the program stays small and quick
// to start.

namespace dlaunch::agent {

// Written by the agent before its pipe closes: it ended its strays itself.
inline constexpr int kWatchdogCleanStop = 0;
// Where dlaunch-watchdog finds the read end of the agent's pipe.
inline constexpr int kWatchdogPipeFd = 3;
// Written by the agent for the i-th folder name it gave the watchdog and
// did not make (pgids stay below: PID_MAX_LIMIT is 2^22).
inline constexpr int kWatchdogForgetDir = 1 << 30;
// The most folder names the agent gives the watchdog.
inline constexpr int kWatchdogMaxDirs = 8;
// The watchdog's program name, and its argv[0].
inline constexpr const char* kWatchdogProgram = "dlaunch-watchdog";

// dlaunch-watchdog's main: TAG DIR..., the agent's pipe on
// kWatchdogPipeFd, as the agent's become_watchdog starts it (then
// run_watchdog()); anything else is refused with exit 2 and a line saying
// it is not run by hand.
int watchdog_main(int argc, char** argv);

// Runs the watchdog until the agent's pipe (`read_fd`) reaches end-of-file,
// every fd but stdio and `read_fd` closed; then SIGKILLs
// the process groups still registered (ints written to the pipe: pgid to
// add, -pgid to remove), and, unless kWatchdogCleanStop came, every process
// whose environment holds `tag` ("K=V"; "" for none); then removes each
// of the `n_dirs` folders `dirs` (the agent's temporary folder) not
// forgotten (kWatchdogForgetDir + i), with its contents, and exits. Catchable
// signals are expected blocked by the caller, and stay so; the caller also
// made it a session of its own with stdio on /dev/null (the agent's
// become_watchdog, before its exec).
[[noreturn]] void run_watchdog(int read_fd, const char* tag,
                               const char* const* dirs, int n_dirs);

}  // namespace dlaunch::agent
