#pragma once

#include <chrono>
#include <csignal>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch::agent {

// One failure the agent injects into its own job (--fault, a job file's
// faults:, DLAUNCH_FAULTS; docs/reliability.md). Written
// KIND:KEY=VALUE[:KEY=VALUE...]:
//   kill:rank=R[:signal=KILL]   send a signal to rank R's process group
//   exit:rank=R[:code=1]        end rank R (SIGKILL to its group), recorded
//                               as having exited with CODE
//   stop:rank=R                 freeze rank R (SIGSTOP: a hang)
//   kill-agent:node=N[:signal=KILL]  the agent of group rank N kills itself
//   cut:node=N:for=SECONDS      node N's agent falls silent to the agents'
//                               store for that long (its keep-alives, or
//                               its etcd lease renewals, stop, as in a
//                               network partition)
// each with [:after=SECONDS] (after its group started; default 0) and
// [:attempt=K] (the group start whose restart count is K; default 0).
// A fault fires at most once per agent. Plain data.
struct Fault {
  enum class Kind { kKill, kExit, kStop, kKillAgent, kCut };
  Kind kind = Kind::kKill;
  int rank = -1;  // kill, exit, stop: the global rank; -1 otherwise
  int node = -1;  // kill-agent, cut: the group rank; -1 otherwise
  // How long after the group started (its workers spawned). Default 0.
  std::chrono::milliseconds after{0};
  // TORCHELASTIC_RESTART_COUNT of the group start it fires in. Default 0.
  int attempt = 0;
  int signal = SIGKILL;                   // kill, kill-agent. Default SIGKILL.
  int code = 1;                           // exit. Default 1.
  std::chrono::milliseconds duration{0};  // cut: how long. Required.
  // The canonical text (defaults left out, keys in a fixed order): two
  // faults are the same when their texts are.
  std::string spec;

  bool targets_rank() const { return rank >= 0; }
};

// Parses one spec. Throws comm::FaultSpecError ("fault 'TEXT': why; fix").
Fault parse_fault(std::string_view text);

// Parses every spec of every source, in order; throws
// comm::FaultSpecError naming the first bad spec or a fault given twice.
std::vector<Fault> parse_faults(const std::vector<std::string>& texts);

// Why `f` cannot apply to a group of `world_size` workers on `nodes` nodes
// ("rank 5 is out of range: 4 workers (ranks 0..3)"); empty when it can.
std::string fault_out_of_range(const Fault& f, int world_size, int nodes);

// What firing it does, for the log: "SIGKILL to rank 1".
std::string fault_action(const Fault& f);

}  // namespace dlaunch::agent
