#include "launcher/slurm.h"

#include <algorithm>
#include <cstdint>

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

// The fix for allocation variables that disagree: salloc and sbatch set
// them consistently.
constexpr char kUnalteredAllocation[] =
    "; run dlaunch in an unaltered Slurm environment";

// "2(x3),1" -> 2 2 2 1. Throws HostsError.
std::vector<int> expand_tasks(const std::string& text) {
  const auto bad = [&] {
    return HostsError("SLURM_TASKS_PER_NODE='" + text +
                      "' is not Slurm's N or N(xK) list (like 2(x3),1); "
                      "run under salloc or sbatch, which set it");
  };
  std::vector<int> out;
  for (std::string_view field : split_fields(text, ',')) {
    const std::string item(field);
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
                       " node(s)" + kUnalteredAllocation);
    }
  }
  if (const std::string* tasks = first_of(env, {"SLURM_TASKS_PER_NODE"})) {
    a.tasks_per_node = expand_tasks(*tasks);
    if (a.tasks_per_node.size() != a.nodes.size()) {
      throw HostsError("SLURM_TASKS_PER_NODE='" + *tasks + "' counts " +
                       std::to_string(a.tasks_per_node.size()) +
                       " node(s) but " + which + " names " +
                       std::to_string(a.nodes.size()) + kUnalteredAllocation);
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

std::optional<SlurmTask> read_slurm_task(const agent::EnvMap& env) {
  const std::string* step = first_of(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  const std::string* procid = first_of(env, {"SLURM_PROCID"});
  const std::string* nodeid = first_of(env, {"SLURM_NODEID"});
  if (!step || !procid || !nodeid) return std::nullopt;
  SlurmTask t;
  t.step_id = *step;
  const std::string* id = first_of(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  t.job_id = id ? *id : "";
  const std::string where = "Slurm step " + t.job_id + "." + t.step_id;
  // Every broken step variable has one fix: srun sets them all.
  const auto broken = [&](const std::string& what) {
    return HostsError(where + ": " + what +
                      "; run dlaunch as a task of an unaltered srun step");
  };
  const auto bad = [&](const std::string& name, const std::string& value,
                       const std::string& why) {
    return broken(name + "='" + value + "' " + why);
  };
  if (t.job_id.empty()) throw broken("SLURM_JOB_ID is not set");
  std::string list_name;
  const std::string* list = first_of(
      env, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"},
      &list_name);
  if (!list) throw broken("SLURM_STEP_NODELIST is not set");
  try {
    t.nodes = expand_hostlist(*list);
  } catch (const HostlistError& e) {
    throw bad(list_name, *list, std::string("is not a hostlist: ") + e.what());
  }
  const int nodes = static_cast<int>(t.nodes.size());
  std::string count_name;
  if (const std::string* count = first_of(
          env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, &count_name)) {
    int n = 0;
    if (!parse_number(*count, n) || n != nodes) {
      throw bad(count_name, *count,
                "disagrees with " + list_name + "='" + *list + "' (" +
                    std::to_string(nodes) + " node(s))");
    }
  }
  if (!parse_number(*nodeid, t.node_id) || t.node_id < 0 ||
      t.node_id >= nodes) {
    throw bad("SLURM_NODEID", *nodeid,
              "is not a node of " + list_name + " (0.." +
                  std::to_string(nodes - 1) + ")");
  }
  // dlaunch starts its node's workers itself: a second task on a node
  // would start them twice.
  std::string tasks_name;
  const std::string* tasks =
      first_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, &tasks_name);
  const std::string* local = first_of(env, {"SLURM_LOCALID"});
  int ntasks = 0, localid = 0;
  if ((tasks && parse_number(*tasks, ntasks) && ntasks > nodes) ||
      (local && parse_number(*local, localid) && localid > 0)) {
    throw HostsError(
        where + " runs " +
        (tasks ? *tasks + " tasks" : std::string("several tasks")) + " on " +
        std::to_string(nodes) +
        " node(s), and dlaunch, which starts its node's workers itself, must "
        "run once per node; start it with srun --ntasks-per-node=1 (and "
        "give the workers per node with --nproc-per-node)");
  }
  if (const std::string* ports = first_of(env, {"SLURM_STEP_RESV_PORTS"})) {
    // "12000-12003" or "12000,12005": the first one.
    std::string first = ports->substr(0, ports->find_first_of(",-"));
    if (!parse_number(first, t.reserved_port) || t.reserved_port < 1 ||
        t.reserved_port > 65535) {
      throw bad("SLURM_STEP_RESV_PORTS", *ports, "is not a port range");
    }
  }
  return t;
}

int slurm_store_port(const SlurmTask& t, const agent::EnvMap& env) {
  if (const std::string* given = first_of(env, {"MASTER_PORT"})) {
    int port = 0;
    if (!parse_in_range(*given, 1, 65535, port)) {
      throw HostsError("MASTER_PORT='" + *given +
                       "' (the agents' store port of Slurm step " + t.job_id +
                       "." + t.step_id + ") is not " +
                       range_text("a port", 1, 65535) +
                       "; set it to a free port like 29400, or unset it");
    }
    return port;
  }
  if (t.reserved_port != 0) return t.reserved_port;
  // FNV-1a: the same on every node and every build, unlike std::hash.
  uint32_t h = 2166136261u;
  for (char c : t.job_id + "." + t.step_id) {
    h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  }
  return 20000 + static_cast<int>(h % 10000);
}

void apply_slurm_task(LaunchOptions& o, const SlurmTask& t,
                      const agent::EnvMap& env) {
  agent::rendezvous::RendezvousOptions& r = o.rdzv;
  // etcd needs its own members (--rdzv-endpoint): the check says so.
  if (t.nodes.size() < 2 || r.backend == "etcd") return;
  r.min_nodes = r.max_nodes = static_cast<int>(t.nodes.size());
  o.nnodes_given = true;  // the step's, printed in job.yaml
  if (r.backend == "static") {
    r.node_rank = t.node_id;
    // As --master-addr NODE0 would say by hand (c10d refuses it).
    o.agent.master_addr = t.nodes[0];
  }
  r.endpoint_host = t.nodes[0];
  r.endpoint_port = slurm_store_port(t, env);
  r.endpoints = {t.nodes[0] + ":" + std::to_string(r.endpoint_port)};
  if (!r.is_host) r.is_host = t.node_id == 0;
  if (r.local_addr.empty()) r.local_addr = t.nodes[t.node_id];
  if (o.agent.run_id.empty()) o.agent.run_id = t.job_id + "." + t.step_id;
}

}  // namespace dlaunch::launcher
