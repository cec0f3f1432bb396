#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>

#include "agent/env.h"

namespace dlaunch::agent {

// Writes all of `data` to `fd`, retrying short writes, EINTR and EAGAIN (as
// a blocking write would); false (errno set) on any other error.
bool write_all(int fd, std::string_view data);

// This machine's host name (gethostname); "localhost" when it has none.
std::string host_name();

// Whether process `pid`'s environment (/proc/PID/environ) holds the entry
// `entry` ("K=V"); false when it cannot be read.
bool environ_has(pid_t pid, const std::string& entry);

// environ_has() that tells "cannot say": kUnknown when the environment
// reads empty (kAbsent when it cannot be opened: another user's
// non-dumpable process, or one gone). A process in the middle of execve
// reads empty until the new program's stack is set up (as do zombies,
// kernel threads and processes started with an empty environment).
enum class EnvironEntry { kAbsent, kPresent, kUnknown };
EnvironEntry environ_entry(pid_t pid, const std::string& entry);

// For a child between fork and exec (async-signal-safe): SIGKILL it when
// `parent` dies, or now if `parent` died before this call.
void die_with_parent(pid_t parent);

// RLIMIT_NOFILE as dlaunch was started with (read before main): the
// embedded store and the agent raise their own, workers and the agents a
// multi-host head starts get this one back.
const rlimit& user_fd_limit();

// The agent, reaper of every orphan below it, takes each child it adopted
// for a stray of its workers, and kills it when the group ends, unless it
// is a worker, the watchdog, a helper named by helper_started(), or a child
// the process had before its PosixEnv was made. A process that also runs
// commands whose own children may be orphaned to it (the multi-host head's
// ssh, pdsh, srun: an ssh ControlPersist master) calls
// commands_may_orphan() first; its agent, like one whose process had
// children before or that is a PID namespace's init, then takes only the
// adopted children that carry DLAUNCH_AGENT_TAG. Thread-safe.
void commands_may_orphan();
// `pid` is a helper this process started (the rendezvous helper), never a
// stray; helper_gone() once it is reaped, as its pid may come back.
void helper_started(pid_t pid);
void helper_gone(pid_t pid);

// The real Env: one Boost.Asio event loop (epoll) over pidfds (exits),
// worker output pipes and a signal_set; no polling, so the agent sleeps
// while its workers run. Workers are started with Boost.Process v2, each in
// its own process group with PR_SET_PDEATHSIG=SIGKILL and
// DLAUNCH_AGENT_TAG=<unique> in its environment; the agent is their
// children's subreaper, and when no worker is left running it SIGKILLs
// every stray it adopted (children that left their group; see
// commands_may_orphan()) with its descendants.
// A watchdog process (dlaunch-watchdog in its own session, started by
// make_temp_dir(), whose folder it removes, or by the first spawn;
// agent/watchdog.h) SIGKILLs every worker's process group, and every
// tagged process, if the agent dies without stopping them. Output is teed to
// log files as it arrives and queued as whole, prefixed lines for the console's
// own writer thread (agent/console.h), so a stalled console never blocks the
// loop; SIGPIPE is ignored. Single-threaded: call everything from the thread
// that calls run() (post() from any); run_in_background()'s work runs on a
// thread the env owns and joins.
class PosixEnv : public Env {
 public:
  // Records the open-file limit now: workers get it back even when
  // something in dlaunch (the embedded store) raises dlaunch's own later.
  PosixEnv();
  // Gives the console at most the drain timeout to take what is queued.
  ~PosixEnv() override;

  std::unique_ptr<Process> spawn(const ProcessSpec& spec,
                                 ExitCallback on_exit) override;
  std::unique_ptr<Timer> start_timer(std::chrono::milliseconds delay,
                                     std::function<void()> fn) override;
  void handle_signals(const std::vector<int>& signals,
                      std::function<void(int)> handler) override;
  std::chrono::system_clock::time_point now() override;
  int free_port(const std::string& host) override;
  std::filesystem::path make_temp_dir(
      std::vector<std::string> templates) override;
  void post(std::function<void()> fn) override;
  void run_in_background(std::function<void()> work,
                         std::function<void()> done) override;
  void run() override;
  void stop() override;

  // How long a worker's output is still read after it exited, waiting for
  // children that hold its pipes; also how long the console gets, when the
  // env is destroyed, to take what is queued for it. Default 2 s.
  void set_drain_timeout(std::chrono::milliseconds t);

  // Queues the agent's own text for the console (fd 1 or 2), in order with
  // the workers' lines; never blocks.
  void write_console(int fd, std::string_view text);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch::agent
