#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/env.h"
#include "agent/options.h"
#include "agent/progress_files.h"
#include "agent/rendezvous/rendezvous.h"
#include "agent/run_record.h"
#include "agent/worker_env.h"

namespace dlaunch::agent {

// A fresh run id (TORCHELASTIC_RUN_ID) when --rdzv-id is not given: 12
// random hex digits.
std::string random_run_id();

// The node agent's state machine: runs a group of workers through
// rendezvous rounds, watches their exits, stops the group on the first
// failure (SIGTERM, SIGKILL after term_timeout) and restarts it while
// restarts remain, forwards signals, and writes the failure report and
// summary.json. All OS access goes through `env`, so tests drive it with a
// fake; one thread calls run(), which returns when the job is over.
class Agent {
 public:
  // Receives the agent's own messages (notes, restarts, the failure
  // report); the real command writes them to stderr.
  using MessageSink = std::function<void(const std::string&)>;

  // `base_env` is what workers inherit (the agent's environment);
  // `env` and `rdzv` must outlive the agent.
  Agent(AgentOptions options, Env& env, rendezvous::Rendezvous& rdzv,
        EnvMap base_env, MessageSink sink);
  ~Agent();

  // Runs the job to the end. Call once.
  RunResult run();

 private:
  // kRendezvous: waiting for a round to form (no workers);
  // kBarrier: this node's workers succeeded; waiting for the other nodes'.
  enum class State { kRendezvous, kRunning, kStopping, kBarrier, kDone };
  // How the last next_round() ended, handed from the Env's background
  // thread to the loop.
  struct RoundOutcome {
    std::optional<rendezvous::RendezvousResult> round;
    std::string closed;  // the job had finished: why there is nothing to do
    std::string error;   // the round could not form
    bool interrupted = false;
  };
  // What to do once the stopping group is down.
  enum class Next { kRestart, kRound, kFinish };

  // Signals, the first attempt and the event loop until the job is over.
  void run_job();
  // Joins the next round (off the loop when it may wait), then
  // round_formed() starts the workers.
  void start_attempt(rendezvous::RoundReason reason);
  void round_formed();
  // An event from the rendezvous, on the loop thread.
  void on_round_event(const rendezvous::RoundEvent& e);
  // False when the worker could not be started.
  bool spawn_worker(size_t i, const rendezvous::RendezvousResult& round);
  void on_exit(size_t i, ExitStatus status);
  // Indices of workers started and not yet exited.
  std::vector<size_t> running();
  void signal_running(int sig);
  void stop_group(int sig);
  void on_term_timeout();
  void on_kill_timeout();
  void on_signal(int sig);
  void group_stopped();
  // Removes what this attempt's workers, all gone now, left in /dev/shm
  // (comm::attempt_shm_prefix): ranks killed while setting up shared
  // memory, before their names were unlinked.
  void remove_attempt_shm();
  // The round spent more restarts than allowed: ends the job with the root
  // cause's code (or 1 and `cause`, the failure seen on another node).
  void give_up(const std::string& cause);
  void finish(int exit_code);
  // Faults: an error when one names a rank or node outside `round`
  // (false: the job is finished); then timers for those of this node.
  bool check_faults(const rendezvous::RendezvousResult& round);
  void schedule_faults(const rendezvous::RendezvousResult& round);
  void fire_fault(size_t k);
  // The group is failing: fired faults of this attempt are detected.
  void note_detected();
  // Records the DLAUNCH_COMM_FAULTS fault that fired in local rank `i`, if
  // any (once per worker), marking the worker injected when it failed.
  void note_comm_fault(size_t i);
  // Hang detection: one tick of the progress timer.
  void start_hang_watch();
  void on_hang_tick();
  void make_run_dir();
  // Whether --redirects or --tee sends any stream to a log file.
  bool writes_logs() const;
  void write_summary();
  // The run's failure into the launcher's own TORCHELASTIC_ERROR_FILE
  // (base env), when set and the run failed (launcher_error_json).
  void write_launcher_error_file();
  AttemptRecord& attempt() { return result_.attempts.back(); }

  AgentOptions options_;
  Env& env_;
  rendezvous::Rendezvous& rdzv_;
  EnvMap base_env_;
  MessageSink sink_;

  State state_ = State::kRunning;
  std::string executable_;
  bool temp_run_dir_ = false;
  int restart_count_ = 0;  // of the current round, the same on every node
  int round_ = -1;         // the current rendezvous round
  Next next_ = Next::kRestart;
  rendezvous::RoundReason next_reason_ = rendezvous::RoundReason::kFailure;
  std::string remote_failure_;  // another node's failure ended the round
  std::string failure_;  // what the next round restarts for, if a failure
  int stop_signal_ = 0;  // job-stopping signal received, 0 if none
  std::chrono::system_clock::time_point stop_signal_at_;  // when it came
  size_t alive_ = 0;
  std::vector<std::unique_ptr<Process>> procs_;
  std::unique_ptr<Timer> timer_;
  RoundOutcome outcome_;  // written by start_attempt()'s work only
  RunResult result_;
  // Faults (options_.faults): fired or not, pending timers, and the exit
  // code an exit fault gives its victim (by local rank, 0: none).
  std::vector<bool> fired_;
  std::vector<bool> fitted_;  // in range of a round once
  std::vector<std::unique_ptr<Timer>> fault_timers_;
  std::vector<int> injected_exit_;
  int rank_offset_ = 0;  // RANK of local rank 0 in this round
  // Progress records: hang detection (options_.hang_timeout > 0) and the
  // comm faults that fired (DLAUNCH_COMM_FAULTS in the workers' env).
  std::unique_ptr<ProgressFiles> progress_;
  std::unique_ptr<Timer> hang_timer_;
  std::chrono::milliseconds hang_tick_{0};
  std::vector<uint64_t> last_count_;  // by local rank
  std::vector<int> quiet_ticks_;
};

}  // namespace dlaunch::agent
