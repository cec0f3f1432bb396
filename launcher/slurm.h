#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// The Slurm allocation `dlaunch --launcher slurm` runs in, read from the
// variables salloc, sbatch and srun set. Plain data.
struct SlurmAllocation {
  std::string job_id;  // SLURM_JOB_ID
  // SLURM_JOB_NODELIST expanded (hostlist.h), in Slurm's node order: the
  // order in which `srun --ntasks-per-node=1` numbers its tasks.
  std::vector<std::string> nodes;
  // Tasks Slurm planned on each node (SLURM_TASKS_PER_NODE, "2(x3),1"),
  // one per node; empty when the variable is absent.
  std::vector<int> tasks_per_node;
};

// Reads the allocation from `env`. Throws HostsError naming the variable
// and the fix when SLURM_JOB_ID is unset (not inside an allocation: run
// under salloc or sbatch), the node list is missing or malformed, its
// length disagrees with SLURM_JOB_NUM_NODES (SLURM_NNODES), or
// SLURM_TASKS_PER_NODE is malformed or counts other nodes.
SlurmAllocation read_slurm_allocation(const agent::EnvMap& env);

// The hosts of a --launcher slurm job: every node of `alloc` with its
// planned tasks as slots, or, when `given` (--hosts, --hostfile) names
// some, those, in the allocation's order and with their own slots (else
// the allocation's). Throws HostsError naming a given host that is not
// in the allocation.
std::vector<Host> slurm_hosts(const SlurmAllocation& alloc,
                              const std::vector<Host>& given);

// Who this process is when it runs as a task of an srun step, torchrun's
// way of using Slurm (`srun --ntasks-per-node=1 dlaunch ...`): every
// node's dlaunch reads the same step from its own environment, so the
// agents agree on the rendezvous with nothing sent between them. Plain
// data.
struct SlurmTask {
  std::string job_id;   // SLURM_JOB_ID
  std::string step_id;  // SLURM_STEP_ID
  // The step's nodes in Slurm's order (SLURM_STEP_NODELIST, else
  // SLURM_NODELIST, else SLURM_JOB_NODELIST), expanded (hostlist.h): a step
  // may run on part of its allocation.
  std::vector<std::string> nodes;
  // This task's node: its index in `nodes` (SLURM_NODEID).
  int node_id = 0;
  // SLURM_STEP_RESV_PORTS' first port (srun --resv-ports); 0 when none.
  int reserved_port = 0;
};

// Reads the task from `env`; nullopt when `env` is not an srun task's (no
// SLURM_STEP_ID, SLURM_PROCID or SLURM_NODEID: a batch script, an salloc
// shell, no Slurm). Throws HostsError naming the variable and the fix
// when the step runs more than one task on a node (SLURM_STEP_NUM_TASKS
// or SLURM_NTASKS above the node count, or SLURM_LOCALID above 0), or its
// variables are malformed or disagree.
std::optional<SlurmTask> read_slurm_task(const agent::EnvMap& env);

// The port the agents' store of `task`'s step listens on, the same on every
// node: $MASTER_PORT when set (srun passes the environment on), else the
// step's reserved port, else 20000 + FNV-1a("JOB.STEP") % 10000. Throws
// HostsError for a MASTER_PORT that is not a port 1..65535.
int slurm_store_port(const SlurmTask& task, const agent::EnvMap& env);

// Makes `options` (no --nnodes, --node-rank, --rdzv-endpoint, --hosts
// given) the step's rendezvous when it spans more than one node: the
// static backend (unless --rdzv-backend chose c10d) with --nnodes the
// step's node count, --node-rank SLURM_NODEID and --master-addr the first
// node, the store hosted by the
// step's first node's agent at that node's name and slurm_store_port(),
// --local-addr this task's node name, and --rdzv-id JOB.STEP unless given.
// One node: nothing changes. Throws HostsError from slurm_store_port().
void apply_slurm_task(LaunchOptions& options, const SlurmTask& task,
                      const agent::EnvMap& env);

}  // namespace dlaunch::launcher
