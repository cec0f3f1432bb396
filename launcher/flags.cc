#include "launcher/flags.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <thread>

#include "launcher/cli.h"

namespace dlaunch::launcher {
namespace {

using Options = LaunchOptions;

int parse_int(const std::string& v, int lo, int hi, const std::string& forms) {
  int n = 0;
  if (!parse_number(v, n) || n < lo || n > hi) {
    throw BadValue{"'" + v + "' is not valid; use " + forms};
  }
  return n;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p - start));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, char sep) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

std::string text(bool b) { return b ? "true" : "false"; }

const std::pair<const char*, int> kSignals[] = {
    {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
    {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};

std::vector<int> parse_signals(const std::string& v) {
  std::vector<int> out;
  for (const std::string& name : split(v, ',')) {
    int sig = 0;
    for (const auto& [n, s] : kSignals) {
      if (name == n) sig = s;
    }
    if (sig == 0) {
      throw BadValue{"'" + name +
                     "' is not valid; use a comma-separated list of SIGTERM, "
                     "SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2"};
    }
    out.push_back(sig);
  }
  return out;
}

std::string print_signals(const std::vector<int>& sigs) {
  std::vector<std::string> names;
  for (int sig : sigs) {
    for (const auto& [n, s] : kSignals) {
      if (sig == s) names.emplace_back(n);
    }
  }
  return join(names, ',');
}

agent::StreamsSpec parse_streams(const std::string& v) {
  try {
    return agent::parse_streams(v);
  } catch (const std::invalid_argument& e) {
    throw BadValue{e.what()};
  }
}

std::string print_streams(const agent::StreamsSpec& s) {
  if (s.per_rank.empty()) return std::to_string(static_cast<int>(s.all));
  std::vector<std::string> parts;
  for (const auto& [rank, streams] : s.per_rank) {
    parts.push_back(std::to_string(rank) + ":" +
                    std::to_string(static_cast<int>(streams)));
  }
  return join(parts, ',');
}

int cpu_count() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int resolve_nproc(const std::string& v, const agent::EnvMap& env) {
  if (v == "cpu") return cpu_count();
  auto gpus = [&] {
    try {
      return cuda_device_count(env);
    } catch (const std::exception& e) {
      throw BadValue{e.what(), v};
    }
  };
  if (v == "gpu") {
    int n = gpus();
    if (n == 0) {
      throw BadValue{"no CUDA device is visible; use a number, cpu or auto", v};
    }
    return n;
  }
  if (v == "auto") {
    int n = gpus();
    return n > 0 ? n : cpu_count();
  }
  return parse_int(v, 1, 1 << 16, "a positive number, cpu, gpu or auto");
}

std::string one_of(const FlagSpec& f, const std::string& v,
                   const std::string& note = "") {
  for (std::string_view c : f.choices) {
    if (v == c) return v;
  }
  // "static or c10d", "spawn, fork or forkserver".
  std::string list;
  for (size_t i = 0; i < f.choices.size(); ++i) {
    if (i > 0) list += i + 1 == f.choices.size() ? " or " : ", ";
    list += f.choices[i];
  }
  throw BadValue{"'" + v + "' is not valid; use " + list + note};
}

void not_empty(const std::string& v) {
  if (v.empty()) throw BadValue{"must not be empty"};
}

std::vector<FlagSpec> make_table() {
  using T = ValueType;
  return {
      // WORKERS
      {.name = "nproc-per-node",
       .placeholder = "N|cpu|gpu|auto",
       .type = T::kInt,
       .key = "nproc_per_node",
       .default_text = "1",
       .help = "Workers on this node. cpu: one per CPU; gpu: one per visible "
               "CUDA device; auto: gpu if any, else cpu.",
       .section = "WORKERS",
       .choices = {"cpu", "gpu", "auto"},
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap& env) {
             o.agent.nproc_per_node = resolve_nproc(v, env);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return std::to_string(o.agent.nproc_per_node);
       }},
      {.name = "max-restarts",
       .placeholder = "N",
       .type = T::kInt,
       .key = "max_restarts",
       .default_text = "0",
       .help = "Restarts of the whole group after a worker fails.",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.max_restarts = parse_int(v, 0, 1 << 20, "a number >= 0");
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return std::to_string(o.agent.max_restarts);
       }},
      {.name = "role",
       .placeholder = "NAME",
       .key = "role",
       .default_text = "default",
       .help = "Role name (ROLE_NAME, the console prefix).",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.agent.role = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.agent.role;
       }},
      {.name = "rdzv-id",
       .aliases = {"--run-id", "--run_id"},
       .placeholder = "ID",
       .key = "rdzv_id",
       .default_text = "random",
       .help = "Run id (TORCHELASTIC_RUN_ID, the log folder's name).",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.agent.run_id = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.agent.run_id.empty()) return std::nullopt;
         return o.agent.run_id;
       }},
      {.name = "master-addr",
       .placeholder = "HOST",
       .key = "master_addr",
       .default_text = "127.0.0.1",
       .help = "MASTER_ADDR given to workers.",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.agent.master_addr = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.agent.master_addr;
       }},
      {.name = "master-port",
       .placeholder = "PORT",
       .type = T::kInt,
       .key = "master_port",
       .default_text = "0, a free port new for every restart",
       .help = "MASTER_PORT given to workers.",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.master_port = parse_int(v, 0, 65535, "a port 0..65535");
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return std::to_string(o.agent.master_port);
       }},
      {.name = "term-timeout",
       .placeholder = "SECONDS",
       .type = T::kSeconds,
       .key = "term_timeout",
       .default_text = "30",
       .help = "Grace period between SIGTERM (or a forwarded signal) and "
               "SIGKILL.",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.term_timeout = parse_duration(f, v);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return format_seconds(o.agent.term_timeout);
       }},

      // PROGRAMS
      {.name = "module",
       .aliases = {"-m"},
       .type = T::kSwitch,
       .key = "module",
       .help = "Run PROG as a Python module (python3 -u -m PROG).",
       .section = "PROGRAMS",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.module = parse_switch(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return text(o.module);
       }},
      {.name = "no-python",
       .type = T::kSwitch,
       .key = "no_python",
       .help = "Execute PROG directly, even when it ends in .py.",
       .section = "PROGRAMS",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.no_python = parse_switch(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return text(o.no_python);
       }},
      {.name = "python",
       .placeholder = "PATH",
       .type = T::kCommand,
       .key = "python",
       .default_text = "$PYTHON, else python3",
       .help = "Interpreter for .py programs and modules.",
       .section = "PROGRAMS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.python = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.python;
       }},

      // OUTPUT
      {.name = "log-dir",
       .placeholder = "DIR",
       .type = T::kPath,
       .key = "log_dir",
       .help = "Write logs to DIR/RUN_ID/attempt_K/LOCAL_RANK/"
               "{stdout,stderr}.log, the run summary to "
               "DIR/RUN_ID/summary.json and the effective job to "
               "DIR/RUN_ID/job.yaml.",
       .section = "OUTPUT",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.agent.log_dir = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.agent.log_dir.empty()) return std::nullopt;
         return o.agent.log_dir.string();
       }},
      {.name = "redirects",
       .aliases = {"-r"},
       .placeholder = "V",
       .key = "redirects",
       .default_text = "0",
       .help = "Streams sent only to the log files: 0 none, 1 stdout, "
               "2 stderr, 3 both, or per local rank like 0:3,1:0.",
       .section = "OUTPUT",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) { o.agent.redirects = parse_streams(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return print_streams(o.agent.redirects);
       }},
      {.name = "tee",
       .aliases = {"-t"},
       .placeholder = "V",
       .key = "tee",
       .default_text = "0",
       .help = "Streams sent to the log files and the console; same values "
               "as --redirects.",
       .section = "OUTPUT",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.agent.tee = parse_streams(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return print_streams(o.agent.tee);
       }},
      {.name = "local-ranks-filter",
       .placeholder = "R[,R...]",
       .type = T::kList,
       .key = "local_ranks_filter",
       .default_text = "all",
       .help = "Show only these local ranks on the console (the log files "
               "keep all).",
       .section = "OUTPUT",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             std::set<int> ranks;
             for (const std::string& r : split(v, ',')) {
               ranks.insert(parse_int(r, 0, 1 << 16,
                                      "comma-separated local ranks like 0,2"));
             }
             o.agent.local_ranks_filter = std::move(ranks);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (!o.agent.local_ranks_filter) return std::nullopt;
         std::vector<std::string> r;
         for (int i : *o.agent.local_ranks_filter) {
           r.push_back(std::to_string(i));
         }
         return join(r, ',');
       }},

      // SIGNALS
      {.name = "signals-to-handle",
       .placeholder = "LIST",
       .type = T::kList,
       .key = "signals_to_handle",
       .default_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
       .help = "Signals that stop the job: forwarded to every worker's "
               "process group, SIGKILL after --term-timeout, then dlaunch "
               "exits 128+signal. A second one kills at once. SIGUSR1 and "
               "SIGUSR2 are forwarded and the job goes on.",
       .section = "SIGNALS",
       .choices = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1",
                   "SIGUSR2"},
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.signals_to_handle = parse_signals(v);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return print_signals(o.agent.signals_to_handle);
       }},

      // RENDEZVOUS
      {.name = "nnodes",
       .placeholder = "1",
       .type = T::kInt,
       .key = "nnodes",
       .default_text = "1",
       .help = "Nodes in the job; this version runs one node.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             if (v != "1" && v != "1:1") {
               throw BadValue{"'" + v +
                              "' is not supported yet; this version runs "
                              "one node (use --nnodes 1)"};
             }
             o.nnodes = 1;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return std::to_string(o.nnodes);
       }},
      {.name = "node-rank",
       .placeholder = "0",
       .type = T::kInt,
       .key = "node_rank",
       .default_text = "0",
       .help = "This node's rank among the nodes.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.node_rank = parse_int(v, 0, 0, "0 (one node)");
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return std::to_string(o.node_rank);
       }},
      {.name = "rdzv-backend",
       .placeholder = "static|c10d",
       .key = "rdzv_backend",
       .default_text = "static",
       .help = "Rendezvous backend.",
       .section = "RENDEZVOUS",
       .choices = {"static", "c10d"},
       .apply = [](const FlagSpec& f, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.rdzv_backend = one_of(f, v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.rdzv_backend;
       }},
      {.name = "rdzv-endpoint",
       .placeholder = "HOST[:PORT]",
       .key = "rdzv_endpoint",
       .help = "Where the rendezvous store is served.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             size_t colon = v.rfind(':');
             if (v.empty() || colon == 0) {
               throw BadValue{"'" + v +
                              "' is not valid; use HOST or HOST:PORT"};
             }
             if (colon != std::string::npos) {
               parse_int(v.substr(colon + 1), 0, 65535,
                         "HOST or HOST:PORT with a port 0..65535");
             }
             o.rdzv_endpoint = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.rdzv_endpoint.empty()) return std::nullopt;
         return o.rdzv_endpoint;
       }},
      {.name = "rdzv-conf",
       .placeholder = "K=V,...",
       .type = T::kMap,
       .key = "rdzv_conf",
       .help = "Rendezvous settings, accepted as torchrun does.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.rdzv_conf.clear();
             if (v.empty()) return;
             for (const std::string& kv : split(v, ',')) {
               size_t eq = kv.find('=');
               if (eq == std::string::npos || eq == 0) {
                 throw BadValue{"'" + kv + "' is not valid; use K=V,..."};
               }
               o.rdzv_conf[kv.substr(0, eq)] = kv.substr(eq + 1);
             }
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.rdzv_conf.empty()) return std::nullopt;
         std::vector<std::string> kv;
         for (const auto& [k, v] : o.rdzv_conf) kv.push_back(k + "=" + v);
         return join(kv, ',');
       }},
      {.name = "standalone",
       .type = T::kSwitch,
       .key = "standalone",
       .default_text = "on for one node without --rdzv-endpoint",
       .help = "Host the rendezvous store locally on a free port.",
       .section = "RENDEZVOUS",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.standalone = parse_switch(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return text(o.standalone);
       }},
      {.name = "monitor-interval",
       .placeholder = "SECONDS",
       .type = T::kSeconds,
       .key = "monitor_interval",
       .default_text = "0.1",
       .help = "Accepted for compatibility; dlaunch detects exits through "
               "events, without polling.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.monitor_interval = parse_duration(f, v);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return format_seconds(o.monitor_interval);
       }},
      {.name = "start-method",
       .placeholder = "spawn|fork|forkserver",
       .key = "start_method",
       .default_text = "spawn",
       .help = "Accepted for compatibility; all start workers the same way "
               "in dlaunch.",
       .section = "RENDEZVOUS",
       .choices = {"spawn", "fork", "forkserver"},
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.start_method =
                 one_of(f, v, " (all start workers the same way in dlaunch)");
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.start_method;
       }},

      // JOB FILES and other actions
      {.name = "config",
       .placeholder = "FILE",
       .type = T::kPath,
       .action = true,
       .help =
           "Read the job from a YAML file (see JOB FILE FORMAT below); flags "
           "and PET_* variables override its keys.",
       .section = "JOB FILES"},
      {.name = "dry-run",
       .type = T::kSwitch,
       .action = true,
       .help = "Print the plan (each worker's environment and command line) "
               "and start nothing.",
       .section = "JOB FILES"},
      {.name = "print-config",
       .type = T::kSwitch,
       .action = true,
       .help = "Print the effective job as YAML (a file for --config) and "
               "start nothing.",
       .section = "JOB FILES"},
      {.name = "help",
       .aliases = {"-h"},
       .type = T::kSwitch,
       .action = true,
       .help = "Print this page.",
       .section = "OTHER"},
      {.name = "version",
       .type = T::kSwitch,
       .action = true,
       .help = "Print dlaunch's version.",
       .section = "OTHER"},
  };
}

}  // namespace

const std::vector<FlagSpec>& flags() {
  static const std::vector<FlagSpec> kFlags = make_table();
  return kFlags;
}

std::vector<std::string> spellings(const FlagSpec& flag) {
  std::vector<std::string> out = {"--" + std::string(flag.name)};
  std::string under = out[0];
  std::replace(under.begin() + 2, under.end(), '-', '_');
  if (under != out[0]) out.push_back(under);
  out.insert(out.end(), flag.aliases.begin(), flag.aliases.end());
  return out;
}

std::string pet_variable(const FlagSpec& flag) {
  if (flag.action) return "";
  std::string pet = "PET_";
  for (char c : flag.key) {
    pet += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  }
  return pet;
}

const FlagSpec* find_flag(std::string_view key_or_name) {
  for (const FlagSpec& f : flags()) {
    if ((!f.action && f.key == key_or_name) || f.name == key_or_name) {
      return &f;
    }
  }
  return nullptr;
}

bool parse_switch(const std::string& v) {
  for (const char* t : {"1", "true", "True", "TRUE", "yes", "on"}) {
    if (v == t) return true;
  }
  for (const char* f : {"", "0", "false", "False", "FALSE", "no", "off"}) {
    if (v == f) return false;
  }
  throw BadValue{"'" + v + "' is not valid; use true or false (1 or 0)"};
}

std::chrono::milliseconds parse_duration(const FlagSpec& flag,
                                         const std::string& v) {
  double d = 0;
  // Whole milliseconds: a positive value under 1 ms would become 0.
  if (!parse_number(v, d) || !std::isfinite(d) || d < 1e-3 ||
      d > flag.max_seconds) {
    std::string max = flag.max_seconds == kMaxSeconds
                          ? std::string(kMaxSecondsText)
                          : format_seconds(std::chrono::milliseconds(
                                static_cast<int64_t>(flag.max_seconds * 1e3)));
    throw BadValue{"'" + v +
                   "' is not valid; use a number of seconds from 0.001 to " +
                   max + ", like 0.5 or 30"};
  }
  return std::chrono::milliseconds(std::llround(d * 1e3));
}

std::string format_seconds(std::chrono::milliseconds d) {
  // Exact decimal text (no exponent), so --print-config reads back the same.
  std::string s = std::to_string(d.count() / 1000);
  if (int64_t ms = d.count() % 1000; ms != 0) {
    char frac[8];
    std::snprintf(frac, sizeof frac, ".%03lld", static_cast<long long>(ms));
    s += frac;
    while (s.back() == '0') s.pop_back();
  }
  return s;
}

}  // namespace dlaunch::launcher
