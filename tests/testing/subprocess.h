#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dlaunch::testing {

// How a test starts a program.
struct CommandOptions {
  std::vector<std::string> argv;  // argv[0] is a path or a name in PATH
  // Set on top of the test's environment ("" values are set, not removed).
  std::map<std::string, std::string> env;
  std::vector<std::string> unset_env;  // removed from the environment
  std::string cwd;                     // empty: the test's own
  // When >= 0, the child's stdout (stderr) is this fd instead of a pipe the
  // test captures: a pipe nobody reads, one whose reader is gone.
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// How a program ended, with everything it wrote.
struct CommandResult {
  int exit_code = -1;  // -1 when killed by a signal or timed out
  int signal = 0;      // terminating signal, 0 when it exited
  bool timed_out = false;
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
};

// A child process with its stdout and stderr captured through pipes
// (stdin is /dev/null). Every wait is bounded; the destructor SIGKILLs and
// reaps a child still running. One thread at a time.
class Subprocess {
 public:
  explicit Subprocess(const CommandOptions& options);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until stdout+stderr contain `text` (true) or `timeout`
  // passes or the child closes both pipes (false).
  bool wait_for_output(const std::string& text,
                       std::chrono::milliseconds timeout);
  void signal(int sig);
  // Waits for the exit, reading output; after `timeout` SIGKILLs the child
  // and reports timed_out.
  CommandResult wait(std::chrono::milliseconds timeout);
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  // Reads what is available for at most `budget`; false when both pipes
  // are closed.
  bool pump(std::chrono::milliseconds budget);

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
  std::optional<CommandResult> result_;
  std::chrono::steady_clock::time_point start_;
};

// Runs a program to the end (or `timeout`) and returns what happened.
CommandResult run_command(
    const CommandOptions& options,
    std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Waits at most `timeout` for child `pid` to exit and reaps it, returning
// its waitpid() status; after the timeout SIGKILLs and reaps it and returns
// nullopt. For tests that fork() themselves: no unbounded waitpid.
std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout);

// True while `pid` exists (zombies count as gone).
bool process_alive(pid_t pid);

// The state letter of /proc/PID/stat ('R' running, 'S' sleeping, 'T'
// stopped, 'Z' zombie, ...; '?' when there is no such process). A thread's
// id works too.
char process_state(pid_t pid);

// The whole of a /proc file (environ, cmdline, stat, ...); "" when it
// cannot be read. A process that exits while it is read makes read() fail
// (ESRCH), which an ifstream turns into an exception, hence this.
std::string read_proc_file(const std::string& path);

// The live processes whose environment (as they started) holds `entry`
// ("NAME=VALUE"), read from /proc: a test marks a job's processes with a
// variable of its own and finds them by it.
std::vector<pid_t> processes_with_env(const std::string& entry);

// Marked processes: a test gives every process of one run the variable
// DLT_MARK=MARK (dlaunch -x, or the worker's environment; children inherit
// it) and finds them by it in /proc, never by name, so that tests running
// at the same time never see or stop each other's processes.
//
// A fresh MARK: `prefix`, a random number and this test process's pid.
std::string unique_mark(const std::string& prefix);
// The live processes carrying DLT_MARK=`mark`.
std::vector<pid_t> marked(const std::string& mark);
// Waits at most `bound` until no process carries `mark`; true when none
// does (a process is gone a moment after its group's signal).
bool none_marked(const std::string& mark, std::chrono::milliseconds bound);

// Waits until `done()` holds, checking every `poll`, for at most `bound`;
// true when it does. For state no event announces (another process's
// exit, a cluster's answer).
bool eventually(const std::function<bool()>& done,
                std::chrono::milliseconds bound,
                std::chrono::milliseconds poll = std::chrono::milliseconds(50));

// "exit N", then the program's stdout and stderr under headers: a failed
// assertion's message about a run.
std::string describe(const CommandResult& r);

// The pids of `pid`'s live descendants (children, grandchildren, ...),
// read from /proc.
std::vector<pid_t> descendants(pid_t pid);

// The TCP ports `pid` listens on (its socket inodes matched against
// /proc/net/tcp{,6} LISTEN entries).
std::set<int> listening_ports(pid_t pid);

// A FIFO that workers block on (`read x < PATH` in their script) until the
// test lets one of them go: synchronisation on observed state, no sleeps.
// The test holds it open read-write, so neither side's open() blocks.
class Gate {
 public:
  explicit Gate(const std::string& path);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  const std::string& path() const { return path_; }
  // Lets one `read` through.
  void open_once();

 private:
  std::string path_;
  int fd_ = -1;
};

// A worker script for multi-node tests (NODE=i in each agent's
// environment): prints RC=$TORCHELASTIC_RESTART_COUNT; node 0's worker then
// waits at `gate`, the others end at once.
inline std::string restart_count_then_node0_waits(const Gate& gate) {
  return "echo RC=$TORCHELASTIC_RESTART_COUNT; if [ $NODE = 0 ]; then read x "
         "< " +
         gate.path() + "; fi";
}

}  // namespace dlaunch::testing
