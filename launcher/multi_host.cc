#include "launcher/multi_host.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include "agent/agent.h"
#include "agent/env.h"
#include "agent/posix_env.h"
#include "agent/report.h"
#include "comm/store/client.h"
#include "comm/store/server.h"
#include "comm/store/text.h"
#include "launcher/agent_launcher.h"
#include "launcher/command_runner.h"
#include "launcher/drill.h"
#include "launcher/error_file.h"
#include "launcher/flags.h"
#include "launcher/host_losses.h"
#include "launcher/hosts.h"
#include "launcher/job_print.h"
#include "launcher/launcher.h"
#include "launcher/read_text.h"
#include "launcher/ship.h"
#include "launcher/staging.h"
#include "launcher/this_machine.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

void write_stderr(const std::string& s) {
  note_error(s);
  agent::write_all(STDERR_FILENO, s);
}

// `bytes` random bytes as hex, from the OS's generator.
std::string random_hex(size_t bytes) {
  std::random_device rd;
  std::string out;
  const char* digits = "0123456789abcdef";
  for (size_t i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xff;
    out += digits[v >> 4];
    out += digits[v & 15];
  }
  return out;
}

bool forwarded_by_default(const std::string& name) {
  if (name == "PATH" || name == "LD_LIBRARY_PATH") return true;
  // The head's own agent bookkeeping is not the job's.
  if (name == "DLAUNCH_AGENT_TAG" || name == "DLAUNCH_JOB_TAG" ||
      name == "DLAUNCH_RDZV_TOKEN") {
    return false;
  }
  // The head's faults (these included) travel as --fault in each agent's
  // arguments: forwarded too, each would be given twice.
  if (name == "DLAUNCH_FAULTS") return false;
  for (const char* p :
       {"NCCL_", "CUDA_", "GLOO_", "OMP_", "PYTHON", "DLAUNCH_", "TORCH"}) {
    if (name.starts_with(p)) return true;
  }
  return false;
}

// The flags the head decides for every agent, left out of the job's.
bool head_decides(std::string_view name) {
  for (const char* n : {"nnodes", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
                        "node-rank", "local-addr", "standalone",
                        "nproc-per-node", "master-addr", "rdzv-conf"}) {
    if (name == n) return true;
  }
  return false;
}

// Whether `program` is a path or a name found in `env`'s PATH.
bool in_path(const std::string& program, const agent::EnvMap& env) {
  if (program.find('/') != std::string::npos) return true;
  auto path = env.find("PATH");
  std::istringstream dirs(path == env.end() ? "" : path->second);
  for (std::string d; std::getline(dirs, d, ':');) {
    if (::access((fs::path(d.empty() ? "." : d) / program).c_str(), X_OK) ==
        0) {
      return true;
    }
  }
  return false;
}

// A client of the head's own store (the agents' meeting place).
std::unique_ptr<comm::store::TcpStore> own_store(uint16_t port,
                                                 const std::string& token) {
  return comm::store::TcpStore::connect(
      {.host = "127.0.0.1",
       .port = port,
       .connect_timeout = std::chrono::seconds(10),
       .timeout = std::chrono::seconds(10),
       .token = token});
}

// The pre-flight table: one line per host that failed, all at once.
std::string preflight_table(const std::vector<PreflightFailure>& failures,
                            size_t hosts) {
  size_t width = 4;
  for (const auto& f : failures) width = std::max(width, f.host.size());
  std::string out = "dlaunch: pre-flight failed on " +
                    std::to_string(failures.size()) + " of " +
                    std::to_string(hosts) + " host(s); nothing was started:\n";
  out += "  " + std::string("HOST") + std::string(width - 4 + 2, ' ') +
         "PROBLEM\n";
  for (const auto& f : failures) {
    out += "  " + f.host + std::string(width - f.host.size() + 2, ' ') + f.why +
           "\n";
  }
  return out;
}

// The last non-empty line of `text`.
std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last;
}

// The hosts of `run`'s commands that started and have not ended.
std::string hosts_still_running(const CommandRunner& run) {
  std::string left;
  std::vector<CommandResult> rs = run.results();
  for (size_t i = 0; i < rs.size(); ++i) {
    if (rs[i].exited || !rs[i].started) continue;
    for (const std::string& h : run.commands()[i].hosts) {
      left += (left.empty() ? "" : ", ") + h;
    }
  }
  return left;
}

// Stops the job on every host (the backend's stop commands), bounded by
// the connection timeout and 15 s, and says which hosts did not answer.
void stop_hosts(const AgentLauncher& backend, const LaunchPlan& plan) {
  const std::string late = run_stop(
      backend.stop_commands(plan),
      plan.options.connect_timeout + std::chrono::seconds(15), plan.job_tag);
  if (!late.empty()) write_stderr(late + "\n");
}

// The failures that `hosts`' agents told the head's store under `key`
// (error_file.h), by host; none when the store cannot be read.
std::map<std::string, HostFailure> host_failures(
    uint16_t port, const std::string& token, const std::string& key,
    const std::vector<Host>& hosts) {
  std::map<std::string, HostFailure> out;
  try {
    auto s = own_store(port, token);
    for (const Host& h : hosts) {
      const std::string k = key + "/" + h.name;
      if (s->check({k})) out[h.name] = decode_host_failure(s->get(k));
    }
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: warning: cannot read what ended the "
                             "hosts' agents: ") +
                 e.what() + "\n");
  }
  return out;
}

// Whether `a` and `b` name one folder (device and inode).
bool same_folder(const fs::path& a, const fs::path& b) {
  struct stat sa {
  }, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// This process's folder as its shell named it: $PWD when it names the
// current folder (links kept, as the hosts may know only that path: NFS
// or autofs homes), else the resolved path (OpenMPI's getcwd does so).
fs::path head_folder(std::error_code& ec) {
  const fs::path resolved = fs::current_path(ec);
  if (const char* pwd = std::getenv("PWD");
      pwd != nullptr && fs::path(pwd).is_absolute() && same_folder(pwd, ".")) {
    ec.clear();
    return pwd;
  }
  return resolved;
}

// The line of an elastic job that finished without the `lost` hosts.
std::string finished_without(
    const std::vector<std::pair<std::string, int>>& lost, int min_nodes,
    int max_nodes) {
  std::string who;
  for (size_t i = 0; i < lost.size(); ++i) {
    who += (i == 0                 ? ""
            : i + 1 == lost.size() ? " and "
                                   : ", ") +
           lost[i].first + " (exit " + std::to_string(lost[i].second) + ")";
  }
  return "dlaunch: the job finished without " + who + ", whose agent" +
         (lost.size() == 1 ? " ended (its lines above say why)"
                           : "s ended (their lines above say why)") +
         ": an elastic job (--nnodes " + std::to_string(min_nodes) + ":" +
         std::to_string(max_nodes) + ") goes on while at least " +
         std::to_string(min_nodes) + " hosts are left\n";
}

// Runs the backend's pre-flight and says what failed on which host.
std::vector<PreflightFailure> preflight(const AgentLauncher& backend,
                                        const LaunchPlan& plan) {
  std::vector<PreflightFailure> failures;
  std::vector<AgentCommand> cmds = backend.check_commands(plan);
  CommandRunner run(cmds, CommandOutput::kCapture);
  const milliseconds bound =
      plan.options.connect_timeout + std::chrono::seconds(20);
  bool all = run.wait(bound);
  std::vector<CommandResult> results = run.results();
  std::map<std::string, std::string> answer;  // host -> its check line
  for (size_t i = 0; i < cmds.size(); ++i) {
    const AgentCommand& c = cmds[i];
    const CommandResult& r = results[i];
    // Lines "dlaunch-check ..." (pdsh: "HOST: dlaunch-check ...").
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      size_t at = line.find("dlaunch-check ");
      if (at == std::string::npos) continue;
      std::string host = c.hosts.empty() ? "" : c.hosts[0];
      if (c.host_prefixed_lines && pdsh_host_prefix(c.hosts, line, host) == 0 &&
          at >= 2) {
        host = line.substr(0, at - 2);
      }
      if (c.task_labelled_lines) {
        int task = -1;
        task_label(line, task);
        if (task >= 0 && static_cast<size_t>(task) < c.hosts.size()) {
          host = c.hosts[static_cast<size_t>(task)];
        }
      }
      if (!c.host_prefixed_lines && !c.task_labelled_lines &&
          c.hosts.size() > 1) {
        for (const std::string& h : c.hosts) answer[h] = line.substr(at);
      } else {
        answer[host] = line.substr(at);
      }
    }
    if (c.argv[0] == "pdcp" && r.exited && r.exit_code != 0) {
      for (const std::string& h : c.hosts) {
        failures.push_back(
            {h, "cannot place the job file with pdcp: " + last_line(r.err)});
      }
      return failures;
    }
    if (c.argv[0] == "pdcp") continue;  // places files, answers nothing
    for (const std::string& h : c.hosts) {
      if (answer.contains(h)) continue;
      std::string why;
      // The shell's "not found" (127) and "cannot execute" (126).
      bool unusable = r.exited && (r.exit_code == 127 || r.exit_code == 126);
      if (!r.started) {
        why = r.out;
        unusable = c.argv[0] == dlaunch_argv(plan, h)[0];
      } else if (!r.exited) {
        why = "no answer within " +
              std::to_string(
                  std::chrono::duration_cast<std::chrono::seconds>(bound)
                      .count()) +
              " s";
      } else {
        std::string err = last_line(r.err);
        if (c.host_prefixed_lines) {
          // pdsh: "pdsh@head: HOST: ssh exited with exit code 255"; its
          // exec module: "HOST: pdsh@head: execvp PATH failed: ...".
          // HOST as given, or as pdsh_short_name() writes it.
          const std::string shown = pdsh_short_name(h);
          std::istringstream el(r.err);
          for (std::string line; std::getline(el, line);) {
            auto names = [&](const std::string& n) {
              return line.starts_with(n + ": ") ||
                     line.find(": " + n + ": ") != std::string::npos;
            };
            if (!names(h) && !names(shown)) continue;
            if (line.find(": execvp ") != std::string::npos) {
              unusable = true;
            } else {
              err = line;
            }
          }
        }
        why = "cannot run " + dlaunch_on(plan, h) + " (exit " +
              std::to_string(r.exit_code) + ")" +
              (err.empty() ? "" : ": " + err);
      }
      answer[h] = "";
      failures.push_back({h, why, unusable});
    }
  }
  (void)all;
  const std::string mine = "dlaunch-check " DLAUNCH_VERSION;
  for (const RemoteJob& j : plan.jobs) {
    auto it = answer.find(j.host);
    if (it == answer.end() || it->second.empty()) continue;
    const std::string& a = it->second;
    if (!a.starts_with(mine + " ")) {
      failures.push_back({j.host,
                          "has another dlaunch (" + a.substr(14) +
                              "; this is " DLAUNCH_VERSION
                              "): install the same version at " +
                              dlaunch_on(plan, j.host),
                          true});
    } else if (a != mine + " ok") {
      // A damaged copy in the cache: shipping replaces it.
      failures.push_back({j.host, a.substr(mine.size() + 1),
                          a.starts_with(mine + " damaged: ")});
    }
  }
  return failures;
}

// --chdir's error on `host` ("": this machine).
std::string cannot_enter(const std::string& dir, int error,
                         const std::string& host = "") {
  return "--chdir: cannot enter " + dir + " on " +
         (host.empty() ? "this machine (" + agent::host_name() + ")" : host) +
         ": " + std::strerror(error) +
         "; give a folder that exists on every host";
}

}  // namespace

HostPlan plan_hosts(const LaunchOptions& o,
                    const std::function<bool(const std::string&)>& is_here) {
  HostPlan plan;
  if (o.hosts.empty()) return plan;
  std::unique_ptr<AgentLauncher> backend =
      make_agent_launcher(o.remote.launcher);
  if (backend && backend->head_agent_in_process()) {
    for (size_t i = 0; i < o.hosts.size(); ++i) {
      const std::string& name = o.hosts[i].name;
      if (is_here ? is_here(name)
                  : names_this_machine(name, o.rdzv.local_addr,
                                       Loopback::kDefaultOnly,
                                       o.remote.connect_timeout)) {
        plan.in_process = i;
        break;
      }
    }
  }
  plan.needs_head = o.hosts.size() > 1 || plan.in_process != size_t{0};
  return plan;
}

std::string workers_on(const LaunchOptions& o, const Host& h) {
  if (!h.gpus.empty()) return std::to_string(h.gpus.size());
  if (h.slots > 0 && !o.nproc_per_node_given) return std::to_string(h.slots);
  if (!o.nproc_per_node_spec.empty()) return o.nproc_per_node_spec;
  return std::to_string(o.agent.nproc_per_node);
}

std::map<std::string, std::string> remote_environment(
    const LaunchOptions& o, const agent::EnvMap& head_env) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : head_env) {
    if (forwarded_by_default(k)) env[k] = v;
  }
  for (auto& [k, v] : asked_environment(o, head_env)) env[k] = std::move(v);
  // -x DLAUNCH_FAULTS: the head's own faults already travel as --fault.
  auto faults = env.find("DLAUNCH_FAULTS");
  auto mine = head_env.find("DLAUNCH_FAULTS");
  if (faults != env.end() && mine != head_env.end() &&
      faults->second == mine->second) {
    env.erase(faults);
  }
  return env;
}

std::map<std::string, std::string> asked_environment(
    const LaunchOptions& o, const agent::EnvMap& head_env) {
  // A job file's env map, then --env-file, then -x: the flags win over the
  // file (-x X=1 once lost to the file's env: {X: 2}).
  std::map<std::string, std::string> env(o.env.begin(), o.env.end());
  if (!o.remote.env_file.empty()) {
    std::istringstream in(read_text<std::runtime_error>(
        o.remote.env_file, "--env-file",
        "give a readable file of NAME=VALUE lines"));
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t start = line.find_first_not_of(" \t");
      if (start == std::string::npos || line[start] == '#') continue;
      size_t eq = line.find('=');
      std::string name =
          eq == std::string::npos ? "" : line.substr(start, eq - start);
      if (name.starts_with("export ")) name = name.substr(7);
      if (!is_variable_name(name)) {
        throw std::runtime_error(
            "--env-file " + o.remote.env_file + ":" + std::to_string(n) +
            ": '" + line +
            "' is not NAME=VALUE; write one NAME=VALUE per "
            "line ('#' comments)");
      }
      env[name] = line.substr(eq + 1);
    }
  }
  for (const std::string& item : o.remote.exports) {
    size_t eq = item.find('=');
    if (eq != std::string::npos) {
      env[item.substr(0, eq)] = item.substr(eq + 1);
    } else if (auto it = head_env.find(item); it != head_env.end()) {
      env[item] = it->second;
    }
  }
  return env;
}

std::string settle_host(const std::map<std::string, std::string>& env,
                        const std::string& chdir, const std::string& host) {
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  if (chdir.empty()) return "";
  // Resolved before entering it: from inside, a relative name means
  // another folder.
  std::error_code ec;
  const std::filesystem::path where = std::filesystem::absolute(chdir, ec);
  if (ec) throw std::runtime_error(cannot_enter(chdir, ec.value(), host));
  if (::chdir(where.c_str()) != 0) {
    throw std::runtime_error(cannot_enter(chdir, errno, host));
  }
  // The folder entered, as the kernel resolved it (link/.. is the link
  // target's parent, not where a lexical reading puts it); PWD names it, as
  // after a shell's cd (workers read it: sh's pwd, os.environ).
  const std::filesystem::path entered = std::filesystem::current_path(ec);
  const std::string folder = (ec ? where : entered).string();
  // PWD as a shell's cd leaves it: the path given (links kept) when it
  // names the folder entered, else the resolved one.
  const std::string pwd = same_folder(where.lexically_normal(), ".")
                              ? where.lexically_normal().string()
                              : folder;
  ::setenv("PWD", pwd.c_str(), 1);
  return folder;
}

std::vector<std::string> agent_args(const LaunchOptions& o, const Host& h,
                                    const std::string& endpoint,
                                    const std::string& run_id) {
  std::vector<std::string> args;
  for (const FlagSpec& f : flags()) {
    if (f.action || f.section == "HOSTS" || head_decides(f.name)) continue;
    std::optional<std::string> text = f.print(o);
    if (!text) continue;
    const std::string flag = "--" + std::string(f.name);
    if (f.type == ValueType::kSwitch) {
      if (*text == "true") args.push_back(flag);
    } else if (f.type == ValueType::kRepeated) {
      std::istringstream items(*text);
      for (std::string item; std::getline(items, item);) {
        args.push_back(flag + "=" + item);
      }
    } else {
      args.push_back(flag + "=" + *text);
    }
  }
  const auto& r = o.rdzv;
  const int n = static_cast<int>(o.hosts.size());
  const bool elastic = r.min_nodes != r.max_nodes;
  args.push_back("--nnodes=" + (elastic ? std::to_string(r.min_nodes) + ":" +
                                              std::to_string(r.max_nodes)
                                        : std::to_string(n)));
  args.push_back("--rdzv-backend=c10d");
  args.push_back("--rdzv-endpoint=" + endpoint);
  args.push_back("--rdzv-id=" + run_id);
  std::string conf;
  for (const auto& [k, v] : o.rdzv_conf) {
    if (k != "is_host") conf += k + "=" + v + ",";
  }
  args.push_back("--rdzv-conf=" + conf + "is_host=false");
  args.push_back("--local-addr=" + h.name);
  args.push_back("--nproc-per-node=" + workers_on(o, h));
  args.push_back("--");
  args.push_back(o.program);
  args.insert(args.end(), o.program_args.begin(), o.program_args.end());
  return args;
}

std::string run_stop(const std::vector<AgentCommand>& stop,
                     std::chrono::milliseconds bound, const std::string& tag) {
  CommandRunner run(stop, CommandOutput::kCapture);
  if (run.wait(bound)) return "";
  return "dlaunch: the stop of this job on " + hosts_still_running(run) +
         " did not end within " + comm::store::format_duration(bound) +
         "; its processes there may remain: run 'dlaunch --remote-stop " + tag +
         "' on those hosts";
}

int launch_hosts(const LaunchOptions& job, const HostPlan& hosts) {
  LaunchOptions o = job;
  const agent::EnvMap head_env = agent::current_environment();
  std::unique_ptr<AgentLauncher> backend =
      make_agent_launcher(o.remote.launcher);
  if (!backend) {
    write_stderr("dlaunch: --launcher " + o.remote.launcher +
                 " is not available\n");
    return 2;
  }
  if (o.rdzv.max_nodes > static_cast<int>(o.hosts.size()) &&
      o.rdzv.max_nodes > 1) {
    write_stderr("dlaunch: --nnodes " + std::to_string(o.rdzv.max_nodes) +
                 " is more than the " + std::to_string(o.hosts.size()) +
                 " host(s) given; give as many hosts or fewer nodes\n");
    return 2;
  }
  const std::string run_id =
      o.agent.run_id.empty() ? agent::random_run_id() : o.agent.run_id;
  o.agent.run_id = run_id;
  const std::string token = random_hex(32);
  const std::string tag = "dlaunch-job-" + random_hex(8);

  // The agents' store, hosted here for the whole job.
  const std::string advertised =
      !o.rdzv.local_addr.empty()
          ? o.rdzv.local_addr
          : (o.rdzv.endpoint_host.empty() ? agent::host_name()
                                          : o.rdzv.endpoint_host);
  std::unique_ptr<comm::store::StoreServer> store;
  store_logs_to_stderr();
  try {
    store = comm::store::StoreServer::start(
        {.host = "0.0.0.0",
         .port = static_cast<uint16_t>(
             o.rdzv.endpoint_host.empty() ? 0 : o.rdzv.endpoint_port),
         .token = token});
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: cannot host the agents' store: ") +
                 e.what() + "\n");
    return 1;
  }
  const std::string endpoint =
      (advertised.find(':') != std::string::npos ? "[" + advertised + "]"
                                                 : advertised) +
      ":" + std::to_string(store->port());

  std::map<std::string, std::string> env;
  try {
    env = remote_environment(o, head_env);
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 2;
  }
  env["DLAUNCH_RDZV_TOKEN"] = token;
  env["DLAUNCH_JOB_TAG"] = tag;
  const bool drill = o.mode == LaunchOptions::Mode::kDrill;
  const std::string drill_key = "dlaunch/drill/" + run_id;
  if (drill) env[kDrillKeyEnv] = drill_key;
  // Failed agents say what ended them (error_file.h).
  const std::string error_key = "dlaunch/error/" + run_id;
  env[kErrorKeyEnv] = error_key;
  const auto error_file_env = head_env.find("TORCHELASTIC_ERROR_FILE");
  const bool error_file =
      error_file_env != head_env.end() && !error_file_env->second.empty();

  std::error_code ec;
  const fs::path cwd = head_folder(ec);
  if (ec && !fs::path(o.remote.chdir).is_absolute()) {
    write_stderr("dlaunch: cannot read the current folder (" + ec.message() +
                 "), where the hosts would run" +
                 (o.remote.chdir.empty()
                      ? ""
                      : " (--chdir " + o.remote.chdir + " is relative to it)") +
                 "; give an absolute --chdir\n");
    return 2;
  }
  // A relative --chdir is the head's folder's on every host, as mpirun's
  // -wdir (a remote shell starts elsewhere: ssh in the user's home).
  const std::string chdir =
      o.remote.chdir.empty() ? cwd.string() : (cwd / o.remote.chdir).string();
  LaunchPlan plan;
  plan.options = o.remote;
  plan.job_tag = tag;
  plan.program = o.agent.entrypoint.empty() ? o.program : o.program;
  plan.head_env = head_env;
  plan.remote_dlaunch = o.remote.remote_dlaunch;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (plan.remote_dlaunch.empty()) plan.remote_dlaunch = self.string();
  // Every host's job.yaml: the job as given, rerunnable from any host.
  const std::string whole_job = job_yaml(o, /*with_run_id=*/false);
  std::optional<Host> head_host;
  for (size_t i = 0; i < o.hosts.size(); ++i) {
    const Host& h = o.hosts[i];
    if (hosts.in_process == i) {
      head_host = h;
      continue;
    }
    RemoteJob j;
    j.args = agent_args(o, h, endpoint, run_id);
    j.env = env;
    if (!h.gpus.empty()) j.env["CUDA_VISIBLE_DEVICES"] = gpu_list(h.gpus);
    j.chdir = chdir;
    j.host = h.name;
    j.job_tag = tag;
    j.whole_job = whole_job;
    plan.jobs.push_back(std::move(j));
  }
  // This machine enters --chdir only when its agent starts, after the
  // others: check it now.
  if (head_host && !o.remote.chdir.empty()) {
    const int fd = ::open(o.remote.chdir.c_str(), O_PATH | O_DIRECTORY);
    if (fd < 0) {
      write_stderr("dlaunch: " + cannot_enter(o.remote.chdir, errno) + "\n");
      return 2;
    }
    ::close(fd);
  }
  if (head_host && head_host->gpus.empty() &&
      !o.nproc_per_node_unresolved.empty()) {
    write_stderr("dlaunch: --nproc-per-node " + o.nproc_per_node_spec + " on " +
                 head_host->name + " (this machine, the head): " +
                 o.nproc_per_node_unresolved + "\n");
    return 2;
  }
  // A 0700 folder for what a backend places on its hosts (staging.h).
  const StagingDir staging(fs::temp_directory_path(ec), tag);
  plan.staging_dir = staging.path();

  if (!plan.jobs.empty()) {
    // The backend's own tool (ssh, pdsh, srun) first: without it every
    // host would fail the same way.
    for (const AgentCommand& c : backend->check_commands(plan)) {
      // (--launcher local runs dlaunch itself: the pre-flight checks it.)
      if (c.argv[0] != plan.remote_dlaunch && !in_path(c.argv[0], head_env)) {
        write_stderr("dlaunch: --launcher " + o.remote.launcher + " runs " +
                     c.argv[0] +
                     ", which is not in PATH; install it (scripts/setup "
                     "installs openssh-client, pdsh and slurm-client) or add "
                     "its folder to PATH\n");
        return 1;
      }
    }
    std::vector<PreflightFailure> failures = preflight(*backend, plan);
    // dlaunch ships itself to the hosts that lack it.
    failures = ship_where_missing(
        *backend, plan, std::move(failures), self,
        [&](const LaunchPlan& p) { return preflight(*backend, p); },
        // (Progress, not errors: not noted for the error file.)
        [](const std::string& line) {
          agent::write_all(STDERR_FILENO, line + "\n");
        });
    if (!failures.empty()) {
      write_stderr(preflight_table(failures, plan.jobs.size()));
      // The pdsh job file may be in place on the hosts that passed.
      stop_hosts(*backend, plan);
      return 1;
    }
  }

  // From here the head's signals stop the whole job: the remote agents
  // first hear of it from their stdin or by tag.
  std::unique_ptr<CommandRunner> remote;
  std::vector<AgentCommand> starts;  // remote's commands, by index
  if (!plan.jobs.empty()) {
    starts = backend->start_commands(plan);
    remote = std::make_unique<CommandRunner>(starts, CommandOutput::kShow);
  }
  std::atomic<int> stop_signal{0};
  boost::asio::io_context sig_io;
  boost::asio::signal_set sigs(sig_io);
  std::jthread sig_thread;
  // This machine's agent handles the signals while it runs; the head does
  // when it runs none, or when the others go on without it.
  auto handle_signals = [&] {
    for (int s : o.agent.signals_to_handle) sigs.add(s);
    sigs.async_wait([&](const boost::system::error_code& e, int sig) {
      if (e) return;
      stop_signal = sig;
      remote->interrupt();
    });
    sig_thread = std::jthread([&] { sig_io.run(); });
  };
  if (!head_host && remote) handle_signals();

  // An elastic job goes on while at least its minimum of hosts is left;
  // the agents' rendezvous hears of every host lost.
  const bool elastic = o.rdzv.min_nodes != o.rdzv.max_nodes;
  const int min_nodes =
      elastic ? o.rdzv.min_nodes : static_cast<int>(o.hosts.size());
  // (A head that is no host of a fixed-size job stops every host at the
  // first failure itself.)
  std::unique_ptr<HostLosses> losses;
  if (remote && (head_host || elastic)) {
    losses = std::make_unique<HostLosses>(
        *remote, o.hosts.size(), min_nodes,
        [&](const std::string& key, const std::string& value) {
          try {
            own_store(store->port(), token)
                ->set("dlaunch/rdzv/" + run_id + "/" + key, value);
            return true;
          } catch (const std::exception& e) {
            if (key == "aborted") {
              write_stderr("dlaunch: cannot tell the agents that " + value +
                           ": " + e.what() + "\n");
            }
            return false;
          }
        });
  }

  int head_code = 0;
  bool head_failed = false;
  bool head_lost = false;  // elastic: the job went on without this agent
  int head_signal = 0;     // the stop signal this machine's agent had
  std::string root_host;   // another host whose failure is the job's status
  std::string root_error;  // its error file's text, if it told one
  // This machine's agent's failure, weighed with the hosts' (it wrote its
  // own error file).
  std::optional<HostFailure> head_failure;
  if (head_host) {
    // This machine's agent, in-process, meeting the others in the store.
    LaunchOptions mine = o;
    mine.rdzv.backend = "c10d";
    mine.rdzv.endpoint_host = advertised;
    mine.rdzv.endpoint_port = store->port();
    mine.rdzv.is_host = false;
    mine.rdzv.local_addr = head_host->name;
    if (mine.rdzv.min_nodes == mine.rdzv.max_nodes) {
      mine.rdzv.min_nodes = mine.rdzv.max_nodes =
          static_cast<int>(o.hosts.size());
    }
    mine.standalone = false;
    // cpu, gpu and auto were resolved for this machine by the parser.
    mine.agent.nproc_per_node =
        head_host->gpus.empty() && !o.nproc_per_node_spec.empty()
            ? o.agent.nproc_per_node
            : std::stoi(workers_on(o, *head_host));
    mine.agent.hostname = head_host->name;
    // Its lines carry its name like the other hosts' ("node01 [default0]:").
    std::string tmpl = o.agent.log_line_prefix_template;
    if (auto it = head_env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
        tmpl.empty() && it != head_env.end()) {
      tmpl = it->second;
    }
    if (tmpl.find("${hostname}") == std::string::npos) {
      mine.agent.log_line_prefix_template =
          "${hostname} " +
          (tmpl.empty() ? "[${role_name}${local_rank}]:" : tmpl);
    }
    mine.hosts.clear();
    mine.whole_job = whole_job;
    bool settled = false;
    try {
      mine.remote.chdir = settle_host(env, o.remote.chdir);
      settled = true;
    } catch (const std::exception& e) {
      write_stderr(std::string("dlaunch: ") + e.what() + "\n");
      head_code = 2;
    }
    if (settled) {
      if (!head_host->gpus.empty()) {
        ::setenv("CUDA_VISIBLE_DEVICES", gpu_list(head_host->gpus).c_str(), 1);
      }
      agent::RunResult mine_result;
      try {
        head_code = launch(mine, &mine_result);
      } catch (const std::exception& e) {
        write_stderr(std::string("dlaunch: ") + e.what() + "\n");
        head_code = 1;
      }
      head_signal = mine_result.stop_signal;
      if (head_code != 0 && head_signal == 0) {
        head_failure = failure_of(mine_result, "");
      }
      // The failed host's status is the job's, as when the head is no host,
      // when the abort is what ended this machine's agent (not a signal or
      // a failure of its own that the host's failure followed).
      if (const auto a = losses ? losses->abort() : std::nullopt;
          a && mine_result.error.find(a->text) != std::string::npos) {
        head_code = a->code;
        root_host = losses->lost().front().first;
      }
    }
    // An elastic job loses this machine's agent as it would another's.
    if (head_code != 0 && elastic && losses && head_signal == 0 &&
        !losses->aborted()) {
      losses->lose(head_host->name, head_code);
      const size_t left = o.hosts.size() - losses->lost().size();
      head_lost = static_cast<int>(left) >= min_nodes;
      if (head_lost && !remote->wait(milliseconds(0))) {
        agent::write_all(
            STDERR_FILENO,
            "dlaunch: this machine's agent ended with exit " +
                std::to_string(head_code) +
                "; waiting for the other hosts' agents (an elastic "
                "job, --nnodes " +
                std::to_string(o.rdzv.min_nodes) + ":" +
                std::to_string(o.rdzv.max_nodes) + ", goes on while at least " +
                std::to_string(o.rdzv.min_nodes) + " hosts are left)\n");
      }
    }
    head_failed = head_code != 0;
    // Once the job ended here, later losses are no one's to hear.
    if (losses && !head_lost) losses->stop();
  }
  // Whether the job's rendezvous says every member of a round succeeded
  // (c10d's `finished`); false while the store cannot be read. One
  // connection, kept open.
  std::unique_ptr<comm::store::TcpStore> watch;
  auto finished = [&] {
    try {
      if (!watch) watch = own_store(store->port(), token);
      return watch->check({"dlaunch/rdzv/" + run_id + "/finished"});
    } catch (const std::exception&) {
      watch.reset();
      return false;
    }
  };
  if (remote && (!head_host || head_lost)) {
    if (elastic) {
      // Every host's end, too few hosts left, or a signal.
      // Once the job finished, the hosts still running get the bounded
      // wait below (a frozen host's ssh would hold the head).
      if (head_lost) handle_signals();
      for (int i = 1; !remote->wait(milliseconds(200)) && stop_signal == 0 &&
                      !losses->aborted() && !(i % 5 == 0 && finished());
           ++i) {
      }
    } else {
      // The end, a failed host, or a signal (interrupt()).
      remote->wait_failure_or_end(std::chrono::hours(24 * 365));
    }
  }
  int code = head_code;
  if (remote) {
    // A failure here or there, or a signal: every host stops now; a
    // success: the others are finishing (the exit barrier), let them. An
    // elastic job stops on a signal or once too few hosts are left.
    bool all_done = remote->wait(milliseconds(0));
    int failed = remote->wait_failure_or_end(milliseconds(0));
    // After a success the others may still be in the exit barrier.
    milliseconds bound = o.agent.exit_barrier_timeout + o.agent.term_timeout +
                         std::chrono::seconds(30);
    const bool stop_now =
        stop_signal != 0 ||
        (elastic ? (head_failed && !head_lost) || losses->aborted()
                 : head_failed || failed >= 0);
    if (!all_done && stop_now) {
      remote->close_stdins();
      stop_hosts(*backend, plan);
      bound = o.agent.term_timeout + std::chrono::seconds(15);
    }
    if (!remote->wait(bound)) {
      const std::string left = hosts_still_running(*remote);
      write_stderr("dlaunch: the agents of " + left + " did not end within " +
                   comm::store::format_duration(bound) +
                   "; ending their connections\n");
      remote->close_stdins();
      remote->signal_all(SIGTERM);
      if (!remote->wait(std::chrono::seconds(10))) remote->signal_all(SIGKILL);
    }
    std::vector<CommandResult> results = remote->results();
    // pdsh over a network leaves one job file per host unless every agent
    // succeeded (each removes it then): remove them. (Shipped copies of
    // dlaunch stay in the hosts' caches.)
    auto rcmd = head_env.find("PDSH_RCMD_TYPE");
    bool every_agent_succeeded =
        std::ranges::all_of(results, [](const CommandResult& r) {
          return r.started && r.exited && r.exit_code == 0;
        });
    if (o.remote.launcher == "pdsh" && !every_agent_succeeded &&
        (rcmd == head_env.end() || rcmd->second != "exec")) {
      stop_hosts(*backend, plan);
    }
    // The first host that failed gives the job its status: the others may
    // have ended only because the teardown stopped them (a signal's code).
    // (pdsh: the first host it reported failed; its own status can be 0
    // for a host killed by a signal.)
    if (code == 0 && failed >= 0) {
      const auto lost = lost_hosts(starts[failed], results[failed]);
      if (!lost.empty()) {
        code = lost.front().second;
        root_host = lost.front().first;
      }
    }
    int largest = 0;
    std::string largest_host;
    for (size_t i = 0; i < results.size(); ++i) {
      const CommandResult& r = results[i];
      const std::string first =
          starts[i].hosts.empty() ? "" : starts[i].hosts[0];
      if (r.exited && r.exit_code > largest) {
        largest = r.exit_code;
        largest_host = first;
      }
      if (!r.started && largest < 1) {
        largest = 1;
        largest_host = first;
      }
      for (const auto& [h, c] : r.failed_hosts) {
        if (c > largest) {
          largest = c;
          largest_host = h;
        }
      }
    }
    if (code == 0) {
      code = largest;
      root_host = largest_host;
    }
    // The host whose own worker failed first gives the job its status and
    // error file: the others' agents failed because it did (they tell
    // what ended them through the store, error_file.h).
    // (Not over a signal this machine's agent took; and a first lost host
    // that told nothing, killed, may be the root itself.)
    if (code != 0 && stop_signal == 0 && head_signal == 0 && !drill) {
      std::map<std::string, HostFailure> told =
          host_failures(store->port(), token, error_key, o.hosts);
      // (Its worker may have failed first: a host's later failure, before
      // it heard, is not the root cause.)
      if (head_failure) told.emplace(head_host->name, *head_failure);
      if (root_host.empty() || told.contains(root_host)) {
        if (std::string root = root_cause_host(told); !root.empty()) {
          root_host = root;
          code = told.at(root).code;
        }
      }
      if (auto f = told.find(root_host); f != told.end()) {
        root_error = f->second.error_text;
      }
    }
    if (losses) losses->stop();
    // An elastic job whose last round trained to the end (every member's
    // workers succeeded: the rendezvous's `finished`) succeeded: the hosts
    // lost on the way are named.
    if (elastic && code != 0 && stop_signal == 0 && head_signal == 0 &&
        !losses->aborted() && finished()) {
      size_t succeeded = head_host && !head_failed ? 1 : 0;
      std::vector<std::pair<std::string, int>> lost;
      if (head_host && head_failed)
        lost.emplace_back(head_host->name, head_code);
      for (size_t i = 0; i < results.size(); ++i) {
        const auto l = lost_hosts(starts[i], results[i]);
        lost.insert(lost.end(), l.begin(), l.end());
        if (results[i].exited && l.size() < starts[i].hosts.size()) {
          succeeded += starts[i].hosts.size() - l.size();
        }
      }
      if (succeeded > 0 && !lost.empty()) {
        code = 0;
        write_stderr(
            finished_without(lost, o.rdzv.min_nodes, o.rdzv.max_nodes));
      }
    }
  }
  sig_io.stop();
  if (stop_signal != 0) {
    code = 128 + stop_signal;
    note_error("dlaunch: stopped by " + agent::signal_name(stop_signal),
               /*replace=*/true);
  } else if (code != 0 && !root_host.empty() && error_file &&
             !(head_host && root_host == head_host->name)) {
    // (This machine's agent wrote its own.)
    write_error_file(!root_error.empty()
                         ? root_error
                         : agent::launcher_error_json(
                               {}, "dlaunch: the agent on " + root_host +
                                       " ended with exit " +
                                       std::to_string(code) +
                                       " (its lines above say why)"));
  }
  if (drill) {
    // Every host's agent left its faults in this store as it ended.
    agent::RunResult merged;
    merged.exit_code = code;
    merged.run_id = run_id;
    try {
      auto s = own_store(store->port(), token);
      for (const Host& h : o.hosts) {
        const std::string key = drill_key + "/" + h.name;
        if (s->check({key})) merge_drill_part(s->get(key), merged);
      }
    } catch (const std::exception& e) {
      write_stderr(std::string("dlaunch: cannot collect the hosts' faults "
                               "for the drill's verdict: ") +
                   e.what() + "\n");
    }
    std::vector<std::string> specs;
    for (const agent::Fault& f : o.agent.faults) specs.push_back(f.spec);
    bool passed = false;
    agent::write_all(STDOUT_FILENO, drill_verdict(merged, specs, passed));
    return passed ? 0 : 1;
  }
  return code;
}

}  // namespace dlaunch::launcher
