#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "launcher/agent_launcher.h"

namespace dlaunch::launcher {

// How a CommandRunner treats its commands' output.
enum class CommandOutput {
  kCapture,  // kept per command (pre-flight, teardown), not shown
  kShow,     // shown on the head's stdout/stderr, each line whole, the
             // host name before it ("node02 [default1]:hi")
};

// How one command ended.
struct CommandResult {
  bool started = false;  // false: it could not be spawned (see `out`)
  bool exited = false;   // false: still running when a wait timed out
  int exit_code = -1;    // its status; 128+N when killed by signal N
  std::string out, err;  // with kCapture
  // A command for many hosts (pdsh): those it reported ended with a status
  // other than 0 while it runs, with that status, in the order reported.
  std::vector<std::pair<std::string, int>> failed_hosts;
};

// Runs the head's local processes that reach the hosts (AgentCommand:
// ssh, pdsh, local agents) on a thread of its own: writes each one's
// stdin, pumps its output whole-line, reaps it. The children die with
// that thread (PR_SET_PDEATHSIG). Methods may be called from any thread;
// the destructor SIGKILLs and reaps what is still running.
class CommandRunner {
 public:
  CommandRunner(std::vector<AgentCommand> commands, CommandOutput output);
  ~CommandRunner();
  CommandRunner(const CommandRunner&) = delete;
  CommandRunner& operator=(const CommandRunner&) = delete;

  // Waits until every command exited or `timeout` passed; true when all
  // exited. `on_exit`, when set, is called (on the runner's thread) with
  // each command's index as it exits.
  bool wait(std::chrono::milliseconds timeout);
  // Waits until any command exits with a status other than 0, or all
  // exited, or interrupt() is called, or `timeout`. Returns the index of
  // the failed one, or -1.
  int wait_failure_or_end(std::chrono::milliseconds timeout);
  // Ends every wait_failure_or_end(), now and later (a signal stops the
  // job). Safe from any thread.
  void interrupt();
  // Closes every command's stdin: for agents reading it, the head is gone.
  void close_stdins();
  // Sends `sig` to every command still running.
  void signal_all(int sig);
  // The commands' results so far, in order.
  std::vector<CommandResult> results() const;
  const std::vector<AgentCommand>& commands() const { return commands_; }

 private:
  struct Impl;
  std::vector<AgentCommand> commands_;
  std::unique_ptr<Impl> impl_;
};

// Splits srun --label's "N: " (spaces before N allowed) off `line`: sets
// `task` to N and returns the rest; without a label sets -1 and returns
// `line` whole.
std::string_view task_label(std::string_view line, int& task);

// The hosts `command` lost so far, with their status, as `result` says:
// those a command for many hosts (pdsh) reported failed; else, once it
// ended in failure or could not start (status 1), all of its hosts.
std::vector<std::pair<std::string, int>> lost_hosts(
    const AgentCommand& command, const CommandResult& result);

// The name pdsh writes for `host` when it serves several hosts of one
// domain: cut at its first dot, unless it starts with a digit (an
// address).
std::string pdsh_short_name(const std::string& host);

// The length of `line`'s leading "HOST: " for one of `hosts`, whole or as
// pdsh_short_name() writes it, setting `host` to the name as given; 0 when
// none.
size_t pdsh_host_prefix(const std::vector<std::string>& hosts,
                        std::string_view line, std::string& host);

}  // namespace dlaunch::launcher
