#include "launcher/job_print.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <sstream>

#include "agent/worker_env.h"
#include "launcher/cli.h"
#include "launcher/flags.h"
#include "launcher/hosts.h"
#include "launcher/job_file.h"
#include "launcher/multi_host.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string part; std::getline(in, part, sep);) out.push_back(part);
  return out;
}

// A path as the job file writes it: absolute, from `base` (the current
// folder when empty); a bare command name (python3) stays a PATH lookup.
std::string absolute(const std::string& p, bool command,
                     const fs::path& base = {}) {
  if (p.empty() || (command && p.find('/') == std::string::npos)) return p;
  std::error_code ec;  // (the current folder unreadable: as given)
  const fs::path here = fs::absolute(p, ec);
  const fs::path full = base.empty() || fs::path(p).is_absolute()
                            ? (ec ? fs::path(p) : here)
                            : base / p;
  return full.lexically_normal().string();
}

// Literal text, so the loader's ${VAR} expansion gives it back unchanged:
// "${" becomes "$${" (${local_rank} stays the worker's placeholder).
std::string literal(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "${") == 0 && s.compare(i, 13, "${local_rank}") != 0) {
      out += '$';
    }
    out += s[i];
  }
  return out;
}

// An env value as printed: a secret becomes a reference to the launching
// environment.
std::string env_value(const std::string& name, const std::string& value) {
  return is_secret_name(name) ? "${" + name + "}" : literal(value);
}

// An export item as printed: a secret's NAME=VALUE becomes NAME=${NAME}
// (an error on the rerun when unset, as env: gives); a bare NAME, forwarded
// when set, stays as given.
std::string export_item(const std::string& item) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) return literal(item);
  const std::string name = item.substr(0, eq);
  return name + "=" + env_value(name, item.substr(eq + 1));
}

std::string host_text(const Host& h) {
  const std::string out =
      h.slots > 0 ? h.name + ":" + std::to_string(h.slots) : h.name;
  return h.gpus.empty() ? out : out + " (GPUs " + gpu_list(h.gpus) + ")";
}

// Where the agents run: --chdir from the launch folder; empty: here.
fs::path agents_dir(const LaunchOptions& o) {
  if (o.remote.chdir.empty()) return {};
  std::error_code ec;  // (the current folder unreadable: as given)
  const fs::path absolute = fs::absolute(o.remote.chdir, ec);
  return fs::path(o.remote.chdir).is_absolute() || o.launch_dir.empty()
             ? (ec ? fs::path(o.remote.chdir) : absolute)
             : o.launch_dir / o.remote.chdir;
}

// One argument as a shell would need it written.
std::string shell_word(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                          "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789_-./=:,+@%") == std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string job_yaml(const LaunchOptions& o, bool with_run_id) {
  const fs::path agents = agents_dir(o);
  YAML::Emitter out;
  out << YAML::BeginMap;
  // A script is a path even without a '/'; an executable or a module name
  // may be a lookup.
  out << YAML::Key << "program" << YAML::Value
      << literal(absolute(o.program, !runs_a_script(o), agents));
  out << YAML::Key << "args" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const std::string& a : o.program_args) out << literal(a);
  out << YAML::EndSeq;
  for (const FlagSpec& f : flags()) {
    if (f.action || (!with_run_id && f.key == "rdzv_id")) continue;
    std::optional<std::string> text = f.print(o);
    if (!text) continue;
    out << YAML::Key << std::string(f.key) << YAML::Value;
    switch (f.type) {
      case ValueType::kSwitch:
        out << (*text == "true");
        break;
      case ValueType::kList:
      case ValueType::kRepeated:
        out << YAML::Flow << YAML::BeginSeq;
        for (const std::string& item :
             split(*text, f.type == ValueType::kList ? ',' : '\n')) {
          out << (f.key == "export" ? export_item(item) : literal(item));
        }
        out << YAML::EndSeq;
        break;
      case ValueType::kMap:
        out << YAML::Flow << YAML::BeginMap;
        for (const std::string& kv : split(*text, ',')) {
          size_t eq = kv.find('=');
          const std::string key = kv.substr(0, eq);
          const std::string value = kv.substr(eq + 1);
          out << YAML::Key << key << YAML::Value
              << literal(is_rdzv_conf_path(key) ? absolute(value, false)
                                                : value);
        }
        out << YAML::EndMap;
        break;
      case ValueType::kPath:
      case ValueType::kCommand: {
        // What the agents use is theirs to resolve; what dlaunch reads
        // (env_file, hostfile, chdir) is the launch folder's.
        const bool command = f.type == ValueType::kCommand;
        out << literal(
            absolute(*text, command,
                     command || f.key == "log_dir" ? agents : o.launch_dir));
        break;
      }
      default:
        out << literal(*text);
    }
  }
  if (!o.env.empty()) {
    out << YAML::Key << "env" << YAML::Value << YAML::BeginMap;
    for (const auto& [name, value] : o.env) {
      out << YAML::Key << name << YAML::Value << env_value(name, value);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return "# The effective dlaunch job; rerun it with: dlaunch --config FILE\n" +
         std::string(out.c_str()) + "\n";
}

// The workers `h` runs, as launch_hosts() decides (workers_on()): its
// GPUs, else its slots unless --nproc-per-node was given, else
// --nproc-per-node. -1 where the host resolves cpu, gpu or auto itself.
int host_workers(const LaunchOptions& o, const Host& h) {
  const std::string n = workers_on(o, h);
  int count = 0;
  return parse_number(n, count) ? count : -1;
}

std::string host_workers_text(const LaunchOptions& o, const Host& h) {
  const int n = host_workers(o, h);
  if (n >= 0) return std::to_string(n) + " on " + h.name;
  const std::string& spec = o.nproc_per_node_spec;
  return std::string(spec == "cpu"   ? "one per CPU"
                     : spec == "gpu" ? "one per GPU"
                                     : "one per GPU (else per CPU)") +
         " of " + h.name;
}

std::string dry_run_plan(const LaunchOptions& o) {
  const std::string kRdzv = "<decided at rendezvous>";
  const bool multi = o.hosts.size() > 1 || o.rdzv.max_nodes > 1;
  std::ostringstream s;
  s << "dlaunch --dry-run: the plan; nothing was started.\n\n";
  s << "job\n";
  s << "  config:    "
    << (o.config_file.empty() ? "none (flags only)" : o.config_file.string())
    << "\n";
  std::string cmd;
  for (const std::string& w : o.agent.entrypoint) {
    cmd += (cmd.empty() ? "" : " ") + shell_word(w);
  }
  s << "  command:   " << cmd << "\n";
  // One host that is this machine runs here, as one node without a head.
  const bool head_needed =
      o.hosts.size() > 1 || (o.hosts.size() == 1 && plan_hosts(o).needs_head);
  if (o.hosts.empty()) {
    s << "  hosts:     this node only\n";
  } else if (!head_needed) {
    s << "  hosts:     " << host_text(o.hosts[0])
      << " (this machine: its agent runs here, no head)\n";
  } else {
    std::string names;
    for (const Host& h : o.hosts) {
      names += (names.empty() ? "" : ", ") + host_text(h);
    }
    s << "  hosts:     " << names
      << " (one agent each, started with --launcher " << o.remote.launcher
      << " after a pre-flight of every host; ranks and GPU counts of other "
         "hosts are decided there)\n";
  }
  const bool hosts_job = !o.hosts.empty();
  const bool gpus_elsewhere =
      !hosts_job && !o.nproc_per_node_unresolved.empty();
  // Workers on the (first) node, -1 where the host that runs it counts.
  const int first_count = hosts_job        ? host_workers(o, o.hosts[0])
                          : gpus_elsewhere ? -1
                                           : o.agent.nproc_per_node;
  const std::string& spec = o.nproc_per_node_spec;
  const std::string kCount = spec == "cpu" ? "<the CPU count of the host "
                                             "that runs it>"
                             : spec == "gpu"
                                 ? "<the GPU count of the host that runs it>"
                                 : "<the GPU count (else the CPU count) of "
                                   "the host that runs it>";
  if (hosts_job) {
    // What launch_hosts() starts on each; a host counts cpu, gpu or auto
    // itself.
    std::string each;
    for (const Host& h : o.hosts) {
      each += (each.empty() ? "" : ", ") + host_workers_text(o, h);
    }
    s << "  workers:   " << each;
  } else if (gpus_elsewhere) {
    s << "  workers:   one per visible CUDA device"
      << (spec == "auto" ? ", else one per CPU" : "") << " (--nproc-per-node "
      << spec << "; not resolved here: " << o.nproc_per_node_unresolved << ")";
  } else {
    s << "  workers:   " << o.agent.nproc_per_node << " on this node";
  }
  if (multi || first_count < 0) {
    s << ", world size " << (multi ? kRdzv : kCount);
  } else {
    s << ", world size " << first_count;
  }
  s << "\n";
  std::string etcd;
  for (const std::string& e : o.rdzv.etcd_endpoints) {
    etcd += (etcd.empty() ? ", etcd at " : ", ") + e;
  }
  if (head_needed) {
    // launch_hosts(): the head's own store, one agent per host.
    const auto& r = o.rdzv;
    const int n = static_cast<int>(o.hosts.size());
    s << "  rendezvous: c10d, store hosted here on "
      << (r.endpoint_host.empty() || r.endpoint_port == 0
              ? std::string("a free port")
              : "port " + std::to_string(r.endpoint_port))
      << "; "
      << (r.min_nodes == r.max_nodes
              ? "every host's agent joins"
              : "from " + std::to_string(r.min_nodes) + " to " +
                    std::to_string(r.max_nodes) + " of the " +
                    std::to_string(n) + " hosts' agents join")
      << "\n";
  } else {
    s << "  rendezvous: " << o.rdzv.backend
      << (o.standalone ? ", store hosted here on a free port (standalone)"
          : o.rdzv.backend == "etcd" ? etcd
          : o.rdzv.endpoint_host.empty()
              ? ", this node alone (no store)"
              : ", store at " +
                    (o.rdzv.endpoint_host.find(':') != std::string::npos
                         ? "[" + o.rdzv.endpoint_host + "]"
                         : o.rdzv.endpoint_host) +
                    ":" + std::to_string(o.rdzv.endpoint_port))
      << "\n";
  }
  s << "  restarts:  up to " << o.agent.max_restarts << "; SIGKILL "
    << format_seconds(o.agent.term_timeout) << " s after SIGTERM\n";
  std::string run_id =
      o.agent.run_id.empty() ? "<random, chosen at start>" : o.agent.run_id;
  // The run folder as the agents make it: inside --chdir.
  const fs::path run_dir =
      o.agent.log_dir.empty()
          ? fs::path()
          : fs::path(absolute(o.agent.log_dir.string(), false, agents_dir(o))) /
                run_id;
  if (o.agent.log_dir.empty()) {
    s << "  logs:      none (console only)\n";
  } else {
    s << "  logs:      " << (run_dir / "attempt_K/LOCAL_RANK").string()
      << "/{stdout,stderr}.log, " << (run_dir / "summary.json").string() << ", "
      << (run_dir / "job.yaml").string() << " (" << run_id
      << ".N, the first N free, when an earlier run's logs are there)\n";
  }
  for (const agent::Fault& f : o.agent.faults) {
    s << "  fault:     " << f.spec << " (" << agent::fault_action(f) << ")\n";
  }
  if (o.agent.hang_timeout.count() > 0) {
    s << "  hangs:     a worker without progress for "
      << format_seconds(o.agent.hang_timeout) << " s is failed\n";
  }

  // What the job sets (env map, --env-file, -x: a bad --env-file throws as
  // the run would), secrets hidden.
  // A bare -x NAME's value is the launching environment's: named, not
  // shown (dry runs end up in CI logs).
  agent::EnvMap shown;
  for (const auto& [name, value] :
       asked_environment(o, agent::current_environment())) {
    const bool bare =
        std::ranges::find(o.remote.exports, name) != o.remote.exports.end();
    shown[name] = is_secret_name(name) ? "<secret, not shown>"
                  : bare               ? "<this environment's value>"
                                       : value;
  }
  // A count the host makes: worker 0 stands for them all. Hosts: the
  // first host's workers stand for every host's.
  const bool counted_there = first_count < 0;
  const int nproc = counted_there ? 1 : first_count;
  if (hosts_job) {
    s << "\nthe workers of " << o.hosts.front().name
      << " (each host's are alike, with its own count)\n";
  }
  // One node: the ranks are known; several: shown as if this node were
  // group rank 0 of one (the rendezvous decides).
  for (int i = 0; i < nproc; ++i) {
    agent::WorkerIdentity id{.local_rank = i,
                             .rank = i,
                             .world_size = nproc,
                             .local_world_size = nproc,
                             .group_rank = 0,
                             .group_world_size = 1,
                             .role_rank = i,
                             .role_world_size = nproc};
    agent::JobInfo job{.role = o.agent.role,
                       .master_addr = o.agent.master_addr,
                       .master_port = o.agent.master_port,
                       .restart_count = 0,
                       .max_restarts = o.agent.max_restarts,
                       .run_id = run_id};
    std::string error_file =
        o.agent.log_dir.empty()
            ? "<a temporary folder>/" + std::to_string(i) + "/error.json"
            : (run_dir / "attempt_K" / std::to_string(i) / "error.json")
                  .string();
    s << "\nworker " << i << " (local rank " << i << ")\n  command: ";
    std::string line;
    for (const std::string& w : o.agent.entrypoint) {
      line +=
          (line.empty() ? "" : " ") +
          shell_word(agent::substitute(w, {{"local_rank", std::to_string(i)}}));
    }
    s << line << "\n  environment (set on top of dlaunch's own):\n";
    std::vector<std::string> vars =
        agent::worker_environment(shown, id, job, error_file);
    // Worker 0 stands for a count the host makes: what more than one gets.
    if (counted_there && !shown.contains("OMP_NUM_THREADS")) {
      vars.push_back("OMP_NUM_THREADS=1 (when the host runs more than one)");
      std::sort(vars.begin(), vars.end());
    }
    for (std::string kv : vars) {
      std::string name = kv.substr(0, kv.find('='));
      std::string value = kv.substr(kv.find('=') + 1);
      // Hosts: group rank 0 of the agents the head starts, one host too.
      if (name == "MASTER_ADDR" &&
          (head_needed || (multi && o.rdzv.backend != "static"))) {
        value = "<group rank 0's address, " + kRdzv.substr(1);
      } else if (name == "MASTER_PORT" && o.agent.master_port == 0) {
        value = "<a free port, chosen when each attempt starts>";
      } else if (name == "TORCHELASTIC_RESTART_COUNT") {
        value = "0 (K on the Kth restart)";
      } else if (counted_there &&
                 (name == "LOCAL_WORLD_SIZE" || name == "WORLD_SIZE" ||
                  name == "ROLE_WORLD_SIZE")) {
        value = multi && name != "LOCAL_WORLD_SIZE" ? kRdzv : kCount;
      } else if (multi && (name == "RANK" || name == "WORLD_SIZE" ||
                           name == "GROUP_RANK" || name == "GROUP_WORLD_SIZE" ||
                           name == "ROLE_RANK" || name == "ROLE_WORLD_SIZE")) {
        value = kRdzv;
      }
      s << "    " << name << "=" << value << "\n";
    }
  }
  return s.str();
}

}  // namespace dlaunch::launcher
