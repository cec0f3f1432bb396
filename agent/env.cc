#include "agent/env.h"

#include <sys/wait.h>

#include <csignal>
#include <cstring>

namespace dlaunch::agent {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev == nullptr) return "signal " + std::to_string(sig);
  return std::string("SIG") + abbrev;
}

std::string ExitStatus::describe() const {
  if (signal != 0) {
    return "signal " + signal_name(signal) + " (" + std::to_string(signal) +
           ")";
  }
  return "exit code " + std::to_string(code);
}

ExitStatus ExitStatus::from_wait_status(int status) {
  if (WIFSIGNALED(status)) return ExitStatus{0, WTERMSIG(status)};
  return ExitStatus{WEXITSTATUS(status), 0};
}

}  // namespace dlaunch::agent
