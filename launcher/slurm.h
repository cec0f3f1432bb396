#pragma once

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

}  // namespace dlaunch::launcher
