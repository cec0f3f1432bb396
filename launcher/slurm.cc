#include "launcher/slurm.h"

#include <algorithm>

#include "launcher/flags.h"
#include "launcher/hostfile.h"
#include "launcher/hostlist.h"

namespace dlaunch::launcher {
namespace {

// The first of `names` set in `env`, or nullptr.
const std::string* first_of(const agent::EnvMap& env,
                            std::initializer_list<const char*> names,
                            std::string* which = nullptr) {
  for (const char* n : names) {
    if (auto it = env.find(n); it != env.end() && !it->second.empty()) {
      if (which) *which = n;
      return &it->second;
    }
  }
  return nullptr;
}

// "2(x3),1" -> 2 2 2 1. Throws HostsError.
std::vector<int> expand_tasks(const std::string& text) {
  const auto bad = [&] {
    return HostsError("SLURM_TASKS_PER_NODE='" + text +
                      "' is not Slurm's N or N(xK) list (like 2(x3),1); "
                      "run under salloc or sbatch, which set it");
  };
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    int count = 0, repeat = 1;
    std::string n = item.substr(0, item.find('('));
    if (!parse_number(n, count) || count < 0) throw bad();
    if (n.size() < item.size()) {
      std::string rest = item.substr(n.size());
      if (!rest.starts_with("(x") || !rest.ends_with(")") ||
          !parse_number(rest.substr(2, rest.size() - 3), repeat) ||
          repeat < 1 || repeat > static_cast<int>(kMaxHostlistHosts)) {
        throw bad();
      }
    }
    out.insert(out.end(), static_cast<size_t>(repeat), count);
    if (out.size() > kMaxHostlistHosts) throw bad();
    pos = comma + 1;
  }
  return out;
}

}  // namespace

SlurmAllocation read_slurm_allocation(const agent::EnvMap& env) {
  SlurmAllocation a;
  const std::string* id = first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!id) {
    throw HostsError(
        "--launcher slurm runs inside a Slurm allocation, and SLURM_JOB_ID is "
        "not set; run dlaunch under salloc or in an sbatch script");
  }
  a.job_id = *id;
  std::string which;
  const std::string* list =
      first_of(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &which);
  if (!list) {
    throw HostsError("Slurm job " + a.job_id +
                     ": SLURM_JOB_NODELIST is not set; run dlaunch under "
                     "salloc or in an sbatch script, which set it");
  }
  try {
    a.nodes = expand_hostlist(*list);
  } catch (const HostlistError& e) {
    throw HostsError(which + "='" + *list + "': " + e.what());
  }
  std::string count_name;
  if (const std::string* count =
          first_of(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}, &count_name)) {
    int n = 0;
    if (!parse_number(*count, n) || n != static_cast<int>(a.nodes.size())) {
      throw HostsError(count_name + "=" + *count + " but " + which + "='" +
                       *list + "' names " + std::to_string(a.nodes.size()) +
                       " node(s); run dlaunch in an unaltered Slurm "
                       "environment");
    }
  }
  if (const std::string* tasks = first_of(env, {"SLURM_TASKS_PER_NODE"})) {
    a.tasks_per_node = expand_tasks(*tasks);
    if (a.tasks_per_node.size() != a.nodes.size()) {
      throw HostsError("SLURM_TASKS_PER_NODE='" + *tasks + "' counts " +
                       std::to_string(a.tasks_per_node.size()) +
                       " node(s) but " + which + " names " +
                       std::to_string(a.nodes.size()) +
                       "; run dlaunch in an unaltered Slurm environment");
    }
  }
  return a;
}

std::vector<Host> slurm_hosts(const SlurmAllocation& alloc,
                              const std::vector<Host>& given) {
  for (const Host& h : given) {
    if (std::find(alloc.nodes.begin(), alloc.nodes.end(), h.name) ==
        alloc.nodes.end()) {
      std::string all;
      for (const std::string& n : alloc.nodes)
        all += (all.empty() ? "" : ",") + n;
      throw HostsError("--launcher slurm: host '" + h.name +
                       "' is not in Slurm job " + alloc.job_id +
                       "'s allocation (" + all +
                       "); name nodes of the allocation, or drop --hosts "
                       "and --hostfile to use all of them");
    }
  }
  std::vector<Host> out;
  for (size_t i = 0; i < alloc.nodes.size(); ++i) {
    const int planned =
        i < alloc.tasks_per_node.size() ? alloc.tasks_per_node[i] : 0;
    if (given.empty()) {
      out.push_back(Host{.name = alloc.nodes[i], .slots = planned});
      continue;
    }
    for (const Host& h : given) {
      if (h.name != alloc.nodes[i]) continue;
      Host mine = h;
      if (mine.slots == 0) mine.slots = planned;
      out.push_back(std::move(mine));
    }
  }
  return out;
}

}  // namespace dlaunch::launcher
