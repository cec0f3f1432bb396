// dlaunch-watchdog: the agent's watchdog as a small program of its own
// (agent/watchdog.h), started by dlaunch from its own folder with the
// read end of a pipe on fd 3: starting and ending it costs far less than a
// fork of dlaunch, whose copy of the agent's memory a loaded machine makes
// slow to tear down.
#include <sys/stat.h>

#include <cstdio>

#include "agent/watchdog_loop.h"

int main(int argc, char** argv) {
  using dlaunch::agent::kWatchdogPipeFd;
  struct stat st {};
  if (argc != 3 || ::fstat(kWatchdogPipeFd, &st) != 0 ||
      !S_ISFIFO(st.st_mode)) {
    std::fputs(
        "dlaunch-watchdog: dlaunch starts this program (ORPHAN_DIR TAG, its "
        "pipe on fd 3); it is not run by hand\n",
        stderr);
    return 2;
  }
  dlaunch::agent::run_watchdog(kWatchdogPipeFd, argv[1], argv[2]);
}
