#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/rendezvous/rendezvous.h"

namespace dlaunch::agent::rendezvous {

// A rendezvous served by a helper program that the agent starts and talks
// to over a socket pair (remote_wire.h): the etcd backend, whose gRPC
// client would slow every launch if linked into dlaunch
// (docs/performance.md). The helper gets end-of-file when the agent dies,
// even by SIGKILL, and then leaves the rendezvous at once. Threads: the
// agent's thread (or its Env's background thread) calls the methods,
// interrupt() any thread; a reader thread delivers watch()'s
// event.
class RemoteRendezvous : public Rendezvous {
 public:
  using MessageSink = std::function<void(const std::string&)>;

  struct Params {
    std::string program;  // the helper's path
    // The helper's settings (its "open" message; never on its command
    // line, so a password stays out of ps).
    std::map<std::string, std::string> settings;
    MessageSink log;  // the helper's progress lines, from the agent's thread
    // How long the helper may take to start and connect. Default 600 s.
    std::chrono::milliseconds open_timeout{std::chrono::seconds(600)};
    // Added to each next_round()'s timeout, which the helper enforces
    // itself, before the agent gives up on it. Default 60 s.
    std::chrono::milliseconds grace{std::chrono::seconds(60)};
    // How long the helper may take to leave at the end. Default 30 s.
    std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
    // How often a thread of the agent pings the helper ("alive"), which
    // stops keeping this node in the rendezvous when the pings stop (the
    // agent frozen); settings["agent_silence"] says after how long. Zero:
    // no pings. Default none.
    std::chrono::milliseconds ping_every{0};
  };

  // Starts the helper (in a process group of its own: a Ctrl-C for the
  // agent does not reach it) and sends it the settings; the helper
  // connects meanwhile, and the first next_round() waits for it (at most
  // open_timeout) and throws RendezvousError with its message. Throws
  // RendezvousError when the helper cannot start.
  explicit RemoteRendezvous(Params params);
  // Closes the socket (the helper leaves and exits) and reaps the helper,
  // SIGKILLing it after close_timeout.
  ~RemoteRendezvous() override;

  RendezvousResult next_round(int local_world_size, RoundReason reason,
                              std::chrono::milliseconds timeout) override;
  void watch(EventCallback on_event) override;
  void report(NodeOutcome outcome) override;
  // Passes the cut fault on to the helper, which stops renewing this
  // node's liveness there for `d`.
  bool cut_off(std::chrono::milliseconds d) override;
  // Asks the helper, waiting at most 2 s; empty when it cannot say.
  std::vector<std::string> unfinished_nodes() override;
  bool may_wait() const override { return true; }
  void interrupt() override;

 private:
  void send(const std::vector<std::string>& fields);
  // Waits for the helper's answer to "open", once.
  void await_open();
  // Waits for the helper's answer (ready, round or error).
  std::vector<std::string> answer(std::chrono::milliseconds timeout,
                                  const std::string& waiting_for);
  void read_loop();
  // Writes the helper's queued log lines (from the agent's thread: the
  // console is not to be written from the reader's).
  void flush_logs();
  // The destructor's work: the helper leaves, is reaped, the fd closed.
  void close();
  void ping_loop();

  Params p_;
  int fd_ = -1;
  std::mutex send_mu_;  // one line at a time: the pinger sends too
  std::thread pinger_;
  bool stop_pinging_ = false;  // guarded by mu_
  pid_t pid_ = -1;
  std::thread reader_;
  bool opened_ = false;  // the helper answered "ready" (agent's thread)
  std::mutex mu_;        // guards everything below
  std::condition_variable cv_;
  std::optional<std::vector<std::string>> answer_;
  std::vector<std::string> logs_;  // the helper's lines, not yet written
  EventCallback on_event_;         // set by watch(), taken by the event
  int watched_round_ = -1;
  bool gone_ = false;         // the helper closed its end
  bool interrupted_ = false;  // interrupt() was called
  // unfinished_nodes() waits for its answer (a late one is dropped).
  bool want_unfinished_ = false;
};

}  // namespace dlaunch::agent::rendezvous
