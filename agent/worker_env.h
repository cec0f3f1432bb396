#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch::agent {

// One worker's place in the job: the numbers of the env contract.
struct WorkerIdentity {
  int local_rank = 0;
  int rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
};

// What the job says about every worker of one attempt.
struct JobInfo {
  std::string role = "default";
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  // --gpu-binding per-rank: each worker sees only its own GPU (see
  // gpu_of_worker) and DLAUNCH_CUDA_DEVICE=0. Default false.
  bool gpu_per_rank = false;
};

// The environment as a map (from `environ`, or a test's own).
using EnvMap = std::map<std::string, std::string>;

// Reads the agent's own environment.
EnvMap current_environment();

// Test-only hook of the etcd helper (tests/e2e/etcd_test.cc): set in the
// agent's environment, the node dies at the exit barrier.
inline constexpr const char* kEtcdTestDieBeforeEnd =
    "DLAUNCH_RDZV_ETCD_TEST_DIE_BEFORE_END";

// Whether `name` is a test-only hook of the agent or its helpers (the
// names above, and only those): a worker that runs dlaunch itself must not
// act on the outer run's. Every other variable reaches the workers, a
// user's DLAUNCH_TEST_DATA included; comm's hooks (DLAUNCH_COMM_TEST_*)
// are read by workers and are none of these.
bool agent_test_hook(std::string_view name);

// The worker's complete environment: `base` (the agent's) less its test
// hooks (agent_test_hook), with the contract of DESIGN.md set on top:
// RANK ... TORCHELASTIC_ERROR_FILE, and with
// job.gpu_per_rank CUDA_VISIBLE_DEVICES and DLAUNCH_CUDA_DEVICE.
// OMP_NUM_THREADS (1 when local_world_size > 1) and
// TORCH_NCCL_ASYNC_ERROR_HANDLING (1) are only set when `base` lacks them.
// Returns "KEY=VALUE" strings.
std::vector<std::string> worker_environment(const EnvMap& base,
                                            const WorkerIdentity& id,
                                            const JobInfo& job,
                                            const std::string& error_file);

// The devices listed in `base`'s CUDA_VISIBLE_DEVICES (comma-separated
// ordinals or GPU-/MIG- UUIDs); empty when it is unset or empty.
std::vector<std::string> visible_device_list(const EnvMap& base);

// The CUDA_VISIBLE_DEVICES value of worker `local_rank` under --gpu-binding
// per-rank: the local_rank-th entry of the agent's CUDA_VISIBLE_DEVICES when
// set, else the ordinal itself. Throws std::invalid_argument when the list
// is too short (the command line checks this first).
std::string gpu_of_worker(const EnvMap& base, int local_rank);

// Replaces each "${name}" in `text` with vars[name]; unknown names are left
// as they are (Python's Template.safe_substitute, which torchrun uses).
std::string substitute(std::string_view text,
                       const std::map<std::string, std::string>& vars);

// The console prefix of a worker: `tmpl` with ${role_name}, ${local_rank},
// ${rank} and ${hostname} replaced; an empty `tmpl` means torchrun's
// "[${role_name}${local_rank}]:".
std::string line_prefix(const std::string& tmpl, const std::string& role,
                        int local_rank, int rank,
                        const std::string& hostname = "");

}  // namespace dlaunch::agent
