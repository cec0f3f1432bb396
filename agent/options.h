#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/fault.h"

namespace dlaunch::agent {

// Which of a worker's standard streams a redirect or tee setting covers
// (torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both).
enum class Streams : uint8_t { kNone = 0, kOut = 1, kErr = 2, kBoth = 3 };

inline bool covers_stdout(Streams s) { return (static_cast<int>(s) & 1) != 0; }
inline bool covers_stderr(Streams s) { return (static_cast<int>(s) & 2) != 0; }

// A torchrun `-r`/`-t` value: one Streams for every local rank ("3"), or a
// per-rank map ("0:3,1:0") where ranks not named get kNone.
struct StreamsSpec {
  Streams all = Streams::kNone;     // used when per_rank is empty
  std::map<int, Streams> per_rank;  // non-empty when a map was given

  Streams for_rank(int local_rank) const;
};

// Parses "0".."3" or "R:V[,R:V...]". Throws std::invalid_argument whose
// message names the bad part and the valid forms.
StreamsSpec parse_streams(std::string_view text);

// How workers are bound to GPUs (--gpu-binding).
enum class GpuBinding { kNone, kPerRank };

// How workers are bound to CPU cores (--cpu-bind).
enum class CpuBinding { kNone, kCore };

// Everything one node agent needs to run a worker group, with documented
// defaults. The command line (launcher/cli.h) fills it; a YAML job config
// will fill the same struct. Plain data: copy freely.
struct AgentOptions {
  // The command each worker runs: argv[0] is a program name (looked up in
  // PATH when it has no '/') or path; a literal "${local_rank}" in any
  // argument is replaced by the worker's local rank. Required.
  std::vector<std::string> entrypoint;
  // Workers on this node (LOCAL_WORLD_SIZE). Default 1.
  int nproc_per_node = 1;
  // ROLE_NAME of the workers; also the console prefix. Default "default".
  std::string role = "default";
  // TORCHELASTIC_RUN_ID and the log sub-folder. Empty: a random id.
  std::string run_id;
  // The log sub-folder when not run_id (a folder an earlier run with the
  // same id holds: the launcher picks RUN_ID.N). Empty: run_id.
  std::string run_dir_name;
  // Group restarts allowed after a worker failure. Default 0.
  int max_restarts = 0;
  // After a stop signal (SIGTERM or the forwarded signal), how long workers
  // get before SIGKILL. Default 30 s (torchrun's).
  std::chrono::milliseconds term_timeout{std::chrono::seconds(30)};
  // After SIGKILL, how long to wait for a worker to be reaped (one stuck in
  // the kernel never is) before giving up on it. Default 5 s.
  std::chrono::milliseconds kill_timeout{std::chrono::seconds(5)};
  // After a worker exits, how long to keep reading output its leftover
  // children may still hold open. Default 2 s.
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(2)};
  // Bound on one rendezvous round (torchrun's join_timeout). Default 600 s.
  std::chrono::milliseconds rdzv_timeout{std::chrono::seconds(600)};
  // After this node's workers succeeded, how long to wait for every other
  // node's (--exit-barrier-timeout); the job then ends here with exit 0
  // and a warning. Default 300 s (torchrun's).
  std::chrono::milliseconds exit_barrier_timeout{std::chrono::seconds(300)};
  // MASTER_ADDR given to workers. Default 127.0.0.1 (one node).
  std::string master_addr = "127.0.0.1";
  // MASTER_PORT; 0 (default) picks a free port on master_addr each round.
  int master_port = 0;
  // Logs go to LOG_DIR/RUN_ID/attempt_K/LOCAL_RANK/{stdout,stderr}.log (K:
  // the rendezvous round, the same on every node for one start of the group)
  // and the run summary to LOG_DIR/RUN_ID/summary.json. Empty (default): a
  // temporary folder, removed at exit unless logs were redirected or teed.
  std::filesystem::path log_dir;
  // Streams written only to log files (-r). Default none.
  StreamsSpec redirects;
  // Streams written to log files and the console (-t). Default none.
  StreamsSpec tee;
  // Local ranks whose output reaches the console; unset (default): all.
  std::optional<std::set<int>> local_ranks_filter;
  // Signals that stop the job: forwarded to every worker's process group,
  // SIGKILL after term_timeout, exit 128+signal. SIGUSR1/SIGUSR2 not listed
  // here are forwarded only. Default torchrun's SIGTERM,SIGINT,SIGHUP,SIGQUIT.
  std::vector<int> signals_to_handle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  // Which GPU each worker sees. kNone (default): the agent's environment
  // as it is. kPerRank: worker L gets CUDA_VISIBLE_DEVICES set to the L-th
  // of the agent's CUDA_VISIBLE_DEVICES (or to L when unset) and
  // DLAUNCH_CUDA_DEVICE=0, the device comm's nccl backend then uses.
  GpuBinding gpu_binding = GpuBinding::kNone;
  // Which CPUs each worker may run on. kNone (default): the agent's own
  // (no binding, as torchrun). kCore: worker L runs only on core
  // L mod N of the N cores the agent may use (mpirun's --bind-to core,
  // srun's --cpu-bind=cores), so that ranks on one host neither share a
  // core nor migrate; the worker's children inherit it.
  CpuBinding cpu_binding = CpuBinding::kNone;
  // This host's name in a multi-host job as the head knows it (${hostname}
  // in the line prefix). Empty (default): the machine's host name.
  std::string hostname;
  // Console line prefix; ${role_name}, ${local_rank}, ${rank} and
  // ${hostname} are replaced. Empty (default):
  // $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else torchrun's
  // "[${role_name}${local_rank}]:".
  std::string log_line_prefix_template;
  // Failures to inject (--fault, faults:, DLAUNCH_FAULTS), each fired at
  // most once. Default none.
  std::vector<Fault> faults;
  // A worker whose progress (comm's counter, or its heartbeat file's
  // mtime) has not moved for this long, after it showed some, makes the
  // group hung: the workers with the lowest progress (one that never
  // showed any included) are SIGKILLed, the others SIGTERMed, the group
  // restarted. 0 (default): off.
  std::chrono::milliseconds hang_timeout{0};
};

}  // namespace dlaunch::agent
