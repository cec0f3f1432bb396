#pragma once

#include <csignal>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "agent/env.h"
#include "agent/temp_dir.h"

namespace dlaunch::agent::testing {

// The value of `key` in a spawned worker's environment, "<unset>" if none.
std::string env_value(const ProcessSpec& spec, const std::string& key);

// What one fake worker does once "started".
struct Behaviour {
  std::chrono::milliseconds runs_for{10};  // then exits with `exit`
  ExitStatus exit{0, 0};
  bool never_exits = false;   // runs until signalled
  bool ignores_stop = false;  // SIGTERM/SIGINT/... do not end it
  bool stuck = false;         // not even SIGKILL ends it (D state)
  // SIGSTOP freezes any worker: it neither exits nor acts on signals but
  // SIGKILL.
  std::chrono::milliseconds stop_delay{
      1};                       // exits this long after a stop signal
  std::string error_file_text;  // written to TORCHELASTIC_ERROR_FILE on exit
};

// A deterministic Env for the agent's state machine: a virtual clock and an
// event queue; workers follow `behave`; signals to the agent come from
// raise_at(). run() fails the test (throws) when no event is left while the
// agent still waits: a hang in real life.
class FakeEnv : public Env {
 public:
  using ms = std::chrono::milliseconds;

  // Decides each spawned worker's behaviour; spawn_index counts all spawns.
  std::function<Behaviour(const ProcessSpec&, int spawn_index)> behave =
      [](const ProcessSpec&, int) { return Behaviour{}; };
  // When it returns true for a spec, spawn() throws SpawnError.
  std::function<bool(const ProcessSpec&)> fail_spawn = [](const ProcessSpec&) {
    return false;
  };

  // Everything the agent did.
  std::vector<ProcessSpec> spawned;
  struct Sent {
    ms at;
    int pid;
    int sig;
  };
  std::vector<Sent> signals_sent;

  // Delivers `sig` to the agent at virtual time `at`.
  void raise_at(ms at, int sig) {
    schedule(at - now_, [this, sig] {
      if (signal_handler_) signal_handler_(sig);
    });
  }
  ms virtual_now() const { return now_; }

  std::unique_ptr<Process> spawn(const ProcessSpec& spec,
                                 ExitCallback on_exit) override;
  std::unique_ptr<Timer> start_timer(ms delay,
                                     std::function<void()> fn) override;
  void handle_signals(const std::vector<int>& signals,
                      std::function<void(int)> handler) override {
    handled_signals = signals;
    signal_handler_ = std::move(handler);
  }
  std::vector<int> handled_signals;
  std::chrono::system_clock::time_point now() override {
    return std::chrono::system_clock::time_point(now_);
  }
  int free_port(const std::string&) override { return next_port_++; }
  // A real folder (agent/temp_dir.h), recorded as the watchdog's.
  std::filesystem::path make_temp_dir(
      std::vector<std::string> templates) override {
    orphan_dir = agent::make_temp_dir(std::move(templates));
    return orphan_dir;
  }
  std::filesystem::path orphan_dir;
  // Queued at the current virtual time (tests post from the run thread).
  void post(std::function<void()> fn) override {
    schedule(ms(0), std::move(fn));
  }
  // Deterministic: `work` runs at once, `done` is queued at the current
  // virtual time.
  void run_in_background(std::function<void()> work,
                         std::function<void()> done) override {
    work();
    schedule(ms(0), std::move(done));
  }
  void run() override;
  void stop() override { stopped_ = true; }

  // Queues `fn` at now + delay; returns its cancel flag.
  std::shared_ptr<bool> schedule(ms delay, std::function<void()> fn);

 private:
  ms now_{0};
  bool stopped_ = false;
  int next_port_ = 20000;
  int next_pid_ = 1000;
  uint64_t seq_ = 0;
  std::map<std::pair<ms, uint64_t>,
           std::pair<std::shared_ptr<bool>, std::function<void()>>>
      queue_;
  std::function<void(int)> signal_handler_;
};

}  // namespace dlaunch::agent::testing
