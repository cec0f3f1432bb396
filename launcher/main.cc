// The `dlaunch` command; everything lives in dlaunch::launcher. Started
// as dlaunch-watchdog (by its own agent, where that program is missing
// beside it), it runs the watchdog instead (agent/watchdog.h).
#include "agent/watchdog_loop.h"
#include "launcher/launcher.h"

int main(int argc, char** argv) {
  if (argc > 0 && dlaunch::agent::called_as_watchdog(argv[0])) {
    return dlaunch::agent::watchdog_main(argc, argv);
  }
  return dlaunch::launcher::main(argc, argv);
}
