#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dlaunch::agent {

// How a process ended: an exit code, or the signal that killed it.
struct ExitStatus {
  int code = 0;    // exit code when signal == 0
  int signal = 0;  // terminating signal, 0 when it exited

  bool ok() const { return signal == 0 && code == 0; }
  // The shell's convention: the code, or 128 + signal.
  int shell_code() const { return signal != 0 ? 128 + signal : code; }
  // "exit code 3" or "signal SIGKILL (9)".
  std::string describe() const;
  // Decodes a waitpid() status.
  static ExitStatus from_wait_status(int status);
};

// "SIGTERM" for 15; "signal 42" for numbers without a name.
std::string signal_name(int sig);

// Where one standard stream of a worker goes. Both unset: /dev/null.
struct StreamTarget {
  // Console fd (1 or 2) that receives the stream's whole lines, each with
  // ProcessSpec::prefix; -1: not shown on the console.
  int console_fd = -1;
  // Log file that receives the stream as written (no prefix), created or
  // truncated at spawn; empty: none.
  std::filesystem::path file;
};

// Everything needed to start one worker.
struct ProcessSpec {
  std::string executable;         // path passed to execve
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // the complete environment, "KEY=VALUE"
  std::string prefix;             // prepended to each console line
  StreamTarget out;               // stdout
  StreamTarget err;               // stderr
  // >= 0: the process runs only on core number core_slot mod N of the N
  // cores the agent may run on (--cpu-bind core); -1: wherever the agent
  // may (default).
  int core_slot = -1;
};

// A failure to start a process (fork, exec, open of a log file).
class SpawnError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A started worker. Destroying it never blocks and never kills: the owner
// stops it first (signal_group) and waits for its exit callback.
class Process {
 public:
  virtual ~Process() = default;
  virtual int pid() const = 0;
  // Sends `sig` to the worker's whole process group (itself and its
  // children). A group already gone is not an error.
  virtual void signal_group(int sig) = 0;
  // Why a log file of this worker is incomplete: the first failed write,
  // "PATH: No space left on device"; empty when every byte was written.
  virtual std::string log_error() const = 0;
};

// A pending callback; destroying it cancels the callback.
class Timer {
 public:
  virtual ~Timer() = default;
};

// The OS services the agent's state machine depends on, in LevelDB's Env
// style: the real one (posix_env.h) runs an event loop over real processes;
// tests substitute a deterministic fake with a virtual clock. Every callback
// runs on the thread inside run(), one at a time.
class Env {
 public:
  using ExitCallback = std::function<void(ExitStatus)>;

  virtual ~Env() = default;

  // Starts a process in its own process group that dies with the agent.
  // `on_exit` runs once, after the process has exited and its output has
  // been drained; its remaining group members are SIGKILLed at that moment.
  // Throws SpawnError.
  virtual std::unique_ptr<Process> spawn(const ProcessSpec& spec,
                                         ExitCallback on_exit) = 0;
  // Runs `fn` after `delay` unless the returned Timer is destroyed first.
  virtual std::unique_ptr<Timer> start_timer(std::chrono::milliseconds delay,
                                             std::function<void()> fn) = 0;
  // Routes the given signals to `handler` for as long as run() runs.
  virtual void handle_signals(const std::vector<int>& signals,
                              std::function<void(int)> handler) = 0;
  // Wall-clock time, for reports (durations are timers' business).
  virtual std::chrono::system_clock::time_point now() = 0;
  // A TCP port that is free on `host` right now (bind port 0, read, close).
  virtual int free_port(const std::string& host) = 0;
  // Makes a folder of the agent's own that must not outlive it, from the
  // first of `templates` (mkdtemp's, each ending in XXXXXX) that works,
  // and returns it: removed, with what it holds, if the agent dies
  // (SIGKILL) without removing it, at any moment from the folder's
  // creation on. Throws std::runtime_error naming each template and why it
  // failed (temp_dir_error()), SpawnError when nothing could remove it.
  // Call once, before the first spawn.
  virtual std::filesystem::path make_temp_dir(
      std::vector<std::string> templates) = 0;
  // Runs `fn` on the thread inside run(), soon. The one method any thread
  // may call (a rendezvous watcher delivers its event this way); `fn` is
  // dropped unrun if run() never dispatches it.
  virtual void post(std::function<void()> fn) = 0;
  // Runs `work` on a thread of the Env's own, then `done` on the thread
  // inside run() (as post() does), so that a call that may block for long
  // (waiting for the other nodes) leaves signals and timers served. One at
  // a time: call again only after `done` ran. The Env's destructor waits
  // for `work` to return.
  virtual void run_in_background(std::function<void()> work,
                                 std::function<void()> done) = 0;
  // Dispatches callbacks until stop() is called.
  virtual void run() = 0;
  // Makes run() return once the current callback finishes.
  virtual void stop() = 0;
};

}  // namespace dlaunch::agent
