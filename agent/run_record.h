#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "agent/env.h"

namespace dlaunch::agent {

using WallTime = std::chrono::system_clock::time_point;

// What happened to one worker in one attempt.
struct WorkerRecord {
  int local_rank = 0;
  int rank = 0;
  int pid = -1;  // -1: never started
  WallTime start_time{};
  WallTime end_time{};
  // How it ended; unset while running or when abandoned after SIGKILL.
  std::optional<ExitStatus> status;
  // The agent signalled it (group stop or forwarded signal) before it ended.
  bool stopped_by_agent = false;
  std::string spawn_error;    // non-empty: it could not be started
  std::string error_message;  // from its TORCHELASTIC_ERROR_FILE, if written
  std::filesystem::path error_file;
  std::filesystem::path stdout_log;  // empty: stdout not written to a file
  std::filesystem::path stderr_log;  // empty: stderr not written to a file
  // Why its log files are incomplete ("PATH: No space left on device");
  // empty when they hold everything it wrote.
  std::string log_error;
  // The fault injected into it (its canonical spec; a comm fault's as
  // written), empty if none, and what injected it: "dlaunch" (--fault,
  // faults:, DLAUNCH_FAULTS) or "comm" (DLAUNCH_COMM_FAULTS, inside the
  // worker).
  std::string injected_fault;
  std::string injected_by;
  // Frozen by a stop fault: stopping the group SIGKILLs it (a stopped
  // process ignores SIGTERM until continued).
  bool frozen = false;
  // Found hung (--hang-timeout): its progress counter and the operation
  // it was in ("all_reduce", "between operations (last: barrier)").
  bool hung = false;
  uint64_t progress = 0;
  std::string operation;

  // Failed on its own account: started and exited non-zero or by a
  // signal the agent did not send, or could not be started.
  bool failed_on_its_own() const {
    if (!spawn_error.empty() || !injected_fault.empty() || hung) return true;
    return status && !status->ok() && !stopped_by_agent;
  }
};

// One start of the worker group (the first, or a restart).
struct AttemptRecord {
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT of its workers
  int round = 0;          // rendezvous round
  // Why the round opened: "start", "failure", "node lost", "node joined".
  std::string reason = "start";
  int group_rank = 0;                // this node's, in the round
  std::vector<std::string> members;  // the round's nodes, by group rank
  std::string master_addr;
  int master_port = 0;
  WallTime start_time{};
  WallTime end_time{};
  std::string outcome;   // "succeeded", "failed", "stopped by SIGINT", ...
  std::string ended_by;  // the other nodes' event that ended it, if any
  std::vector<WorkerRecord> workers;
  int root_cause = -1;  // index in workers of the first observed failure
};

// One fault that fired (summary.json's "faults", the drill's table).
struct FaultRecord {
  std::string spec;    // canonical (a comm fault's: as written)
  std::string action;  // "SIGKILL to rank 1"; comm's: "raising SIGKILL"
  // "dlaunch": the agent fired it; "comm": DLAUNCH_COMM_FAULTS fired it
  // inside the worker, whose record told the agent.
  std::string source = "dlaunch";
  int attempt = 0;  // index in RunResult::attempts when it fired
  int pid = -1;     // the process it hit
  WallTime fired{};
  // When the agent saw the group fail after it (the victim's exit, a hang
  // found); unset when nothing was noticed.
  WallTime detected{};
  // When the next group start had spawned every worker; unset when the
  // group did not start again.
  WallTime running_again{};
};

// The result of Agent::run().
struct RunResult {
  // 0 on success; the root-cause worker's code (or 128+signal); 128+signal
  // when a signal stopped the job; 127 for a missing program; 1 for other
  // agent errors.
  int exit_code = 0;
  std::string run_id;
  std::string host;
  int max_restarts = 0;  // restarts that were allowed
  int stop_signal = 0;   // the signal that stopped the job, 0 if none
  std::string error;     // agent-level failure (program, rendezvous, I/O)
  std::vector<AttemptRecord> attempts;
  std::vector<FaultRecord> faults;     // injected, in firing order
  std::filesystem::path run_dir;       // LOG_DIR/RUN_ID (maybe removed)
  std::filesystem::path summary_file;  // empty when not written

  // The root cause worker of the last attempt, if any.
  const WorkerRecord* root_cause() const;
};

}  // namespace dlaunch::agent
