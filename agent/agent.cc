#include "agent/agent.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <system_error>

#include "agent/posix_env.h"
#include "agent/program.h"
#include "agent/report.h"
#include "agent/temp_dir.h"
#include "comm/shm_names.h"
#include "comm/store/text.h"

namespace dlaunch::agent {

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<uint64_t> dist;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%012llx",
                static_cast<unsigned long long>(dist(rd) & 0xffffffffffffULL));
  return buf;
}

namespace {

bool is_forward_only(int sig, const std::vector<int>& stop_signals) {
  return (sig == SIGUSR1 || sig == SIGUSR2) &&
         std::find(stop_signals.begin(), stop_signals.end(), sig) ==
             stop_signals.end();
}

using comm::store::format_duration;

// A stop signal repeated within this is the same request, not a second
// Ctrl-C (see on_signal).
constexpr std::chrono::milliseconds kSameSignal(1000);

}  // namespace

Agent::Agent(AgentOptions options, Env& env, rendezvous::Rendezvous& rdzv,
             EnvMap base_env, MessageSink sink)
    : options_(std::move(options)),
      env_(env),
      rdzv_(rdzv),
      base_env_(std::move(base_env)),
      sink_(std::move(sink)) {}

Agent::~Agent() = default;

RunResult Agent::run() {
  result_.run_id = options_.run_id.empty() ? random_run_id() : options_.run_id;
  result_.host = host_name();
  result_.max_restarts = options_.max_restarts;
  if (options_.entrypoint.empty() || options_.nproc_per_node < 1) {
    result_.error = "dlaunch: nothing to run (no program or no workers)";
    result_.exit_code = 2;
    sink_(result_.error + "\n");
    write_launcher_error_file();
    return result_;
  }
  // Checked before anything starts: a typo must not cost restarts.
  try {
    auto path = base_env_.find("PATH");
    executable_ = resolve_program(options_.entrypoint[0],
                                  path != base_env_.end()
                                      ? path->second
                                      : "/usr/local/bin:/usr/bin:/bin");
  } catch (const ProgramError& e) {
    result_.error = e.what();
    result_.exit_code = 127;
    sink_(result_.error + "\n");
    write_launcher_error_file();
    return result_;
  }
  // From here on a signal is served (once the loop runs), whatever the
  // agent is doing: making folders, waiting for other nodes.
  std::vector<int> sigs = options_.signals_to_handle;
  for (int s : {SIGUSR1, SIGUSR2}) {
    if (std::find(sigs.begin(), sigs.end(), s) == sigs.end()) sigs.push_back(s);
  }
  env_.handle_signals(sigs, [this](int sig) { on_signal(sig); });
  try {
    make_run_dir();
  } catch (const std::exception& e) {
    result_.error = std::string("dlaunch: cannot create the run folder: ") +
                    e.what() +
                    (options_.log_dir.empty() ? "" : "; check --log-dir");
    result_.exit_code = 1;
    sink_(result_.error + "\n");
    write_launcher_error_file();
    return result_;
  }
  // Removed at the end (below) unless it holds logs; if the agent is
  // killed first, its watchdog removes it (make_run_dir()); if something
  // throws, the catch below does.
  const bool keep_dir = !temp_run_dir_ || writes_logs();
  fired_.assign(options_.faults.size(), false);
  fitted_.assign(options_.faults.size(), false);
  try {
    // The records also carry the comm faults that fired (the report and
    // summary.json name them), so DLAUNCH_COMM_FAULTS asks for them too.
    auto comm_faults = base_env_.find("DLAUNCH_COMM_FAULTS");
    if (options_.hang_timeout.count() > 0 ||
        (comm_faults != base_env_.end() && !comm_faults->second.empty())) {
      progress_ = std::make_unique<ProgressFiles>(result_.run_dir,
                                                  options_.nproc_per_node);
    }
    run_job();
  } catch (...) {
    if (!keep_dir) {
      std::error_code ec;
      std::filesystem::remove_all(result_.run_dir, ec);
    }
    throw;
  }

  // Before the root cause's error file can vanish with the folder.
  write_launcher_error_file();
  // A temporary run folder that holds no logs is removed, summary and all.
  if (keep_dir) {
    write_summary();
  } else {
    // The report must not point into a folder about to vanish.
    for (AttemptRecord& a : result_.attempts) {
      for (WorkerRecord& w : a.workers) w.error_file.clear();
    }
  }
  std::string report = failure_report(result_);
  if (!report.empty()) sink_(report);
  if (!keep_dir) {
    std::error_code ec;
    std::filesystem::remove_all(result_.run_dir, ec);
  }
  return result_;
}

void Agent::run_job() {
  const int n = options_.nproc_per_node;
  if (n > 1 && !base_env_.contains("OMP_NUM_THREADS")) {
    sink_("dlaunch: note: OMP_NUM_THREADS=1 for each of the " +
          std::to_string(n) + " workers (set it yourself to tune)\n");
  }
  // Local ranks this node does not run, named once: a filter or map of
  // them would otherwise hide or log nothing without a word. A warning,
  // not an error: hosts with more slots may run them.
  const auto warn_absent = [&](const std::set<int>& ranks, const char* flag) {
    std::string list;
    for (int r : ranks) {
      if (r >= n) list += (list.empty() ? "" : ",") + std::to_string(r);
    }
    if (list.empty()) return;
    sink_("dlaunch: warning: " + std::string(flag) + " names local rank(s) " +
          list + ", and this node runs local ranks 0.." +
          std::to_string(n - 1) + "\n");
  };
  if (options_.local_ranks_filter) {
    warn_absent(*options_.local_ranks_filter, "--local-ranks-filter");
  }
  for (const auto& [spec, flag] :
       {std::pair{&options_.redirects, "--redirects"},
        std::pair{&options_.tee, "--tee"}}) {
    std::set<int> ranks;
    for (const auto& [r, streams] : spec->per_rank) ranks.insert(r);
    warn_absent(ranks, flag);
  }

  start_attempt(rendezvous::RoundReason::kStart);
  if (state_ != State::kDone) env_.run();
}

bool Agent::writes_logs() const {
  return options_.redirects.all != Streams::kNone ||
         !options_.redirects.per_rank.empty() ||
         options_.tee.all != Streams::kNone || !options_.tee.per_rank.empty();
}

void Agent::make_run_dir() {
  if (!options_.log_dir.empty()) {
    // Absolute: workers get their error file's path, and one that changes
    // folder must still reach it.
    result_.run_dir = std::filesystem::absolute(options_.log_dir) /
                      (options_.run_dir_name.empty() ? result_.run_id
                                                     : options_.run_dir_name);
    std::filesystem::create_directories(result_.run_dir);
    return;
  }
  // $TMPDIR when set. Otherwise a folder that only ever holds error files
  // (removed at exit) goes to /dev/shm: on tmpfs it costs 9 us to make and
  // remove against 125 us on an ext4 /tmp. Log files go to /tmp, where they
  // outlive the run and take no memory.
  // A full /dev/shm (no inode left) must not stop the job: /tmp is next.
  std::vector<std::string> bases;
  auto tmp = base_env_.find("TMPDIR");
  if (tmp != base_env_.end() && !tmp->second.empty()) {
    bases.push_back(tmp->second);
  } else {
    if (!writes_logs() && ::access("/dev/shm", W_OK | X_OK) == 0) {
      bases.push_back("/dev/shm");
    }
    bases.push_back("/tmp");
  }
  std::vector<std::string> templates;
  for (const std::string& base : bases) {
    // operator/ joins without doubling a trailing '/' (TMPDIR=/scratch/).
    templates.push_back((std::filesystem::absolute(base) /
                         ("dlaunch-" + result_.run_id + "-XXXXXX"))
                            .string());
  }
  // Log files outlive the run; a folder without them is the Env's to make:
  // it is removed even if the agent is killed as it is made.
  if (writes_logs()) {
    result_.run_dir = make_temp_dir(std::move(templates));
    // As torchrun's "log directory set to": otherwise only a failure
    // report would name it.
    sink_("dlaunch: no --log-dir given; the logs go to " +
          result_.run_dir.string() + "\n");
  } else {
    result_.run_dir = env_.make_temp_dir(std::move(templates));
  }
  temp_run_dir_ = true;
}

void Agent::start_attempt(rendezvous::RoundReason reason) {
  state_ = State::kRendezvous;
  auto work = [this, reason] {
    outcome_ = RoundOutcome{};
    try {
      outcome_.round = rdzv_.next_round(options_.nproc_per_node, reason,
                                        options_.rdzv_timeout);
    } catch (const rendezvous::RendezvousClosed& e) {
      outcome_.closed = e.what();
    } catch (const rendezvous::RendezvousInterrupted&) {
      outcome_.interrupted = true;
    } catch (const std::exception& e) {
      outcome_.error = e.what();
    }
  };
  // Waiting for other nodes may take up to the join timeout: signals (a
  // Ctrl-C) must be served meanwhile.
  if (rdzv_.may_wait()) {
    env_.run_in_background(std::move(work), [this] { round_formed(); });
  } else {
    // From the loop, not from here: a group that fails to start again and
    // again would otherwise nest one call chain per restart (the stack
    // overflowed after some 12,000 restarts).
    work();
    env_.post([this] { round_formed(); });
  }
}

void Agent::round_formed() {
  if (state_ != State::kRendezvous) return;
  if (stop_signal_ != 0) {
    // Stopped while waiting: a round that formed regardless goes on
    // without this node.
    if (outcome_.round) rdzv_.report(rendezvous::NodeOutcome::kLeaving);
    sink_("dlaunch: left the rendezvous after " + signal_name(stop_signal_) +
          "; no worker was running\n");
    finish(128 + stop_signal_);
    return;
  }
  if (!outcome_.closed.empty()) {
    sink_("dlaunch: " + outcome_.closed + "\n");
    finish(0);
    return;
  }
  if (!outcome_.round) {
    result_.error =
        "dlaunch: rendezvous failed: " +
        (outcome_.interrupted ? std::string("interrupted") : outcome_.error);
    sink_(result_.error + "\n");
    finish(1);
    return;
  }
  // A copy: a restart started from here (a spawn failure) reuses outcome_.
  const rendezvous::RendezvousResult round = *outcome_.round;
  // Every member of the round got the same count: past the budget, every
  // node gives up together, whatever each saw end the last round.
  if (round.restart_count > options_.max_restarts) {
    give_up(round.restart_cause);
    return;
  }
  // A run folder that vanishes at the end (in /dev/shm) keeps no error
  // records of past attempts (the last one's stay for the launcher's own
  // error file): their messages were read at the exits, and
  // a long series of restarts must not fill memory with them.
  if (temp_run_dir_ && !writes_logs() && !result_.attempts.empty()) {
    std::error_code ec;
    for (const WorkerRecord& w : attempt().workers) {
      if (!w.error_file.empty()) std::filesystem::remove(w.error_file, ec);
    }
  }
  if (!result_.attempts.empty() && round.restart_count > restart_count_) {
    sink_("dlaunch: " + (failure_.empty() ? round.restart_cause : failure_) +
          "; restarting the worker group (restart " +
          std::to_string(round.restart_count) + " of " +
          std::to_string(options_.max_restarts) + ")\n");
  }
  failure_.clear();
  restart_count_ = round.restart_count;
  round_ = round.round;
  next_ = Next::kRestart;
  remote_failure_.clear();
  AttemptRecord a;
  a.restart_count = restart_count_;
  a.round = round.round;
  a.reason = rendezvous::reason_name(round.reason);
  a.group_rank = round.group_rank;
  a.members = round.members;
  a.master_addr = round.master_addr;
  a.master_port = round.master_port;
  a.start_time = env_.now();
  a.workers.resize(static_cast<size_t>(options_.nproc_per_node));
  result_.attempts.push_back(std::move(a));
  rank_offset_ = round.rank_offset;
  injected_exit_.assign(static_cast<size_t>(options_.nproc_per_node), 0);
  if (!check_faults(round)) return;

  // The other nodes' news reaches the loop as an event: it sleeps until
  // then, whatever the workers do.
  rdzv_.watch([this](const rendezvous::RoundEvent& e) {
    env_.post([this, e] { on_round_event(e); });
  });

  procs_.clear();
  procs_.resize(static_cast<size_t>(options_.nproc_per_node));
  alive_ = 0;
  state_ = State::kRunning;
  for (size_t i = 0; i < procs_.size(); ++i) {
    if (!spawn_worker(i, round)) {
      // Stopping may restart the group (a new attempt), so nothing of this
      // attempt's loop may run after it.
      stop_group(SIGTERM);
      return;
    }
  }
  for (FaultRecord& f : result_.faults) {
    if (f.detected != WallTime{} && f.running_again == WallTime{}) {
      f.running_again = env_.now();
    }
  }
  schedule_faults(round);
  start_hang_watch();
}

bool Agent::check_faults(const rendezvous::RendezvousResult& round) {
  for (size_t k = 0; k < options_.faults.size(); ++k) {
    const Fault& f = options_.faults[k];
    const std::string why =
        fault_out_of_range(f, round.world_size, round.group_world_size);
    if (why.empty()) fitted_[k] = true;
    // Once in range, a later smaller round (a node lost, maybe the fault's
    // own victim) is no error: it may have fired elsewhere.
    if (fired_[k] || fitted_[k] || f.attempt != restart_count_) continue;
    result_.error = "dlaunch: fault '" + f.spec + "': " + why + " in round " +
                    std::to_string(round.round) + "; give a target that exists";
    sink_(result_.error + "\n");
    attempt().outcome = "not started: " + why;
    finish(2);
    return false;
  }
  return true;
}

void Agent::schedule_faults(const rendezvous::RendezvousResult& round) {
  fault_timers_.clear();
  for (size_t k = 0; k < options_.faults.size(); ++k) {
    const Fault& f = options_.faults[k];
    if (fired_[k] || f.attempt != restart_count_) continue;
    const bool here =
        f.targets_rank()
            ? f.rank >= round.rank_offset &&
                  f.rank < round.rank_offset + options_.nproc_per_node
            : f.node == round.group_rank;
    if (!here) continue;
    fault_timers_.push_back(
        env_.start_timer(f.after, [this, k] { fire_fault(k); }));
  }
}

void Agent::fire_fault(size_t k) {
  const Fault& f = options_.faults[k];
  fired_[k] = true;
  FaultRecord rec;
  rec.spec = f.spec;
  rec.action = fault_action(f);
  rec.attempt = static_cast<int>(result_.attempts.size()) - 1;
  rec.fired = env_.now();
  if (f.kind == Fault::Kind::kCut) {
    rec.pid = static_cast<int>(::getpid());
    if (!rdzv_.cut_off(f.duration)) {
      sink_("dlaunch: fault " + f.spec +
            " not injected: this node has no link to other nodes to cut\n");
      return;
    }
    result_.faults.push_back(rec);
    sink_("dlaunch: fault injected: " + f.spec + ": " + rec.action + "\n");
    return;
  }
  if (!f.targets_rank()) {
    rec.pid = static_cast<int>(::getpid());
    result_.faults.push_back(rec);
    // Written at once: the queued console would die with the agent.
    std::string line = "dlaunch: fault injected: " + f.spec + ": " +
                       rec.action + " (this agent, pid " +
                       std::to_string(rec.pid) + ")\n";
    if (::write(STDERR_FILENO, line.data(), line.size()) < 0) {
      // Nothing to do: the agent is about to be signalled anyway.
    }
    ::kill(::getpid(), f.signal);
    return;
  }
  const size_t i = static_cast<size_t>(f.rank - rank_offset_);
  WorkerRecord& w = attempt().workers[i];
  if (state_ != State::kRunning || !procs_[i] || w.status) {
    sink_("dlaunch: fault " + f.spec + " not injected: rank " +
          std::to_string(f.rank) + " is no longer running\n");
    return;
  }
  rec.pid = w.pid;
  result_.faults.push_back(rec);
  w.injected_fault = f.spec;
  w.injected_by = "dlaunch";
  sink_("dlaunch: fault injected: " + f.spec + ": " + rec.action +
        " (local rank " + std::to_string(i) + ", pid " + std::to_string(w.pid) +
        ")\n");
  switch (f.kind) {
    case Fault::Kind::kKill:
      procs_[i]->signal_group(f.signal);
      break;
    case Fault::Kind::kExit:
      injected_exit_[i] = f.code;
      procs_[i]->signal_group(SIGKILL);
      break;
    case Fault::Kind::kStop:
      w.frozen = true;
      procs_[i]->signal_group(SIGSTOP);
      break;
    case Fault::Kind::kKillAgent:
    case Fault::Kind::kCut:
      break;
  }
}

void Agent::note_detected() {
  const int a = static_cast<int>(result_.attempts.size()) - 1;
  for (FaultRecord& f : result_.faults) {
    if (f.attempt == a && f.detected == WallTime{}) f.detected = env_.now();
  }
}

void Agent::note_comm_fault(size_t i) {
  if (!progress_) return;
  std::optional<CommFaultNote> note =
      progress_->fired_fault(static_cast<int>(i));
  if (!note) return;
  WorkerRecord& w = attempt().workers[i];
  const int a = static_cast<int>(result_.attempts.size()) - 1;
  for (const FaultRecord& f : result_.faults) {
    if (f.source == "comm" && f.attempt == a && f.pid == w.pid) return;
  }
  FaultRecord rec;
  rec.spec = note->spec;
  rec.action = note->action;
  rec.source = "comm";
  rec.attempt = a;
  rec.pid = w.pid;
  rec.fired = note->fired;
  result_.faults.push_back(rec);
  // A fault that fired but did not end its worker (a short stall, a
  // failure the program caught) makes no failure of it.
  if (w.injected_fault.empty() && w.failed_on_its_own()) {
    w.injected_fault = note->spec;
    w.injected_by = "comm";
  }
}

void Agent::start_hang_watch() {
  if (!progress_ || options_.hang_timeout.count() <= 0 ||
      state_ != State::kRunning) {
    return;
  }
  using std::chrono::milliseconds;
  // Ticks of a tenth of the timeout (10 ms to 0.5 s): a hang is found
  // within the timeout plus one tick.
  hang_tick_ = std::clamp(options_.hang_timeout / 10, milliseconds(10),
                          milliseconds(500));
  last_count_.assign(procs_.size(), 0);
  quiet_ticks_.assign(procs_.size(), 0);
  hang_timer_ = env_.start_timer(hang_tick_, [this] { on_hang_tick(); });
}

void Agent::on_hang_tick() {
  if (state_ != State::kRunning) return;
  std::vector<ProgressSample> samples(procs_.size());
  bool hung = false;
  for (size_t j : running()) {
    samples[j] = progress_->sample(static_cast<int>(j));
    // A worker that never showed progress may still be starting, so it
    // is not watched, unless a stop fault froze it (before its first beat
    // on a loaded machine: the others would beat on and the drill wait
    // for ever).
    const bool watched = samples[j].count > 0 || attempt().workers[j].frozen;
    if (samples[j].count != last_count_[j]) {
      last_count_[j] = samples[j].count;
      quiet_ticks_[j] = 0;
    } else if (watched &&
               ++quiet_ticks_[j] * hang_tick_ >= options_.hang_timeout) {
      hung = true;
    }
  }
  if (!hung) {
    hang_timer_ = env_.start_timer(hang_tick_, [this] { on_hang_tick(); });
    return;
  }
  // The stuck: the lowest progress, the ones the others wait for (one
  // that never showed any, still starting or frozen early, among them).
  // Where a stop fault froze some of those, only they: the others at that
  // count wait for them (still in set-up, say, at 0).
  uint64_t low = UINT64_MAX, high = 0;
  for (size_t j : running()) {
    low = std::min(low, samples[j].count);
    high = std::max(high, samples[j].count);
  }
  bool frozen_low = false;
  for (size_t j : running()) {
    frozen_low |= samples[j].count == low && attempt().workers[j].frozen;
  }
  std::string who;
  for (size_t j : running()) {
    if (samples[j].count != low) continue;
    if (frozen_low && !attempt().workers[j].frozen) continue;
    WorkerRecord& w = attempt().workers[j];
    w.hung = true;
    w.progress = samples[j].count;
    w.operation = samples[j].operation;
    note_comm_fault(j);
    if (attempt().root_cause < 0) attempt().root_cause = static_cast<int>(j);
    who += (who.empty() ? "" : ", ") + std::string("rank ") +
           std::to_string(w.rank) + " (local rank " + std::to_string(j) +
           ", pid " + std::to_string(w.pid) + ") in " + w.operation;
  }
  sink_("dlaunch: hang: no progress for " +
        format_duration(options_.hang_timeout) + " (--hang-timeout); stuck: " +
        who + " at progress " + std::to_string(low) +
        (high > low ? " (others up to " + std::to_string(high) + ")" : "") +
        "; SIGKILL to the stuck, SIGTERM to the others\n");
  note_detected();
  next_ = Next::kRestart;
  stop_group(SIGTERM);
}

void Agent::on_round_event(const rendezvous::RoundEvent& e) {
  using Kind = rendezvous::RoundEvent::Kind;
  // While the next round forms, news of the last one is stale.
  if (state_ == State::kDone || state_ == State::kRendezvous ||
      e.round != round_) {
    return;
  }
  if (e.kind == Kind::kSucceeded) {
    if (state_ == State::kBarrier) finish(0);
    return;
  }
  if (stop_signal_ != 0) return;  // leaving anyway
  attempt().ended_by = e.detail;
  note_detected();
  if (state_ != State::kStopping || next_ != Next::kFinish) {
    switch (e.kind) {
      case Kind::kFailure:
        next_ = Next::kRestart;
        remote_failure_ = e.detail;
        break;
      case Kind::kNodeLost:
      case Kind::kNodeJoined:
        // A failure already seen keeps its restart.
        if (state_ == State::kStopping && next_ == Next::kRestart) break;
        next_ = Next::kRound;
        next_reason_ = e.kind == Kind::kNodeLost
                           ? rendezvous::RoundReason::kNodeLost
                           : rendezvous::RoundReason::kNodeJoined;
        break;
      case Kind::kFatal:
        next_ = Next::kFinish;
        result_.error = "dlaunch: " + e.detail;
        break;
      case Kind::kSucceeded:
        break;
    }
  }
  if (state_ == State::kRunning) {
    sink_("dlaunch: " + e.detail + "; stopping " + std::to_string(alive_) +
          " worker(s)\n");
    stop_group(SIGTERM);
  } else if (state_ == State::kBarrier) {
    group_stopped();
  }
}

bool Agent::spawn_worker(size_t i, const rendezvous::RendezvousResult& round) {
  const int local_rank = static_cast<int>(i);
  const int n = options_.nproc_per_node;
  WorkerRecord& w = attempt().workers[i];
  w.local_rank = local_rank;
  w.rank = round.rank_offset + local_rank;

  WorkerIdentity id;
  id.local_rank = local_rank;
  id.rank = w.rank;
  id.world_size = round.world_size;
  id.local_world_size = n;
  id.group_rank = round.group_rank;
  id.group_world_size = round.group_world_size;
  id.role_rank = w.rank;
  id.role_world_size = round.world_size;
  JobInfo job{options_.role,  round.master_addr,     round.master_port,
              restart_count_, options_.max_restarts, result_.run_id};
  job.gpu_per_rank = options_.gpu_binding == GpuBinding::kPerRank;

  // attempt_K: K is the rendezvous round, the same on every node for one
  // start of the group and new for each start. torchrun's K is the restart
  // count, equal to the round until membership changes; it then reuses
  // (and wipes) the folder, losing the previous group's logs.
  const size_t attempt_no = result_.attempts.size() - 1;
  const std::string k = std::to_string(round.round);
  std::filesystem::path dir =
      result_.run_dir / ("attempt_" + k) / std::to_string(local_rank);

  const Streams redir = options_.redirects.for_rank(local_rank);
  const Streams tee = options_.tee.for_rank(local_rank);
  const bool shown = !options_.local_ranks_filter ||
                     options_.local_ranks_filter->contains(local_rank);
  ProcessSpec spec;
  spec.executable = executable_;
  if (options_.cpu_binding == CpuBinding::kCore) spec.core_slot = local_rank;
  std::map<std::string, std::string> vars{
      {"local_rank", std::to_string(local_rank)}};
  spec.argv.push_back(options_.entrypoint[0]);
  for (size_t k = 1; k < options_.entrypoint.size(); ++k) {
    spec.argv.push_back(substitute(options_.entrypoint[k], vars));
  }
  if (covers_stdout(redir) || covers_stdout(tee)) {
    w.stdout_log = dir / "stdout.log";
    spec.out.file = w.stdout_log;
  }
  if (covers_stderr(redir) || covers_stderr(tee)) {
    w.stderr_log = dir / "stderr.log";
    spec.err.file = w.stderr_log;
  }
  if (shown && (!covers_stdout(redir) || covers_stdout(tee)))
    spec.out.console_fd = 1;
  if (shown && (!covers_stderr(redir) || covers_stderr(tee)))
    spec.err.console_fd = 2;

  std::string tmpl = options_.log_line_prefix_template;
  if (tmpl.empty()) {
    auto it = base_env_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    if (it != base_env_.end()) tmpl = it->second;
  }
  spec.prefix =
      line_prefix(tmpl, options_.role, local_rank, w.rank,
                  options_.hostname.empty() ? host_name() : options_.hostname);
  // torchrun's layout: LOG_DIR/RUN_ID/attempt_K/LOCAL_RANK/error.json.
  // In a temporary run folder without log files the error file lies flat:
  // eight mkdirs on ext4 would cost more than spawning eight workers.
  const bool worker_dir =
      !temp_run_dir_ || !spec.out.file.empty() || !spec.err.file.empty();
  w.error_file = worker_dir
                     ? dir / "error.json"
                     : result_.run_dir / ("error_" + k + "_" +
                                          std::to_string(local_rank) + ".json");
  spec.env = worker_environment(base_env_, id, job, w.error_file.string());
  if (progress_) {
    for (std::string& e : progress_->reset(local_rank)) {
      spec.env.push_back(std::move(e));
    }
  }

  try {
    std::error_code ec;
    if (worker_dir) {
      std::filesystem::create_directories(dir, ec);
      if (ec) {
        throw SpawnError("cannot create " + dir.string() + ": " + ec.message());
      }
    }
    // A stale record would be reported as this worker's. Flat names in a
    // fresh temporary folder are new for every attempt.
    if (worker_dir) std::filesystem::remove(w.error_file, ec);
    w.start_time = env_.now();
    procs_[i] = env_.spawn(spec, [this, attempt_no, i](ExitStatus s) {
      if (attempt_no + 1 == result_.attempts.size()) on_exit(i, s);
    });
    w.pid = procs_[i]->pid();
    ++alive_;
    return true;
  } catch (const SpawnError& e) {
    w.spawn_error = e.what();
    w.status = ExitStatus{127, 0};
    w.end_time = env_.now();
    if (attempt().root_cause < 0) attempt().root_cause = local_rank;
    sink_("dlaunch: cannot start local rank " + std::to_string(local_rank) +
          ": " + e.what() + "\n");
    return false;
  }
}

void Agent::on_exit(size_t i, ExitStatus status) {
  WorkerRecord& w = attempt().workers[i];
  // An exit fault ends its victim by SIGKILL, standing for the exit code.
  if (injected_exit_[i] != 0) status = ExitStatus{injected_exit_[i], 0};
  w.status = status;
  w.end_time = env_.now();
  w.log_error = procs_[i]->log_error();
  --alive_;
  if (!status.ok()) w.error_message = read_error_file(w.error_file);
  note_comm_fault(i);
  if (w.failed_on_its_own() && attempt().root_cause < 0) {
    attempt().root_cause = static_cast<int>(i);
  }
  if (state_ == State::kRunning) {
    if (!status.ok()) {
      note_detected();
      next_ = Next::kRestart;
      stop_group(SIGTERM);
    } else if (alive_ == 0) {
      fault_timers_.clear();
      hang_timer_.reset();
      remove_attempt_shm();
      attempt().end_time = env_.now();
      attempt().outcome = "succeeded";
      // The exit barrier: done when every node is (at once on one node).
      state_ = State::kBarrier;
      timer_ = env_.start_timer(options_.exit_barrier_timeout, [this] {
        std::string who;
        for (const std::string& n : rdzv_.unfinished_nodes()) {
          who += (who.empty() ? "" : ", ") + n;
        }
        sink_("dlaunch: exit barrier: " +
              (who.empty() ? std::string("the other nodes") : who) +
              " did not finish within " +
              format_duration(options_.exit_barrier_timeout) +
              " (--exit-barrier-timeout); this node's workers succeeded, "
              "exiting 0\n");
        finish(0);
      });
      if (attempt().members.size() > 1) {
        sink_("dlaunch: this node's workers succeeded; waiting up to " +
              format_duration(options_.exit_barrier_timeout) +
              " for the other nodes to finish (exit barrier)\n");
      }
      rdzv_.report(rendezvous::NodeOutcome::kSucceeded);
    }
    return;
  }
  if (state_ == State::kStopping && alive_ == 0) group_stopped();
}

std::vector<size_t> Agent::running() {
  std::vector<size_t> out;
  for (size_t j = 0; j < procs_.size(); ++j) {
    if (procs_[j] && !attempt().workers[j].status) out.push_back(j);
  }
  return out;
}

void Agent::signal_running(int sig) {
  for (size_t j : running()) {
    const WorkerRecord& w = attempt().workers[j];
    // A frozen or hung worker would not act on SIGTERM (a stopped one
    // never sees it): it gets SIGKILL at once.
    const bool stuck = (w.frozen || w.hung) && sig != SIGKILL &&
                       !is_forward_only(sig, options_.signals_to_handle);
    procs_[j]->signal_group(stuck ? SIGKILL : sig);
  }
}

void Agent::stop_group(int sig) {
  state_ = State::kStopping;
  fault_timers_.clear();
  hang_timer_.reset();
  for (size_t j : running()) attempt().workers[j].stopped_by_agent = true;
  signal_running(sig);
  if (alive_ == 0) {
    group_stopped();
    return;
  }
  if (sig == SIGKILL) {
    timer_ =
        env_.start_timer(options_.kill_timeout, [this] { on_kill_timeout(); });
  } else {
    timer_ =
        env_.start_timer(options_.term_timeout, [this] { on_term_timeout(); });
  }
}

void Agent::on_term_timeout() {
  std::string ranks;
  for (size_t j : running()) {
    ranks += (ranks.empty() ? "" : ",") + std::to_string(j);
  }
  signal_running(SIGKILL);
  sink_("dlaunch: " + std::to_string(alive_) + " worker(s) (local ranks " +
        ranks + ") still running " + format_duration(options_.term_timeout) +
        " after being signalled; sending SIGKILL\n");
  timer_ =
      env_.start_timer(options_.kill_timeout, [this] { on_kill_timeout(); });
}

void Agent::on_kill_timeout() {
  std::string who;
  for (size_t j : running()) {
    who += (who.empty() ? "" : ", ") + std::string("local rank ") +
           std::to_string(j) + " (pid " + std::to_string(procs_[j]->pid()) +
           ")";
    // Destroying the handle cancels its exit callback; it never blocks.
    procs_[j].reset();
  }
  sink_("dlaunch: " + who + " did not exit within " +
        format_duration(options_.kill_timeout) +
        " after SIGKILL; abandoning\n");
  alive_ = 0;
  group_stopped();
}

void Agent::on_signal(int sig) {
  if (state_ == State::kDone) return;
  if (is_forward_only(sig, options_.signals_to_handle)) {
    signal_running(sig);
    return;
  }
  if (state_ == State::kRendezvous) {
    // No workers: leave the rendezvous (round_formed() ends the job).
    if (stop_signal_ == 0) {
      stop_signal_ = sig;
      result_.stop_signal = sig;
      sink_("dlaunch: received " + signal_name(sig) +
            " while waiting for the rendezvous; leaving it\n");
      rdzv_.interrupt();
    }
    return;
  }
  if (stop_signal_ != 0) {
    // timeout(1) signals its child, then the child's process group: one
    // request, delivered twice at once.
    if (sig == stop_signal_ && env_.now() - stop_signal_at_ < kSameSignal) {
      sink_("dlaunch: received " + signal_name(sig) + " again within " +
            format_duration(kSameSignal) +
            ", taken as the same request (timeout(1) sends two); another "
            "one later sends SIGKILL\n");
      return;
    }
    sink_("dlaunch: received " + signal_name(sig) +
          " again; sending SIGKILL to the workers\n");
    stop_group(SIGKILL);
    return;
  }
  stop_signal_ = sig;
  stop_signal_at_ = env_.now();
  result_.stop_signal = sig;
  sink_("dlaunch: received " + signal_name(sig) + "; forwarding it to " +
        std::to_string(alive_) + " worker(s), SIGKILL after " +
        format_duration(options_.term_timeout) + "\n");
  if (state_ == State::kStopping) {
    // Already stopping after a failure: pass the signal on too, keep the
    // running SIGKILL deadline.
    signal_running(sig);
    return;
  }
  stop_group(sig);
}

void Agent::remove_attempt_shm() {
  if (result_.attempts.empty()) return;
  const AttemptRecord& a = attempt();
  const std::string prefix =
      "dlaunch-" +
      comm::attempt_shm_prefix(result_.run_id, std::to_string(a.restart_count),
                               a.master_addr, std::to_string(a.master_port));
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().starts_with(prefix)) {
      std::filesystem::remove(e.path(), ec);
    }
  }
}

void Agent::group_stopped() {
  timer_.reset();
  const bool had_workers = state_ != State::kBarrier;
  remove_attempt_shm();
  if (had_workers) attempt().end_time = env_.now();
  if (stop_signal_ != 0) {
    attempt().outcome = "stopped by " + signal_name(stop_signal_);
    rdzv_.report(rendezvous::NodeOutcome::kLeaving);
    finish(128 + stop_signal_);
    return;
  }
  if (next_ == Next::kFinish) {
    if (had_workers) attempt().outcome = "stopped: " + attempt().ended_by;
    sink_(result_.error + "\n");
    finish(1);
    return;
  }
  if (next_ == Next::kRound) {
    if (had_workers) attempt().outcome = "stopped: " + attempt().ended_by;
    sink_("dlaunch: re-forming the worker group (membership changed)\n");
    start_attempt(next_reason_);
    return;
  }
  const WorkerRecord* root = result_.root_cause();
  if (had_workers) {
    attempt().outcome = root ? "failed" : "stopped: " + attempt().ended_by;
  }
  // Ours failed: every node restarts (or gives up) with us.
  if (root) rdzv_.report(rendezvous::NodeOutcome::kFailed);
  failure_ = root
                 ? "local rank " + std::to_string(root->local_rank) + " (pid " +
                       std::to_string(root->pid) + ") failed with " +
                       (root->status ? root->status->describe() : "an error")
                 : remote_failure_;
  if (root && root->hung) failure_ += " (hung in " + root->operation + ")";
  if (root && !root->injected_fault.empty()) {
    failure_ += " (injected: " + root->injected_fault + ")";
  }
  // Even with no restart left: the next round is where every node learns
  // the same count, and so gives up (or goes on) together.
  start_attempt(rendezvous::RoundReason::kFailure);
}

void Agent::give_up(const std::string& cause) {
  // Nodes that come later learn the job is over (they do not wait).
  rdzv_.report(rendezvous::NodeOutcome::kGaveUp);
  const WorkerRecord* root = result_.root_cause();
  if (!root) {
    result_.error = "dlaunch: " + (failure_.empty() ? cause : failure_) +
                    "; no restarts left (" + std::to_string(restart_count_) +
                    " of " + std::to_string(options_.max_restarts) + " used)";
    sink_(result_.error + "\n");
  }
  int code = root && root->status ? root->status->shell_code() : 1;
  finish(code == 0 ? 1 : code);
}

void Agent::finish(int exit_code) {
  state_ = State::kDone;
  result_.exit_code = exit_code;
  timer_.reset();
  fault_timers_.clear();
  hang_timer_.reset();
  env_.stop();
}

void Agent::write_launcher_error_file() {
  if (result_.exit_code == 0) return;
  auto it = base_env_.find("TORCHELASTIC_ERROR_FILE");
  if (it == base_env_.end() || it->second.empty()) return;
  const std::string why =
      !result_.error.empty() ? result_.error
      : result_.stop_signal != 0
          ? "dlaunch: stopped by " + signal_name(result_.stop_signal)
      : !failure_.empty()
          ? "dlaunch: " + failure_
          : "dlaunch: exit " + std::to_string(result_.exit_code);
  std::ofstream out(it->second, std::ios::trunc);
  out << launcher_error_json(result_, why);
  out.close();
  if (!out) {
    sink_("dlaunch: warning: cannot write TORCHELASTIC_ERROR_FILE " +
          it->second + ": " + std::strerror(errno) + "\n");
  }
}

void Agent::write_summary() {
  if (result_.run_dir.empty()) return;
  std::filesystem::path path = result_.run_dir / "summary.json";
  result_.summary_file = path;  // the report names it
  // Whole or not at all: a full disk must not leave a cut-off file that
  // readers take for the summary.
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  std::string text = json_text(summary_json(result_), 2) + "\n";
  std::string why;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = std::strerror(errno);
  } else {
    std::string_view rest = text;
    while (!rest.empty() && why.empty()) {
      ssize_t n = ::write(fd, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) why = std::strerror(errno);
      if (n > 0) rest.remove_prefix(static_cast<size_t>(n));
    }
    if (::close(fd) != 0 && why.empty()) why = std::strerror(errno);
  }
  std::error_code ec;
  if (why.empty()) {
    std::filesystem::rename(tmp, path, ec);
    if (ec) why = ec.message();
  }
  if (why.empty()) return;
  std::filesystem::remove(tmp, ec);
  sink_("dlaunch: cannot write " + path.string() + ": " + why +
        "; the run summary is lost\n");
  result_.summary_file.clear();
}

}  // namespace dlaunch::agent
