#include "launcher/cli.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include "agent/fault.h"
#include "agent/posix_env.h"
#include "comm/fault_spec.h"
#include "comm/store/token.h"
#include "launcher/flags.h"
#include "launcher/hostfile.h"
#include "launcher/job_file.h"
#include "launcher/multi_host.h"
#include "launcher/slurm.h"

namespace dlaunch::launcher {
namespace {

// A program dlaunch runs under the interpreter: NAME.py.
bool python_script(const std::string& program) {
  return program.size() > 3 && program.ends_with(".py");
}

// Boost.Process initializer: the child dies with dlaunch (a driver wedged
// in cuInit must not keep the GPU-count helper alive after a killed launch).
struct DieWithParent {
  pid_t parent = ::getpid();
  template <typename Launcher, typename Path>
  boost::system::error_code on_exec_setup(Launcher&, const Path&,
                                          const char* const*) {
    agent::die_with_parent(parent);
    return {};
  }
};

// "--term-timeout: '0' is not valid; ..." (or "--nproc-per-node gpu: ...").
std::string bad_value_text(const std::string& where, const BadValue& b) {
  return where + (b.about.empty() ? "" : " " + b.about) + ": " + b.message;
}

// The flags before the program: each flag's values in the order given
// (a switch's count is its number of values), and the rest: unknown
// options as given, then the program (or "--") and everything after it.
struct ScannedArgs {
  std::vector<std::vector<std::string>> values;  // indexed like flags()
  std::vector<std::string> rest;
};

// Every spelling of every flag ("--nproc-per-node", "--nproc_per_node",
// "-m"), sorted, with its index in flags(); built once.
const std::vector<std::pair<std::string, size_t>>& spelling_index() {
  static const auto kIndex = [] {
    std::vector<std::pair<std::string, size_t>> index;
    for (size_t i = 0; i < flags().size(); ++i) {
      for (std::string& s : spellings(flags()[i])) {
        index.emplace_back(std::move(s), i);
      }
    }
    std::sort(index.begin(), index.end());
    return index;
  }();
  return kIndex;
}

std::optional<size_t> flag_index(std::string_view spelling) {
  const auto& index = spelling_index();
  auto it = std::lower_bound(
      index.begin(), index.end(), spelling,
      [](const auto& entry, std::string_view s) { return entry.first < s; });
  if (it == index.end() || it->first != spelling) return std::nullopt;
  return it->second;
}

// A character that may start an option's name after its dashes.
bool starts_name(char c) {
  return c != '-' && c != '!' && c != ' ' && c != '\n';
}

// Splits off the flags before the program, with the rules dlaunch has always
// had (those of CLI11, which it used before; kept so that command lines keep
// their meaning): --NAME VALUE, --NAME=VALUE, -X VALUE, -XVALUE, -XY for
// switches X and Y; a value is the next argument whatever it looks like.
// --NAME= is an empty value, as torchrun's argparse reads it (CLI11 took the
// next argument: `--rdzv_id=$UNSET --dry-run prog` ran the job, named
// "--dry-run"); flags that need a value refuse it. Unknown options are set
// aside and scanning goes on (so --help after one still answers); the first
// argument that is not an option (a bare "-", "-1", "") and everything after
// it, or
// "--" and everything after it, is the rest. A value flag without its
// value, or given twice (unless repeatable), throws UsageError.
ScannedArgs scan_flags(const std::vector<std::string>& args) {
  const std::vector<FlagSpec>& table = flags();
  ScannedArgs out;
  out.values.resize(table.size());
  std::optional<std::string> pushed;  // what -XY leaves after switch X: "-Y"
  size_t next = 0;
  while (pushed || next < args.size()) {
    std::string cur = pushed ? std::move(*pushed) : args[next++];
    pushed.reset();
    std::string spelling, value;
    bool is_short = false;
    bool given = false;  // --NAME=VALUE, VALUE maybe empty
    if (cur.size() > 2 && cur.starts_with("--") && starts_name(cur[2])) {
      size_t eq = cur.find('=');
      spelling = cur.substr(0, eq);
      if (eq != std::string::npos) {
        value = cur.substr(eq + 1);
        given = true;
      }
    } else if (cur.size() > 1 && cur[0] == '-' && starts_name(cur[1])) {
      is_short = true;
      spelling = cur.substr(0, 2);
      value = cur.substr(2);
    }
    std::optional<size_t> i;
    if (!spelling.empty()) i = flag_index(spelling);
    // "-1" is a program (or an argument) unless a flag is spelt so.
    const bool digit =
        is_short && std::isdigit(static_cast<unsigned char>(spelling[1])) != 0;
    if (spelling.empty() || (digit && !i)) {
      out.rest.push_back(std::move(cur));
      out.rest.insert(out.rest.end(), args.begin() + next, args.end());
      break;
    }
    if (!i) {
      out.rest.push_back(std::move(cur));
      continue;
    }
    const FlagSpec& f = table[*i];
    if (f.type == ValueType::kSwitch) {
      // `--standalone=false` reads as on otherwise (argparse refuses it).
      if (given) {
        throw UsageError{"dlaunch: " + spelling + "=" + value +
                         ": a switch takes no value; give " + spelling +
                         " alone to turn it on, or leave it out"};
      }
      out.values[*i].push_back("");
      if (is_short && !value.empty()) pushed = "-" + value;
      continue;
    }
    if (value.empty() && !given) {
      if (next == args.size()) {
        throw UsageError{"dlaunch: --" + std::string(f.name) +
                         ": the value is missing; give one after it (run "
                         "'dlaunch --help' for the valid forms)"};
      }
      value = args[next++];
      // `--rdzv-endpoint $EP --dry-run prog` with EP unset: the value would
      // be the next option, and the job would run.
      // Long options, and short switches as they are ("-m"): "-p 2222" or
      // "-x" are fine --ssh-args.
      const auto named =
          flag_index(std::string_view(value).substr(0, value.find('=')));
      if (named &&
          (value.starts_with("--") ||
           (value.size() == 2 && table[*named].type == ValueType::kSwitch))) {
        throw UsageError{"dlaunch: --" + std::string(f.name) + ": the value '" +
                         value +
                         "' is an option; give the value first (an unset "
                         "variable?), or write --" +
                         std::string(f.name) + "=" + value + " if it is one"};
      }
    }
    out.values[*i].push_back(std::move(value));
  }
  for (size_t i = 0; i < table.size(); ++i) {
    const size_t n = out.values[i].size();
    if (table[i].type != ValueType::kSwitch && !table[i].repeatable && n > 1) {
      // Which one would win is not obvious: none does.
      throw UsageError{"dlaunch: --" + std::string(table[i].name) +
                       " is given " + std::to_string(n) +
                       " times; give it once"};
    }
  }
  return out;
}

}  // namespace

int cuda_device_count(const agent::EnvMap& env) {
  namespace asio = boost::asio;
  namespace bp = boost::process::v2;
  std::filesystem::path helper;
  if (auto it = env.find("DLAUNCH_CUDA_DEVICES"); it != env.end()) {
    helper = it->second;
  } else {
    std::error_code ec;
    helper = std::filesystem::read_symlink("/proc/self/exe", ec)
                 .replace_filename("dlaunch-cuda-devices");
  }
  if (::access(helper.c_str(), X_OK) != 0) {
    throw std::runtime_error(
        "cannot count CUDA devices: " + helper.string() +
        " is missing (build or install it beside dlaunch)");
  }
  asio::io_context ctx;
  asio::readable_pipe out(ctx);
  std::string text;
  std::array<char, 64> buf;
  bp::process proc(ctx, helper, {}, bp::process_stdio{{}, out, {}},
                   DieWithParent{});
  std::function<void()> read = [&] {
    out.async_read_some(asio::buffer(buf),
                        [&](const boost::system::error_code& ec, size_t n) {
                          text.append(buf.data(), n);
                          if (!ec) read();
                        });
  };
  int code = -1;
  proc.async_wait([&](const boost::system::error_code& ec, int c) {
    if (!ec) code = c;
  });
  read();
  // A wedged driver must not hang the launch (cuInit takes seconds at
  // most): the output and the exit both arrive within the bound.
  constexpr std::chrono::seconds kTimeout(60);
  ctx.run_for(kTimeout);
  if (!ctx.stopped()) {
    boost::system::error_code ignored;
    proc.terminate(ignored);
    throw std::runtime_error("cannot count CUDA devices: " + helper.string() +
                             " did not finish within " +
                             std::to_string(kTimeout.count()) +
                             " s (is the NVIDIA driver hung?)");
  }
  int n = -1;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  // The helper's own account of a driver error.
  if (code == 1 && text.starts_with("error: ")) {
    throw std::runtime_error("cannot count CUDA devices: " + text.substr(7));
  }
  if (code != 0 || !parse_number(text, n) || n < 0) {
    throw std::runtime_error("cannot count CUDA devices: " + helper.string() +
                             " exited with " + std::to_string(code) +
                             " and printed '" + text + "'");
  }
  return n;
}

ParseResult parse_command_line(const std::vector<std::string>& args,
                               const agent::EnvMap& env, const NoteSink& note) {
  ScannedArgs scanned;
  try {
    scanned = scan_flags(args);
  } catch (const UsageError& e) {
    return e;
  }
  auto given = [&](const FlagSpec& f) -> const std::vector<std::string>& {
    return scanned.values[&f - flags().data()];
  };
  auto has = [&](std::string_view name) {
    return !given(*find_flag(name)).empty();
  };
  if (has("help")) return HelpRequested{};
  if (has("version")) return VersionRequested{};

  std::vector<std::string>& rest = scanned.rest;
  const bool separated = !rest.empty() && rest[0] == "--";
  if (separated) rest.erase(rest.begin());
  if (!separated && !rest.empty() && rest[0].size() > 1 && rest[0][0] == '-') {
    return UsageError{"dlaunch: unknown option '" + rest[0] +
                      "'; run 'dlaunch --help' for the valid options"};
  }
  std::optional<JobFile> file;
  // --drill FILE reads its job as --config FILE does.
  const char* config_flag = has("drill") ? "drill" : "config";
  if (has("drill") && has("config")) {
    return UsageError{
        "dlaunch: --drill FILE already names the job file; drop --config"};
  }
  if (has(config_flag)) {
    if (given(*find_flag(config_flag))[0].empty()) {
      return UsageError{"dlaunch: --" + std::string(config_flag) +
                        ": must not be empty; give a job file"};
    }
    try {
      file = load_job_file(given(*find_flag(config_flag))[0], env,
                           "--" + std::string(config_flag));
    } catch (const JobFileError& e) {
      return UsageError{"dlaunch: " + std::string(e.what())};
    }
  }

  LaunchOptions o;
  {
    std::error_code ec;
    o.launch_dir = std::filesystem::current_path(ec);
  }
  // A program on the command line replaces the file's program and args.
  if (!rest.empty()) {
    o.program = rest[0];
    o.program_args.assign(rest.begin() + 1, rest.end());
  } else if (file && file->program) {
    o.program = file->program->value;
    o.program_args = file->args.value_or(std::vector<std::string>{});
  } else if (file) {
    return UsageError{"dlaunch: " + file->top.text() +
                      ": no program; add 'program: PROG' (and 'args: "
                      "[...]') to the file or give PROG on the command line"};
  } else {
    return UsageError{
        "dlaunch: no program given; usage: dlaunch [options] "
        "PROG [ARGS...] (see 'dlaunch --help')"};
  }
  if (auto it = env.find("PYTHON"); it != env.end() && !it->second.empty()) {
    o.python = it->second;
  }
  const bool dry_run = has("dry-run") && !has("print-config");
  // Why --nproc-per-node gpu|auto cannot be resolved on this machine.
  std::string unresolved_nproc;
  // The flags given by any source (command line, PET_*, job file).
  std::set<std::string_view> set_flags;
  // --hosts or PET_HOSTS replace the file's hosts, whether it gives them as
  // `hosts:` or as `hostfile:` (below).
  const FlagSpec& hosts_flag = *find_flag("hosts");
  const bool hosts_outside_file =
      !given(hosts_flag).empty() || env.contains(pet_variable(hosts_flag));
  // Each job flag from the command line, else its PET_* variable, else the
  // job file, in the table's order.
  for (const FlagSpec& f : flags()) {
    if (f.action) continue;
    if (f.repeatable) {
      // Every source adds its items, in a fixed order.
      std::vector<std::pair<std::string, std::string>> sources;
      if (file) {
        if (auto it = file->settings.find(f.name); it != file->settings.end()) {
          sources.emplace_back(
              it->second.pos.text() + ": " + std::string(f.key),
              it->second.value);
        }
      }
      std::string upper = pet_variable(f).substr(4);
      for (std::string var : {"PET_" + upper, "DLAUNCH_" + upper}) {
        if (auto it = env.find(var); it != env.end()) {
          sources.emplace_back(var, it->second);
        }
      }
      for (const std::string& v : given(f)) {
        sources.emplace_back("--" + std::string(f.name), v);
      }
      if (!sources.empty()) set_flags.insert(f.name);
      for (const auto& [where, value] : sources) {
        try {
          f.apply(f, value, o, env);
        } catch (const BadValue& b) {
          return UsageError{"dlaunch: " + bad_value_text(where, b)};
        }
      }
      continue;
    }
    const FileSetting* in_file = nullptr;
    if (file) {
      if (auto it = file->settings.find(f.name); it != file->settings.end()) {
        in_file = &it->second;
      }
      if (f.name == "hostfile" && hosts_outside_file) in_file = nullptr;
    }
    std::string value, where = "--" + std::string(f.name);
    if (!given(f).empty()) {
      value = f.type == ValueType::kSwitch ? "1" : given(f)[0];
    } else if (auto it = env.find(pet_variable(f)); it != env.end()) {
      value = it->second;
      // Named in an error: the user may have set it long ago, not the flag.
      where = it->first + " (" + where + ")";
      if (in_file && note) {
        // A rerun of the file would otherwise change without a word.
        note("dlaunch: note: " + it->first + "=" + value + " overrides " +
             std::string(f.key) + ": " + in_file->value + " of " +
             in_file->pos.text() + "\n");
      }
    } else if (in_file) {
      value = in_file->value;
      where = in_file->pos.text() + ": " + std::string(f.key);
    } else {
      continue;
    }
    set_flags.insert(f.name);
    try {
      f.apply(f, value, o, env);
    } catch (const BadValue& b) {
      // A plan may be for GPU hosts made on a machine without one, and in
      // a multi-host job each host counts its own GPUs (checked below,
      // once the hosts are known).
      if (f.name == "nproc-per-node" && !o.nproc_per_node_spec.empty()) {
        o.nproc_per_node_unresolved = b.message;
        unresolved_nproc = "dlaunch: " + bad_value_text(where, b);
        continue;
      }
      return UsageError{"dlaunch: " + bad_value_text(where, b)};
    }
  }
  if (file) {
    o.config_file = file->path;
    o.env = file->env;
    // --hosts, --hostfile or PET_HOSTS replace the file's hosts.
    if (o.remote.hosts_text.empty() && o.remote.hostfile.empty()) {
      o.hosts = file->hosts;
      if (!o.hosts.empty()) o.hosts_given = true;
    }
  }
  // An srun task that names no rendezvous of its own meets the other
  // tasks of its step (slurm.h; README, "Slurm").
  std::optional<SlurmTask> slurm_task;
  bool own_rendezvous = !o.hosts.empty();
  for (const char* n : {"nnodes", "node-rank", "rdzv-endpoint", "standalone",
                        "hosts", "hostfile", "launcher"}) {
    own_rendezvous = own_rendezvous || set_flags.contains(n);
  }
  if (!own_rendezvous) {
    try {
      slurm_task = read_slurm_task(env);
      if (slurm_task) apply_slurm_task(o, *slurm_task, env);
    } catch (const HostsError& e) {
      return UsageError{"dlaunch: " + std::string(e.what())};
    }
  }
  try {
    o.agent.faults = agent::parse_faults(o.faults);
  } catch (const comm::FaultSpecError& e) {
    return UsageError{"dlaunch: " + std::string(e.what())};
  }
  if (has("drill")) o.mode = LaunchOptions::Mode::kDrill;
  if (has("dry-run")) o.mode = LaunchOptions::Mode::kDryRun;
  if (has("print-config")) o.mode = LaunchOptions::Mode::kPrintConfig;
  try {
    check_rendezvous(o);
    check_hosts(o, env);
  } catch (const BadValue& b) {
    return UsageError{"dlaunch: " + b.message};
  }
  // The agents of a step cannot agree on a secret without a channel: the
  // user gives it to every task (srun passes the environment on).
  if (slurm_task && slurm_task->nodes.size() > 1 &&
      (o.mode == LaunchOptions::Mode::kRun ||
       o.mode == LaunchOptions::Mode::kDrill) &&
      o.rdzv.token_file.empty() &&
      (!env.contains(comm::store::kTokenEnv) ||
       env.at(comm::store::kTokenEnv).empty())) {
    return UsageError{
        "dlaunch: as a task of Slurm step " + slurm_task->job_id + "." +
        slurm_task->step_id + " on " +
        std::to_string(slurm_task->nodes.size()) +
        " nodes, dlaunch meets the other nodes in a store on " +
        o.rdzv.endpoint_host +
        " that the network can reach, and the job has no token to guard "
        "it; give every task the same secret: export " +
        std::string(comm::store::kTokenEnv) +
        "=$(openssl rand -hex 32) before srun (srun passes it on), or "
        "--rdzv-conf token_file=PATH (a 0600 file every node can read)"};
  }
  // Only a plan (--dry-run), or a multi-host job whose hosts resolve it
  // themselves, goes on without this machine's count.
  if (!unresolved_nproc.empty() && !dry_run && o.hosts.empty()) {
    return UsageError{unresolved_nproc};
  }
  for (const agent::Fault& f : o.agent.faults) {
    if (f.kind == agent::Fault::Kind::kCut && o.rdzv.endpoint_host.empty()) {
      return UsageError{"dlaunch: fault '" + f.spec +
                        "': one node has no link to the other nodes to cut; "
                        "cut needs a multi-node job (--rdzv-endpoint)"};
    }
  }
  // A fixed-size job's ranks are known now; an elastic job's are checked
  // when each round forms.
  if (o.rdzv.min_nodes == o.rdzv.max_nodes &&
      o.nproc_per_node_unresolved.empty()) {
    int nodes = o.rdzv.max_nodes;
    int world = nodes * o.agent.nproc_per_node;
    if (!o.hosts.empty()) {
      // The head of a multi-host job: one node per host, each with its
      // slots or GPUs; a host that resolves cpu, gpu or auto itself leaves
      // the ranks' check to the agents.
      nodes = static_cast<int>(o.hosts.size());
      world = 0;
      for (const Host& h : o.hosts) {
        int n = 0;
        world =
            world >= 0 && parse_number(workers_on(o, h), n) ? world + n : -1;
      }
    }
    // One node's agent of several knows only its own workers: the others
    // may run more or fewer (a head's hosts with slots=1 and slots=3), so
    // its ranks are checked against the real world once the round forms
    // (Agent::check_faults).
    if (o.hosts.empty() && nodes > 1) world = -1;
    for (const agent::Fault& f : o.agent.faults) {
      if (f.targets_rank() && world < 0) continue;
      std::string why = agent::fault_out_of_range(f, world, nodes);
      if (!why.empty()) {
        return UsageError{"dlaunch: fault '" + f.spec + "': " + why};
      }
    }
  }
  if (o.agent.gpu_binding == agent::GpuBinding::kPerRank) {
    const auto listed = agent::visible_device_list(env);
    if (!listed.empty() &&
        listed.size() < static_cast<size_t>(o.agent.nproc_per_node)) {
      return UsageError{"dlaunch: --gpu-binding per-rank: " +
                        std::to_string(o.agent.nproc_per_node) +
                        " workers per node but CUDA_VISIBLE_DEVICES=" +
                        env.at("CUDA_VISIBLE_DEVICES") + " lists " +
                        std::to_string(listed.size()) +
                        "; list one GPU per worker or lower --nproc-per-node"};
    }
  }
  if (o.module && o.run_path) {
    return UsageError{
        "dlaunch: --run-path runs PROG as a script file and --module as a "
        "module; drop one"};
  }
  if (o.module && o.no_python) {
    return UsageError{
        "dlaunch: --module and --no-python cannot be used together; drop "
        "one"};
  }

  // The worker command; --run-path wins over --no-python, as in torchrun.
  bool python =
      o.run_path || (!o.no_python && (o.module || python_script(o.program)));
  std::vector<std::string>& cmd = o.agent.entrypoint;
  if (python) {
    // With hosts, checked once it is known whether this machine runs
    // workers (run_main): the script may live on the hosts only.
    if (o.hosts.empty() && o.remote.launcher != "slurm") {
      if (std::string e = missing_script(o); !e.empty()) {
        return UsageError{e, 127};
      }
    }
    cmd = {o.python, "-u"};
    if (o.module) cmd.push_back("-m");
  }
  cmd.push_back(o.program);
  cmd.insert(cmd.end(), o.program_args.begin(), o.program_args.end());
  return o;
}

bool runs_a_script(const LaunchOptions& o) {
  return !o.module &&
         (o.run_path || (!o.no_python && python_script(o.program)));
}

std::string missing_script(const LaunchOptions& o) {
  if (!runs_a_script(o)) return "";
  // Where this machine's workers will look: --chdir's folder (one that
  // does not exist is refused as such when the job starts).
  const std::string script =
      o.remote.chdir.empty() || o.program.starts_with('/')
          ? o.program
          : (std::filesystem::path(o.remote.chdir) / o.program).string();
  std::error_code ec;
  const bool enterable = o.remote.chdir.empty() ||
                         std::filesystem::is_directory(o.remote.chdir, ec);
  if (!enterable || ::access(script.c_str(), R_OK) == 0) return "";
  return "dlaunch: '" + script + "': " + std::strerror(errno) +
         " (the script to run under " + o.python + ")";
}

}  // namespace dlaunch::launcher
