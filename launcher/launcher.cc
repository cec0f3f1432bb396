#include "launcher/launcher.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <variant>

#include "agent/agent.h"
#include "agent/posix_env.h"
#include "agent/rendezvous/c10d_rendezvous.h"
#include "agent/rendezvous/remote_rendezvous.h"
#include "agent/rendezvous/remote_wire.h"
#include "agent/rendezvous/static_rendezvous.h"
#include "agent/report.h"
#include "comm/store/client.h"
#include "comm/store/resolve.h"
#include "comm/store/server.h"
#include "comm/store/text.h"
#include "comm/store/token.h"
#include "launcher/cli.h"
#include "launcher/drill.h"
#include "launcher/error_file.h"
#include "launcher/job_print.h"
#include "launcher/job_token.h"
#include "launcher/multi_host.h"
#include "launcher/read_text.h"
#include "launcher/remote_agent.h"
#include "launcher/this_machine.h"

namespace dlaunch::launcher {
namespace {

void write_stderr(const std::string& s) {
  note_error(s);
  agent::write_all(STDERR_FILENO, s);
}

// The bound on handing a node's end to a multi-host head's store.
constexpr std::chrono::milliseconds kHandOffTimeout(5000);

// The text of the error file at `path` ("" when unset, unreadable or not
// a regular file; bounded as a worker's is).
std::string read_error_text(const std::string& path) {
  return path.empty() ? "" : agent::read_error_bytes(path);
}

// Makes LOG_DIR/RUN_ID for this run, or LOG_DIR/RUN_ID.N (the first N
// free) when another run holds it (a rerun, c10d's default id "none", or
// another node's agent on a shared folder), and sets agent.run_dir_name:
// no run writes over another's logs. mkdir claims it, so two runs never
// take one folder. Returns "" with the folder made; "" without it when
// LOG_DIR/RUN_ID cannot be made (the agent then fails on it at once:
// "cannot create the run folder"); else why this run cannot log beside
// the other (the job must not start: it would write into the other's).
std::string claim_run_dir(LaunchOptions& o) {
  const std::string& id = o.agent.run_id;
  std::error_code ec;
  std::filesystem::create_directories(o.agent.log_dir, ec);
  if (ec) return "";
  for (int n = 0;; ++n) {
    const std::string name = n == 0 ? id : id + "." + std::to_string(n);
    const std::filesystem::path dir = o.agent.log_dir / name;
    if (::mkdir(dir.c_str(), 0777) == 0) {
      if (n > 0) {
        write_stderr("dlaunch: note: " + (o.agent.log_dir / id).string() +
                     " holds another run's logs (an earlier one, or another "
                     "node's on a shared folder); this run's go to " +
                     dir.string() + "\n");
      }
      o.agent.run_dir_name = name;
      return "";
    }
    if (errno != EEXIST) {
      if (n == 0) return "";
      const int e = errno;
      return "dlaunch: cannot create the run folder " + dir.string() + ": " +
             std::strerror(e) + "; " +
             (e == ENAMETOOLONG ? "give a shorter --rdzv-id or another "
                                  "--log-dir"
                                : "check --log-dir") +
             " (" + (o.agent.log_dir / id).string() +
             " holds another run's logs, which this run must not write over)";
    }
  }
}

// LOG_DIR/RUN_ID/job.yaml: the effective job (a host of a multi-host job:
// the whole job, not its part), so `dlaunch --config` on it
// reruns the job into a fresh log folder. A failure to write it is a
// warning, not fatal. A run folder that cannot be made is left to the
// agent, which fails on it at once ("cannot create the run folder"): a
// warning that the job runs without job.yaml would say the opposite.
void write_job_yaml(const LaunchOptions& o) {
  std::filesystem::path dir = o.agent.log_dir / o.agent.run_dir_name;
  std::filesystem::path file = dir / "job.yaml";
  std::ofstream out(file);
  out << (o.whole_job.empty() ? job_yaml(o, /*with_run_id=*/false)
                              : o.whole_job);
  out.close();
  if (!out) {
    write_stderr("dlaunch: warning: cannot write " + file.string() + ": " +
                 std::strerror(errno) + "; the job runs without it\n");
  }
}

using comm::store::is_loopback;

// This node's address for the others: --local-addr, else the master
// address for one node or static node rank 0, else the host name.
std::string node_address(const LaunchOptions& o) {
  const agent::rendezvous::RendezvousOptions& r = o.rdzv;
  if (!r.local_addr.empty()) return r.local_addr;
  if (r.max_nodes == 1 || (r.backend == "static" && r.node_rank == 0)) {
    return o.agent.master_addr;
  }
  return agent::host_name();
}

// The etcd backend runs in dlaunch-rdzv-etcd beside this program (or at
// $DLAUNCH_RDZV_ETCD): gRPC linked into dlaunch would slow every launch
// (docs/performance.md).
std::unique_ptr<agent::rendezvous::Rendezvous> etcd_rendezvous(
    const LaunchOptions& o, std::function<void(const std::string&)> log) {
  const agent::rendezvous::RendezvousOptions& r = o.rdzv;
  agent::rendezvous::RemoteRendezvous::Params p;
  if (const char* path = std::getenv("DLAUNCH_RDZV_ETCD"); path && *path) {
    p.program = path;
  } else {
    std::error_code ec;
    p.program = std::filesystem::read_symlink("/proc/self/exe", ec)
                    .replace_filename("dlaunch-rdzv-etcd")
                    .string();
  }
  if (::access(p.program.c_str(), X_OK) != 0) {
    throw std::runtime_error(
        "--rdzv-backend etcd: " + p.program +
        " is missing (build dlaunch with gRPC, DLAUNCH_WITH_ETCD, or install "
        "it beside dlaunch)");
  }
  p.settings = agent::rendezvous::remote::encode_options(r);
  p.settings["run_id"] = o.agent.run_id.empty() ? "none" : o.agent.run_id;
  p.settings["node_addr"] = node_address(o);
  p.settings["master_port"] = std::to_string(o.agent.master_port);
  p.log = std::move(log);
  p.open_timeout = r.join_timeout + r.read_timeout;
  p.grace = r.read_timeout;
  p.close_timeout = r.close_timeout;
  // A frozen agent loses its lease at its TTL, as c10d drops a silent one:
  // the helper renews it only while the agent's pings come.
  p.ping_every = std::clamp<std::chrono::milliseconds>(
      r.keep_alive_interval / 2, std::chrono::milliseconds(50),
      std::chrono::seconds(1));
  p.settings["agent_silence"] =
      std::to_string(std::max(r.keep_alive_interval, 2 * p.ping_every).count());
  return std::make_unique<agent::rendezvous::RemoteRendezvous>(std::move(p));
}

}  // namespace

void store_logs_to_stderr() {
  static std::once_flag once;
  std::call_once(once, [] {
    spdlog::set_default_logger(spdlog::stderr_color_mt("dlaunch"));
  });
}

int launch(const LaunchOptions& job, agent::RunResult* out) {
  LaunchOptions options = job;
  // Agents of one job must agree on its id: torchrun's default is "none".
  if (options.agent.run_id.empty() && !options.rdzv.endpoint_host.empty()) {
    options.agent.run_id = "none";
  }
  // Whether this agent hosts the c10d store: decided before the run folder
  // is made, as the endpoint's name lookup may fail (LookupTimeout).
  const agent::rendezvous::RendezvousOptions& r = options.rdzv;
  const bool hosts_c10d_store =
      !r.endpoint_host.empty() && r.backend != "etcd" &&
      (r.is_host.has_value()
           ? *r.is_host
           : names_this_machine(r.endpoint_host, r.local_addr, Loopback::kAny,
                                options.remote.connect_timeout));
  if (!options.agent.log_dir.empty()) {
    if (options.agent.run_id.empty())
      options.agent.run_id = agent::random_run_id();
    if (const std::string e = claim_run_dir(options); !e.empty()) {
      write_stderr(e + "\n");
      return 1;
    }
    if (!options.agent.run_dir_name.empty()) write_job_yaml(options);
  }
  agent::PosixEnv env;  // first: it records the limits workers get
  const JobToken token = job_token(r, agent::current_environment());
  if (auto warning = tokenless_warning(r, token)) write_stderr(*warning);
  auto pick_port = [&env](const std::string& host) {
    return env.free_port(host);
  };
  // The agents' store, when this agent hosts it (--standalone, or the
  // endpoint names this machine). Workers do not use it
  // (TORCHELASTIC_USE_AGENT_STORE=False: rank 0 serves theirs).
  std::unique_ptr<comm::store::StoreServer> store;
  std::unique_ptr<agent::rendezvous::Rendezvous> rdzv;
  if (r.endpoint_host.empty()) {
    if (options.standalone) {
      store_logs_to_stderr();
      try {
        store = comm::store::StoreServer::start(
            {.host = "127.0.0.1", .port = 0, .token = token.job});
      } catch (const std::exception& e) {
        throw std::runtime_error(
            std::string("--standalone: cannot host the rendezvous store: ") +
            e.what());
      }
    }
    rdzv = std::make_unique<agent::rendezvous::StaticRendezvous>(
        options.agent.master_addr, options.agent.master_port, pick_port);
  } else if (r.backend == "etcd") {
    // Progress lines queue for the console, as c10d's do.
    rdzv = etcd_rendezvous(
        options, [&env](const std::string& s) { env.write_console(2, s); });
  } else {
    const bool asked = r.is_host.has_value();
    int port = r.endpoint_port;
    std::string host_failure;
    if (hosts_c10d_store) {
      store_logs_to_stderr();
      try {
        store = comm::store::StoreServer::start(
            {.host = is_loopback(r.endpoint_host) ? r.endpoint_host : "0.0.0.0",
             .port = static_cast<uint16_t>(port),
             .token = token.job});
        port = store->port();
      } catch (const std::exception& e) {
        // Unasked, another agent of this machine may host it already.
        host_failure = e.what();
        if (asked || port == 0) {
          throw std::runtime_error(
              std::string("cannot host the agents' store (is_host): ") +
              e.what() +
              "; if another process holds the port, pick a free one "
              "(--rdzv-endpoint HOST:PORT, or MASTER_PORT for srun tasks)");
        }
        env.write_console(
            2, std::string(e.what()).find("in use") != std::string::npos
                   ? "dlaunch: port " + std::to_string(port) +
                         " of this machine is taken; joining the agents' "
                         "store there as another agent's\n"
                   : "dlaunch: cannot serve the agents' store here (" +
                         std::string(e.what()) +
                         "); joining it as another agent's\n");
      }
    }
    agent::rendezvous::C10dRendezvous::Params p;
    p.options = r;
    p.run_id = options.agent.run_id.empty() ? "none" : options.agent.run_id;
    p.store_host = r.endpoint_host;
    p.store_port = port;
    p.token = token.job;
    p.host_failure = host_failure;
    p.node_addr = node_address(options);
    p.master_port = options.agent.master_port;
    p.pick_port = pick_port;
    // Progress lines queue for the console like the agent's other
    // messages: a console that stops reading never stalls a round.
    p.log = [&env](const std::string& s) { env.write_console(2, s); };
    rdzv = std::make_unique<agent::rendezvous::C10dRendezvous>(std::move(p));
  }
  env.set_drain_timeout(options.agent.drain_timeout);
  // Workers inherit dlaunch's environment, where settle_host() put the
  // job's env map, --env-file and -x.
  agent::EnvMap base = agent::current_environment();
  // The workers' env:// store (served by rank 0) takes only this token.
  if (!token.workers.empty()) base[comm::store::kTokenEnv] = token.workers;
  // A drill's failures are its point, not the job's: its verdict is the
  // exit status, and no error file is left for the launcher.
  if (options.mode == LaunchOptions::Mode::kDrill) {
    base.erase("TORCHELASTIC_ERROR_FILE");
  }
  agent::RunResult result;
  {
    // The agent's messages queue behind the workers' lines: a stalled or
    // vanished console never blocks or kills the agent.
    agent::Agent agent(
        options.agent, env, *rdzv, std::move(base),
        [&env](const std::string& s) { env.write_console(2, s); });
    result = agent.run();
  }
  rdzv.reset();  // closes this agent's connections
  if (out != nullptr) *out = result;
  if (result.exit_code != 0) error_file_left();
  // A multi-host head collects from its store every host's faults for a
  // drill (drill.h), and a failed host's error file (error_file.h).
  std::vector<std::pair<std::string, std::string>> hand_off;
  const auto env_key = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  if (std::string key = env_key(kDrillKeyEnv); !key.empty()) {
    hand_off.emplace_back(key + "/" + options.agent.hostname,
                          encode_drill_part(result));
  }
  // (An agent stopped by a signal was stopped by the head, or lost it.)
  if (std::string key = env_key(kErrorKeyEnv);
      !key.empty() && result.exit_code != 0 && result.stop_signal == 0) {
    hand_off.emplace_back(
        key + "/" + options.agent.hostname,
        encode_host_failure(failure_of(
            result, read_error_text(env_key("TORCHELASTIC_ERROR_FILE")))));
  }
  if (!hand_off.empty() && !r.endpoint_host.empty()) {
    try {
      auto s = comm::store::TcpStore::connect(
          {.host = r.endpoint_host,
           .port = static_cast<uint16_t>(r.endpoint_port),
           // A head that died must not hold this agent long.
           .connect_timeout = std::min(r.read_timeout, kHandOffTimeout),
           .timeout = std::min(r.read_timeout, kHandOffTimeout),
           .token = token.job});
      for (const auto& [key, value] : hand_off) s->set(key, value);
    } catch (const std::exception& e) {
      write_stderr(std::string("dlaunch: warning: cannot hand this node's "
                               "faults or error file to the head: ") +
                   e.what() + "\n");
    }
  }
  // The hosting agent lets the others read the job's end before its store
  // goes away, within close_timeout (not when a signal stops it: then the
  // others learn that the host is gone).
  if (store && !r.endpoint_host.empty() && result.stop_signal == 0 &&
      !store->wait_idle(r.close_timeout)) {
    // By address: each agent holds a few connections, from its host.
    std::string from;
    size_t open = 0;
    for (const auto& [host, n] : store->peer_hosts()) {
      from += (from.empty() ? " from " : ", ") + host + " (" +
              std::to_string(n) + ")";
      open += n;
    }
    if (open == 0) open = store->num_connections();
    write_stderr("dlaunch: " + std::to_string(open) + " agent connection(s)" +
                 from + " still open on this node's store " +
                 comm::store::format_duration(r.close_timeout) +
                 " (close_timeout) after the end; closing it\n");
  }
  return result.exit_code;
}

namespace {

int run_main(const std::vector<std::string>& args) {
  ParseResult parsed =
      parse_command_line(args, agent::current_environment(), write_stderr);
  if (std::holds_alternative<HelpRequested>(parsed)) {
    agent::write_all(STDOUT_FILENO, help_text());
    return 0;
  }
  if (std::holds_alternative<VersionRequested>(parsed)) {
    agent::write_all(STDOUT_FILENO, "dlaunch " DLAUNCH_VERSION "\n");
    return 0;
  }
  if (auto* e = std::get_if<UsageError>(&parsed)) {
    write_stderr(e->message + "\n");
    return e->exit_code;
  }
  const LaunchOptions& options = std::get<LaunchOptions>(parsed);
  switch (options.mode) {
    case LaunchOptions::Mode::kPrintConfig:
      agent::write_all(STDOUT_FILENO, job_yaml(options, true));
      return 0;
    case LaunchOptions::Mode::kDryRun:
      try {
        agent::write_all(STDOUT_FILENO, dry_run_plan(options));
      } catch (const std::runtime_error& e) {  // LookupTimeout, --env-file
        write_stderr(std::string("dlaunch: ") + e.what() + "\n");
        return 2;
      }
      return 0;
    case LaunchOptions::Mode::kRun:
      break;
    case LaunchOptions::Mode::kDrill:
      // Its failures are its point: no error file is left for the
      // launcher.
      ::unsetenv("TORCHELASTIC_ERROR_FILE");
      break;
  }
  // Other hosts: this machine is the head (multi_host.h). This one alone:
  // its slots or GPUs decide its workers, as they would there.
  HostPlan hosts;
  try {
    hosts = plan_hosts(options);
  } catch (const LookupTimeout& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 2;
  }
  // A .py program where this machine runs workers (one host that is this
  // machine, or the head's own host); the other hosts' pre-flight looks
  // there.
  if (!options.hosts.empty() && (!hosts.needs_head || hosts.in_process)) {
    if (std::string e = missing_script(options); !e.empty()) {
      write_stderr(e + "\n");
      return 127;
    }
  }
  if (hosts.needs_head) return launch_hosts(options, hosts);
  // --export, --env-file and --chdir hold for this node as for any host.
  // A relative --chdir is the launch folder's: job.yaml (written from the
  // new folder) names it absolute.
  std::string chdir;
  try {
    chdir =
        settle_host(asked_environment(options, agent::current_environment()),
                    options.remote.chdir);
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 2;
  }
  LaunchOptions here = options;
  here.remote.chdir = chdir;
  if (!options.hosts.empty()) {
    const Host& h = options.hosts[0];
    if (h.gpus.empty() && !options.nproc_per_node_unresolved.empty()) {
      write_stderr("dlaunch: --nproc-per-node " + options.nproc_per_node_spec +
                   ": " + options.nproc_per_node_unresolved + "\n");
      return 2;
    }
    if (!h.gpus.empty()) {
      here.agent.nproc_per_node = static_cast<int>(h.gpus.size());
      std::string list;
      for (int g : h.gpus)
        list += (list.empty() ? "" : ",") + std::to_string(g);
      ::setenv("CUDA_VISIBLE_DEVICES", list.c_str(), 1);
    } else if (h.slots > 0 && !options.nproc_per_node_given) {
      here.agent.nproc_per_node = h.slots;
    }
    here.agent.hostname = h.name;
  }
  try {
    if (options.mode == LaunchOptions::Mode::kDrill) {
      agent::RunResult result;
      launch(here, &result);
      std::vector<std::string> specs;
      for (const agent::Fault& f : here.agent.faults) specs.push_back(f.spec);
      bool passed = false;
      agent::write_all(STDOUT_FILENO, drill_verdict(result, specs, passed));
      return passed ? 0 : 1;
    }
    return launch(here);
  } catch (const comm::store::TokenError& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 2;
  } catch (const LookupTimeout& e) {  // the rendezvous endpoint's name
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 2;
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // The head's commands on its hosts (agent_launcher.h).
  if (!args.empty() && args[0] == "--remote-agent") {
    return remote_agent_main(args);
  }
  if (!args.empty() && args[0] == "--remote-check") {
    return remote_check_main(args);
  }
  if (!args.empty() && args[0] == "--remote-stop") {
    return remote_stop_main(args);
  }
  // A failure no agent or host explained leaves dlaunch's own error.
  const int code = run_main(args);
  leave_error_file(code);
  return code;
}

}  // namespace dlaunch::launcher
