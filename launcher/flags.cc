#include "launcher/flags.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "agent/fault.h"
#include "comm/fault_spec.h"
#include "launcher/cli.h"
#include "launcher/hosts.h"
#include "launcher/slurm.h"

namespace dlaunch::launcher {
namespace {
const agent::AgentOptions& AgentDefaults() {
  static const agent::AgentOptions kDefaults;
  return kDefaults;
}
}  // namespace
}  // namespace dlaunch::launcher

namespace dlaunch::launcher {
namespace {

using Options = LaunchOptions;

// The largest node count, node rank and restart count the flags take
// (beyond any real job).
constexpr int kMaxCount = 1 << 20;

// `v` as a whole number lo..hi, else BadValue "'V' is not valid; use
// FORMS".
int parse_int(const std::string& v, int lo, int hi, const std::string& forms) {
  int n = 0;
  if (!parse_in_range(v, lo, hi, n)) {
    throw BadValue{"'" + v + "' is not valid; use " + forms};
  }
  return n;
}

// The same, FORMS being "NOUN LO..HI", from the bounds.
int parse_int_in(const std::string& v, int lo, int hi,
                 std::string_view noun = "a number") {
  return parse_int(v, lo, hi, range_text(noun, lo, hi));
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
  return parse_int(v, 1, kMaxSlots,
                   "a positive number (at most " + std::to_string(kMaxSlots) +
                       "), cpu, gpu or auto");
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

// Whether `v` holds a control character (below ' ', or DEL).
bool has_control(std::string_view v) {
  return std::ranges::any_of(v, [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

// A host name or address: not empty, and no space or control character
// (which no name holds; a lookup of one fails only after a timeout).
void check_host(const std::string& v) {
  not_empty(v);
  if (has_control(v) || v.find(' ') != std::string::npos) {
    throw BadValue{"'" + v +
                   "' is not a host name or address (it holds a space or "
                   "a control character); give a name like node01 or an "
                   "address like 10.0.0.2"};
  }
}

// A host as given, an IPv6 address unbracketed ([::1], as torchrun's help
// writes it, is ::1) and in its short form (0:0:0:0:0:0:0:1 is ::1): the
// store binds, connects and tells loopback by that text.
std::string host_arg(const std::string& v) {
  std::string host = v;
  if (!v.empty() && v.front() == '[') {
    if (v.size() < 3 || v.back() != ']') {
      throw BadValue{"'" + v +
                     "' is not valid; write an IPv6 address as [::1] or ::1, "
                     "without a port"};
    }
    host = v.substr(1, v.size() - 2);
  }
  check_host(host);
  in6_addr a{};
  char text[INET6_ADDRSTRLEN];
  // A link-local address keeps its zone (fe80::1%eth0).
  const size_t zone = host.find('%');
  const std::string address = host.substr(0, zone);
  if (::inet_pton(AF_INET6, address.c_str(), &a) == 1 &&
      ::inet_ntop(AF_INET6, &a, text, sizeof text) != nullptr) {
    host = text + (zone == std::string::npos ? "" : host.substr(zone));
  } else if (host.find(':') != std::string::npos) {
    // (node0:29400:1 was taken for a name, failing at the join timeout.)
    throw BadValue{"'" + v +
                   "' is not a host: a name or IPv4 address holds no ':'; "
                   "write HOST or HOST:PORT without a scheme (no http://), "
                   "and an IPv6 address as [::1] or [::1]:PORT"};
  }
  return host;
}

// HOST[:PORT] of the agents' store ([V6]:PORT for IPv6); port 29400 unless
// given.
void parse_endpoint(const std::string& v,
                    agent::rendezvous::RendezvousOptions& r) {
  const std::string forms = "'" + v +
                            "' is not valid; use HOST or HOST:PORT with " +
                            range_text("a port", 0, 65535);
  std::string host = v;
  std::string port;
  if (v[0] == '[') {
    size_t close = v.find(']');
    if (close == std::string::npos) throw BadValue{forms};
    host = v.substr(1, close - 1);
    if (close + 1 < v.size()) {
      if (v[close + 1] != ':') throw BadValue{forms};
      port = v.substr(close + 2);
    }
  } else if (size_t colon = v.rfind(':');
             colon != std::string::npos && v.find(':') == colon) {
    host = v.substr(0, colon);
    port = v.substr(colon + 1);
  }
  if (host.empty()) throw BadValue{forms};
  r.endpoint_host = host_arg(host);
  r.endpoint_port = 29400;
  if (!port.empty() || v.back() == ':') {
    // The message quotes all of `v`: a bare '' or 'x' names nothing.
    if (!parse_in_range(port, 0, 65535, r.endpoint_port)) {
      throw BadValue{forms};
    }
  }
}

// One --rdzv-conf key: torchrun's c10d keys; durations in seconds.
void apply_rdzv_conf(const FlagSpec& f, const std::string& key,
                     const std::string& v,
                     agent::rendezvous::RendezvousOptions& r) {
  auto seconds = [&] {
    try {
      return parse_duration(f, v);
    } catch (const BadValue& b) {
      throw BadValue{b.message, key};
    }
  };
  if (key == "join_timeout") {
    r.join_timeout = seconds();
  } else if (key == "last_call_timeout") {
    r.last_call_timeout = seconds();
  } else if (key == "close_timeout") {
    r.close_timeout = seconds();
  } else if (key == "keep_alive_interval") {
    r.keep_alive_interval = seconds();
  } else if (key == "read_timeout" || key == "timeout") {
    r.read_timeout = seconds();
  } else if (key == "keep_alive_max_attempt") {
    try {
      r.keep_alive_max_attempt = parse_int_in(v, 1, 1000, "a whole number");
    } catch (const BadValue& b) {
      throw BadValue{b.message, key};
    }
  } else if (key == "is_host") {
    try {
      r.is_host = parse_switch(v);
    } catch (const BadValue& b) {
      throw BadValue{b.message, key};
    }
  } else if (key == "cacert" || key == "cert" || key == "key" ||
             key == "user" || key == "password_file") {
    if (v.empty()) throw BadValue{"must not be empty", key};
    (key == "cacert" ? r.cacert
     : key == "cert" ? r.cert
     : key == "key"  ? r.key
     : key == "user" ? r.user
                     : r.password_file) = v;
  } else if (key == "password") {
    throw BadValue{
        "a password on the command line is visible to every user (ps); "
        "put it in a file only you can read and give password_file=PATH"};
  } else if (key == "token_file") {
    // Read when the job starts (launch), not here: --dry-run and
    // --print-config need no token.
    if (v.empty()) {
      throw BadValue{
          "needs a path: token_file=PATH (a 0600 file holding "
          "the job's token)",
          key};
    }
    r.token_file = v;
  } else {
    throw BadValue{"unknown key '" + key +
                   "'; valid keys are join_timeout, last_call_timeout, "
                   "close_timeout, keep_alive_interval, "
                   "keep_alive_max_attempt, is_host, read_timeout, timeout, "
                   "token_file, and for etcd cacert, cert, key, user, "
                   "password_file"};
  }
}

// A switch that sets one field of the options (--module, --standalone).
template <bool LaunchOptions::*field>
void apply_switch(const FlagSpec&, const std::string& v, Options& o,
                  const agent::EnvMap&) {
  o.*field = parse_switch(v);
}

template <bool LaunchOptions::*field>
std::optional<std::string> print_switch(const Options& o) {
  return text(o.*field);
}

// --include/--exclude: checked with the host filter's parser, kept as
// written (applied to `hosts` once every host is known).
template <std::string RemoteOptions::*field>
void apply_host_filter(const FlagSpec&, const std::string& v, Options& o,
                       const agent::EnvMap&) {
  if (!v.empty()) {
    try {
      parse_host_filter(v);
    } catch (const HostsError& e) {
      throw BadValue{e.what()};
    }
  }
  o.remote.*field = v;
}

// --nnodes as given: "N" or "MIN:MAX".
std::string nnodes_text(const agent::rendezvous::RendezvousOptions& r) {
  return r.min_nodes == r.max_nodes
             ? std::to_string(r.min_nodes)
             : std::to_string(r.min_nodes) + ":" + std::to_string(r.max_nodes);
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
             o.nproc_per_node_given = true;
             o.nproc_per_node_spec =
                 v == "cpu" || v == "gpu" || v == "auto" ? v : "";
             o.agent.nproc_per_node = resolve_nproc(v, env);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         // Left out unless given: printed as the default 1, it would
         // override hosts' slots when rerun (with hosts added too).
         if (!o.nproc_per_node_given) return std::nullopt;
         // cpu/gpu/auto as given: each host counts its own.
         if (!o.nproc_per_node_spec.empty()) return o.nproc_per_node_spec;
         return std::to_string(o.agent.nproc_per_node);
       }},
      {.name = "gpu-binding",
       .placeholder = "none|per-rank",
       .key = "gpu_binding",
       .default_text = "none",
       .help = "per-rank: each worker sees only its own GPU "
               "(CUDA_VISIBLE_DEVICES set to the local rank's entry of "
               "yours, or to the local rank) and comm's nccl backend uses "
               "device 0 (DLAUNCH_CUDA_DEVICE=0); none: workers inherit "
               "CUDA_VISIBLE_DEVICES and pick a device by LOCAL_RANK.",
       .section = "WORKERS",
       .choices = {"none", "per-rank"},
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.gpu_binding = one_of(f, v) == "per-rank"
                                       ? agent::GpuBinding::kPerRank
                                       : agent::GpuBinding::kNone;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.agent.gpu_binding == agent::GpuBinding::kPerRank ? "per-rank"
                                                                   : "none";
       }},
      {.name = "cpu-bind",
       .placeholder = "none|core",
       .key = "cpu_bind",
       .default_text = "none",
       .help = "core: local rank L runs only on core L mod N of the N cores "
               "dlaunch may use (mpirun's --bind-to core, srun's "
               "--cpu-bind=cores): ranks on one host neither share a core "
               "nor migrate, and the worker's children (data loaders) share "
               "its core; none: workers run wherever dlaunch may.",
       .section = "WORKERS",
       .choices = {"none", "core"},
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.cpu_binding = one_of(f, v) == "core"
                                       ? agent::CpuBinding::kCore
                                       : agent::CpuBinding::kNone;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.agent.cpu_binding == agent::CpuBinding::kCore ? "core"
                                                                : "none";
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
             o.agent.max_restarts = parse_int_in(v, 0, kMaxCount);
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
             // It names folders (--log-dir DIR/ID, the run folder).
             if (v.find('/') != std::string::npos || v == "." || v == ".." ||
                 has_control(v)) {
               throw BadValue{"'" + v +
                              "' cannot name a folder (the logs' and the "
                              "run's); use letters, digits, '-', '_' and "
                              "'.', without '/'"};
             }
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
       .help = "MASTER_ADDR given to workers (static backend; c10d uses "
               "group rank 0's --local-addr). IPv6 as ::1 or [::1].",
       .section = "WORKERS",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.agent.master_addr = host_arg(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.agent.master_addr;
       }},
      {.name = "master-port",
       .placeholder = "PORT",
       .type = T::kInt,
       .key = "master_port",
       .default_text = "0, a free port new for every restart",
       .help = "MASTER_PORT given to workers: their rank 0 binds it, so it "
               "must differ from the agents' store port (--rdzv-endpoint's, "
               "29400 by default). With c10d across nodes, 0 picks a port "
               "free on group rank 0's node.",
       .section = "WORKERS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.master_port = parse_int_in(v, 0, 65535, "a port");
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
       .apply = apply_switch<&LaunchOptions::module>,
       .print = print_switch<&LaunchOptions::module>},
      {.name = "no-python",
       .type = T::kSwitch,
       .key = "no_python",
       .help = "Execute PROG directly, even when it ends in .py.",
       .section = "PROGRAMS",
       .apply = apply_switch<&LaunchOptions::no_python>,
       .print = print_switch<&LaunchOptions::no_python>},
      {.name = "run-path",
       .type = T::kSwitch,
       .key = "run_path",
       .help = "Run PROG under the interpreter whatever its name "
               "(python3 -u PROG), as torchrun's --run-path runs it with "
               "runpy.run_path; wins over --no-python.",
       .section = "PROGRAMS",
       .apply = apply_switch<&LaunchOptions::run_path>,
       .print = print_switch<&LaunchOptions::run_path>},
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
               "{stdout,stderr}.log (K: the rendezvous round, one per start "
               "of the worker group), the run summary to "
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
       .placeholder = "N|MIN:MAX",
       .key = "nnodes",
       .default_text = "1",
       .help = "Nodes in the job. MIN:MAX (c10d only) runs elastically with "
               "any count in the range: nodes may fail, leave and join. "
               "Started by srun once per node with none of --nnodes, "
               "--node-rank, --rdzv-endpoint, --hosts: the step's nodes, "
               "ranked by SLURM_NODEID, meeting on its first node (needs "
               "DLAUNCH_RDZV_TOKEN; README, \"dlaunch as an srun task\").",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             const size_t colon = v.find(':');
             int lo = 0, hi = 0;
             // MAX is checked from MIN up: a range the wrong way round
             // fails like any other bad value.
             const bool valid =
                 parse_in_range(v.substr(0, colon), 1, kMaxCount, lo) &&
                 (colon == std::string::npos
                      ? (hi = lo, true)
                      : parse_in_range(v.substr(colon + 1), lo, kMaxCount, hi));
             if (!valid) {
               // All of `v`, not the half that is wrong.
               throw BadValue{"'" + v +
                              "' is not valid; use N or MIN:MAX with 1 <= "
                              "MIN <= MAX <= " +
                              std::to_string(kMaxCount) + ", like 2 or 2:4"};
             }
             o.rdzv.min_nodes = lo;
             o.rdzv.max_nodes = hi;
             o.nnodes_given = true;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         // Left out unless given: a multi-host head runs one node per
         // host, so a printed count would refuse a rerun on other hosts
         // (--exclude, or --hosts added).
         if (!o.nnodes_given) return std::nullopt;
         return nnodes_text(o.rdzv);
       }},
      {.name = "node-rank",
       .placeholder = "K",
       .type = T::kInt,
       .key = "node_rank",
       .help = "This node's rank with the static backend (0..N-1).",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.rdzv.node_rank = parse_int_in(v, 0, kMaxCount);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.rdzv.node_rank < 0) return std::nullopt;
         return std::to_string(o.rdzv.node_rank);
       }},
      {.name = "rdzv-backend",
       .placeholder = "static|c10d|etcd",
       .key = "rdzv_backend",
       .default_text = "static",
       .help = "static: a fixed set of nodes, each given --node-rank. c10d: "
               "nodes meet in the agents' TCP store and get group ranks in "
               "the order they first joined; ranks stay put while nodes "
               "live. etcd: c10d's rounds on an etcd cluster, which no node "
               "loss ends.",
       .section = "RENDEZVOUS",
       .choices = {"static", "c10d", "etcd"},
       .apply = [](const FlagSpec& f, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.rdzv.backend = one_of(f, v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.rdzv.backend;
       }},
      {.name = "rdzv-endpoint",
       .placeholder = "HOST[:PORT]",
       .key = "rdzv_endpoint",
       .default_text = "none on one node; --master-addr:29400 for static",
       .help = "The agents' store (port 29400 unless given). The agent on "
               "HOST hosts it (see is_host); the others connect. For etcd: "
               "its members, HOST:PORT[,HOST:PORT...] (port 2379 unless "
               "given), tried in order.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.rdzv.endpoints.clear();
             if (v.empty()) {
               o.rdzv.endpoint_host.clear();
               return;
             }
             for (const std::string& e : split(v, ',')) {
               parse_endpoint(e.empty() ? v : e, o.rdzv);
               o.rdzv.endpoints.push_back(e);
             }
             parse_endpoint(o.rdzv.endpoints[0], o.rdzv);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         const auto& r = o.rdzv;
         if (r.endpoint_host.empty()) return std::nullopt;
         if (r.backend == "etcd" || r.endpoints.size() > 1) {
           return join(r.endpoints, ',');
         }
         bool v6 = r.endpoint_host.find(':') != std::string::npos;
         return (v6 ? "[" + r.endpoint_host + "]" : r.endpoint_host) + ":" +
                std::to_string(r.endpoint_port);
       }},
      {.name = "rdzv-conf",
       .placeholder = "K=V,...",
       .type = T::kMap,
       .key = "rdzv_conf",
       .help = "join_timeout (600 s), last_call_timeout (30), close_timeout "
               "(30), keep_alive_interval (5), keep_alive_max_attempt (3), "
               "read_timeout or timeout (60): seconds. is_host=true|false: "
               "whether this agent hosts the store (default: when the "
               "endpoint's HOST names this machine). token_file=PATH: a "
               "0600 file holding the job's store token (default: "
               "$DLAUNCH_RDZV_TOKEN). etcd only: cacert, "
               "cert, key (PEM files for TLS), user and password_file (the "
               "password never goes on the command line). Any other key is "
               "an error.",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.rdzv_conf.clear();
             if (v.empty()) return;
             for (const std::string& kv : split(v, ',')) {
               size_t eq = kv.find('=');
               if (eq == std::string::npos || eq == 0) {
                 throw BadValue{"'" + kv +
                                "' is not KEY=VALUE; use a comma-separated "
                                "list like join_timeout=600,is_host=true"};
               }
               // A key given again wins, as in torchrun: defaults first,
               // then overrides ("${BASE},join_timeout=60").
               const std::string key = kv.substr(0, eq);
               apply_rdzv_conf(f, key, kv.substr(eq + 1), o.rdzv);
               o.rdzv_conf[key] = kv.substr(eq + 1);
             }
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.rdzv_conf.empty()) return std::nullopt;
         std::vector<std::string> kv;
         for (const auto& [k, v] : o.rdzv_conf) kv.push_back(k + "=" + v);
         return join(kv, ',');
       }},
      {.name = "local-addr",
       .placeholder = "ADDR",
       .key = "local_addr",
       .default_text = "the host name",
       .help = "The address other nodes reach this one at; with c10d, "
               "group rank 0's is MASTER_ADDR.",
       .section = "RENDEZVOUS",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.rdzv.local_addr = host_arg(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.rdzv.local_addr.empty()) return std::nullopt;
         return o.rdzv.local_addr;
       }},
      {.name = "exit-barrier-timeout",
       .placeholder = "SECONDS",
       .type = T::kSeconds,
       .key = "exit_barrier_timeout",
       .default_text = "300",
       .help = "After this node's workers succeeded, how long to wait for "
               "the other nodes' (a failed node releases the others at "
               "once).",
       .section = "RENDEZVOUS",
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.exit_barrier_timeout = parse_duration(f, v);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return format_seconds(o.agent.exit_barrier_timeout);
       }},
      {.name = "standalone",
       .type = T::kSwitch,
       .key = "standalone",
       .default_text = "off (one node without --rdzv-endpoint needs no store)",
       .help = "Host a TCP store on a free port while the job runs, as "
               "torchrun's --standalone does (one node meets no other "
               "agent; its workers use rank 0's store).",
       .section = "RENDEZVOUS",
       .apply = apply_switch<&LaunchOptions::standalone>,
       .print = print_switch<&LaunchOptions::standalone>},
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

      // HOSTS
      {.name = "hosts",
       .placeholder = "HOSTLIST",
       .type = T::kList,
       .key = "hosts",
       .default_text = "this node only",
       .help = "The job's hosts, one agent each, in pdsh/Slurm hostlist "
               "syntax with zero padding kept: node[01-04],gpu7. NAME:SLOTS "
               "gives a host SLOTS workers (else --nproc-per-node's). In a "
               "job file: a list, or a hostlist.",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             try {
               o.hosts = parse_host_list(v);
             } catch (const HostsError& e) {
               throw BadValue{e.what()};
             }
             o.remote.hosts_text = v;
             o.hosts_given = true;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         // A Slurm allocation's nodes are the next allocation's to name.
         if (o.hosts.empty() ||
             (!o.hosts_given && o.remote.launcher == "slurm")) {
           return std::nullopt;
         }
         std::vector<std::string> names;
         for (const Host& h : o.hosts) {
           // A host narrowed to some GPUs: enough slots for them, and
           // `include` names them.
           const int slots =
               h.gpus.empty()
                   ? h.slots
                   : *std::max_element(h.gpus.begin(), h.gpus.end()) + 1;
           names.push_back(slots > 0 ? h.name + ":" + std::to_string(slots)
                                     : h.name);
         }
         return join(names, ',');
       }},
      {.name = "hostfile",
       .placeholder = "FILE",
       .type = T::kPath,
       .key = "hostfile",
       .help = "Read the hosts from FILE: lines NAME, NAME:SLOTS or NAME "
               "slots=SLOTS (NAME may be a hostlist), '#' comments, blank "
               "lines; a host listed twice is an error.",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             try {
               o.hosts = read_hostfile(v);
             } catch (const HostsError& e) {
               throw BadValue{e.what()};
             }
             o.remote.hostfile = v;
             o.hosts_given = true;
           },
       // The hosts it held are written as `hosts`.
       .print = [](const Options&) -> std::optional<std::string> {
         return std::nullopt;
       }},
      {.name = "include",
       .placeholder = "NAME[:GPU,...]@...",
       .key = "include",
       .help = "Run on these hosts only, and on a host given GPU indices on "
               "those GPUs only (its CUDA_VISIBLE_DEVICES and worker count): "
               "node01:0,2@node02 (deepspeed's syntax).",
       .section = "HOSTS",
       .apply = apply_host_filter<&RemoteOptions::include>,
       // Applied to `hosts`; written back only for the hosts left with some
       // of their GPUs (from --include or --exclude), so that a printed job
       // runs on the same GPUs.
       .print = [](const Options& o) -> std::optional<std::string> {
         if (std::ranges::all_of(
                 o.hosts, [](const Host& h) { return h.gpus.empty(); })) {
           return std::nullopt;
         }
         std::vector<std::string> kept;
         for (const Host& h : o.hosts) {
           kept.push_back(h.gpus.empty() ? h.name
                                         : h.name + ":" + gpu_list(h.gpus));
         }
         return join(kept, '@');
       }},
      {.name = "exclude",
       .placeholder = "NAME[:GPU,...]@...",
       .key = "exclude",
       .help = "Leave out these hosts, or these GPUs of a host: "
               "node01:1@node03 (deepspeed's syntax).",
       .section = "HOSTS",
       .apply = apply_host_filter<&RemoteOptions::exclude>,
       .print = [](const Options&) -> std::optional<std::string> {
         return std::nullopt;  // applied to `hosts`
       }},
      {.name = "launcher",
       .placeholder = "ssh|pdsh|slurm|local",
       .key = "launcher",
       .default_text = "ssh",
       .help = "How the head starts an agent on each host other than "
               "itself: ssh (one connection per host, carrying the job, its "
               "environment and token on stdin), pdsh (pdsh -S -b over all "
               "hosts; PDSH_RCMD_TYPE respected), slurm (inside a Slurm "
               "allocation: one srun task per node, every node an agent, "
               "the hosts the allocation's nodes unless --hosts names some "
               "of them), local (a process on this machine per host, for "
               "loopback addresses 127.0.0.x).",
       .section = "HOSTS",
       .choices = {"ssh", "pdsh", "slurm", "local"},
       .apply = [](const FlagSpec& f, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.remote.launcher = one_of(f, v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         return o.remote.launcher;
       }},
      {.name = "ssh-port",
       .placeholder = "PORT",
       .type = T::kInt,
       .key = "ssh_port",
       .default_text = "ssh's own",
       .help = "The port of every host's sshd.",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.remote.ssh_port = parse_int_in(v, 1, 65535, "a port");
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.remote.ssh_port == 0) return std::nullopt;
         return std::to_string(o.remote.ssh_port);
       }},
      {.name = "ssh-args",
       .placeholder = "ARGS",
       .key = "ssh_args",
       .help = "More ssh options, split like a shell would: \"-i key -o "
               "'ProxyJump gw'\". dlaunch always adds -o BatchMode=yes and "
               "-o ConnectTimeout.",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) { o.remote.ssh_args = split_words(v); },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.remote.ssh_args.empty()) return std::nullopt;
         std::string out;
         for (const std::string& a : o.remote.ssh_args) {
           out += (out.empty() ? "'" : " '");
           for (char c : a)
             out += c == '\'' ? std::string("'\\''") : std::string(1, c);
           out += "'";
         }
         return out;
       }},
      {.name = "connect-timeout",
       .placeholder = "SECONDS",
       .type = T::kSeconds,
       .key = "connect_timeout",
       .default_text = "10",
       .help = "ssh's ConnectTimeout, how long each host's pre-flight "
               "check may take, and how long the lookup of a host's or "
               "the rendezvous endpoint's name may take.",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.remote.connect_timeout = parse_duration(f, v);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return format_seconds(o.remote.connect_timeout);
       }},
      {.name = "pdsh-fanout",
       .placeholder = "N",
       .type = T::kInt,
       .key = "pdsh_fanout",
       .default_text = "32",
       .help = "With --launcher pdsh, how many hosts pdsh reaches at once "
               "(pdsh -f).",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.remote.pdsh_fanout = parse_int_in(v, 1, 1 << 16);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         return std::to_string(o.remote.pdsh_fanout);
       }},
      {.name = "remote-dlaunch",
       .placeholder = "PATH",
       .key = "remote_dlaunch",
       .default_text = "this dlaunch's path",
       .help = "Where dlaunch is on every host; the pre-flight checks that "
               "it runs there and is this version, and ships this one to a "
               "host where it does not (into the user's cache there, "
               "~/.cache/dlaunch, kept for later jobs).",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.remote.remote_dlaunch = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.remote.remote_dlaunch.empty()) return std::nullopt;
         return o.remote.remote_dlaunch;
       }},
      {.name = "export",
       .aliases = {"-x"},
       .placeholder = "NAME[=VALUE]",
       .type = T::kRepeated,
       .key = "export",
       .help = "Set NAME on every host: to VALUE, or to this machine's "
               "value. Repeatable. PATH, LD_LIBRARY_PATH and the variables "
               "starting with NCCL_, CUDA_, GLOO_, OMP_, PYTHON, DLAUNCH_ "
               "or TORCH go by default. Values travel on the agents' stdin "
               "(or a 0600 file with pdsh), never on a command line.",
       .section = "HOSTS",
       .repeatable = true,
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             for (const std::string& item : split(v, '\n')) {
               if (item.empty()) {
                 throw BadValue{
                     "'' names no variable; give NAME or NAME=VALUE, or "
                     "drop the empty export"};
               }
               if (!is_variable_name(item.substr(0, item.find('=')))) {
                 throw BadValue{"'" + item +
                                "' is not NAME or NAME=VALUE (a name is "
                                "letters, digits and _, not starting with a "
                                "digit)"};
               }
               o.remote.exports.push_back(item);
             }
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.remote.exports.empty()) return std::nullopt;
         // Secrets' values are left out by job_yaml (export_item).
         return join(o.remote.exports, '\n');
       }},
      {.name = "env-file",
       .placeholder = "FILE",
       .type = T::kPath,
       .key = "env_file",
       .help = "NAME=VALUE lines ('#' comments, blank lines) set on every "
               "host; values are taken literally.",
       .section = "HOSTS",
       .apply = [](const FlagSpec&, const std::string& v, Options& o,
                   const agent::EnvMap&) { o.remote.env_file = v; },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.remote.env_file.empty()) return std::nullopt;
         return o.remote.env_file;
       }},
      {.name = "chdir",
       .placeholder = "DIR",
       .type = T::kPath,
       .key = "chdir",
       .default_text = "the current folder",
       .help = "The working folder of every host's agent and workers (a "
               "relative one is the head's current folder's, as mpirun's "
               "-wdir).",
       .section = "HOSTS",
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             not_empty(v);
             o.remote.chdir = v;
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.remote.chdir.empty()) return std::nullopt;
         return o.remote.chdir;
       }},

      // RELIABILITY
      {.name = "fault",
       .placeholder = "SPEC",
       .type = T::kList,
       .key = "faults",
       .help = "Inject a failure (repeatable; comma-separated specs; more "
               "from DLAUNCH_FAULTS and the job file's faults: list, all "
               "adding up). SPEC is KIND:KEY=VALUE[:KEY=VALUE...]: "
               "kill:rank=R[:signal=KILL] sends a signal to rank R; "
               "exit:rank=R[:code=1] ends rank R as if it exited with CODE; "
               "stop:rank=R freezes it (SIGSTOP, a hang); "
               "kill-agent:node=N[:signal=KILL] kills node N's agent; "
               "cut:node=N:for=SECONDS silences node N's link to the agents' "
               "store (a partition: past the keep-alive the others drop "
               "it). Each "
               "takes :after=SECONDS (after the group started, default 0) and "
               ":attempt=K (the start with restart count K, default 0). "
               "Each fault fires once on each node's agent (a node= fault "
               "given to every node fires again on the node that takes "
               "group rank N after a loss), is logged, and is marked "
               "injected in the failure report and summary.json. See "
               "docs/reliability.md.",
       .section = "RELIABILITY",
       .repeatable = true,
       .apply =
           [](const FlagSpec&, const std::string& v, Options& o,
              const agent::EnvMap&) {
             for (const std::string& spec : comm::split_fault_list(v)) {
               try {
                 agent::parse_fault(spec);
               } catch (const comm::FaultSpecError& e) {
                 throw BadValue{e.what()};
               }
               o.faults.push_back(spec);
             }
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.faults.empty()) return std::nullopt;
         return join(o.faults, ',');
       }},
      {.name = "hang-timeout",
       .placeholder = "SECONDS",
       .type = T::kSeconds,
       .key = "hang_timeout",
       .default_text = "off",
       .help = "Treat a worker whose progress stopped for this long as "
               "failed: it gets SIGKILL, the others SIGTERM, and the group "
               "restarts; the report names the stuck ranks (lowest progress) "
               "and the operation each is in. Progress is comm's count of "
               "operations; programs without comm opt in by touching the "
               "file named by DLAUNCH_HEARTBEAT_FILE. The timeout starts "
               "once a worker shows progress; one that never does is named "
               "stuck when the others wait for it.",
       .section = "RELIABILITY",
       .apply =
           [](const FlagSpec& f, const std::string& v, Options& o,
              const agent::EnvMap&) {
             o.agent.hang_timeout = parse_duration(f, v);
           },
       .print = [](const Options& o) -> std::optional<std::string> {
         if (o.agent.hang_timeout.count() == 0) return std::nullopt;
         return format_seconds(o.agent.hang_timeout);
       }},
      {.name = "drill",
       .placeholder = "FILE",
       .type = T::kPath,
       .action = true,
       .help = "Run the YAML job FILE with its faults and print a verdict "
               "table: each fault, when it fired, the time to detection and "
               "to the group running again, and whether the job still "
               "finished with exit 0. Flags given beside it apply as with "
               "--config; dlaunch exits 0 when every fault fired and the job "
               "finished, 1 otherwise.",
       .section = "RELIABILITY"},

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

// --rdzv-backend etcd: endpoints (port 2379 unless given), and the etcd
// keys only with it.
void check_etcd(LaunchOptions& o) {
  agent::rendezvous::RendezvousOptions& r = o.rdzv;
  const bool etcd = r.backend == "etcd";
  for (const char* k : {"cacert", "cert", "key", "user", "password_file"}) {
    if (!etcd && o.rdzv_conf.contains(k)) {
      throw BadValue{"--rdzv-conf " + std::string(k) +
                     " applies to --rdzv-backend etcd"};
    }
  }
  if (!etcd) {
    if (r.endpoints.size() > 1) {
      throw BadValue{
          "--rdzv-endpoint: a list of endpoints is for "
          "--rdzv-backend etcd; c10d and static take one"};
    }
    return;
  }
  if (r.endpoints.empty()) {
    throw BadValue{
        "--rdzv-backend etcd needs --rdzv-endpoint "
        "HOST:2379[,HOST:2379...] (the etcd members)"};
  }
  if (r.is_host.has_value()) {
    throw BadValue{
        "--rdzv-conf is_host applies to c10d; with etcd no agent "
        "hosts the store"};
  }
  if (r.node_rank >= 0) {
    throw BadValue{
        "--node-rank applies to --rdzv-backend static; etcd "
        "assigns node ranks itself (drop --node-rank)"};
  }
  if (r.user.empty() != r.password_file.empty()) {
    throw BadValue{"--rdzv-conf user= and password_file= go together"};
  }
  if (r.max_nodes > 1 && o.agent.master_addr != AgentDefaults().master_addr) {
    throw BadValue{
        "--master-addr applies to --rdzv-backend static; with etcd "
        "MASTER_ADDR is group rank 0's address (drop --master-addr, or "
        "set --local-addr on each node)"};
  }
  r.etcd_endpoints.clear();
  for (const std::string& e : r.endpoints) {
    agent::rendezvous::RendezvousOptions one;
    parse_endpoint(e, one);
    const bool port_given = e[0] == '[' ? e.find("]:") != std::string::npos
                                        : e.find(':') != std::string::npos;
    const int port = port_given ? one.endpoint_port : 2379;
    if (port == 0) {
      throw BadValue{"--rdzv-endpoint " + e +
                     ": etcd listens on a fixed port, like 2379"};
    }
    const bool v6 = one.endpoint_host.find(':') != std::string::npos;
    r.etcd_endpoints.push_back(
        (v6 ? "[" + one.endpoint_host + "]" : one.endpoint_host) + ":" +
        std::to_string(port));
  }
}

namespace {

// The agents' store's port, when given, is not the workers' rank 0's.
void check_store_port(const LaunchOptions& o) {
  const auto& r = o.rdzv;
  if (!r.endpoint_host.empty() && r.endpoint_port != 0 &&
      o.agent.master_port == r.endpoint_port) {
    throw BadValue{"--master-port " + std::to_string(o.agent.master_port) +
                   " is the agents' store port (--rdzv-endpoint); the "
                   "workers' rank 0 must bind another: pick a different "
                   "--master-port"};
  }
}

}  // namespace

void check_rendezvous(LaunchOptions& o) {
  agent::rendezvous::RendezvousOptions& r = o.rdzv;
  const std::string nnodes = "--nnodes " + nnodes_text(o.rdzv);
  o.agent.rdzv_timeout = r.join_timeout;
  if (o.standalone && r.max_nodes > 1) {
    throw BadValue{"--standalone runs one node; drop it or use --nnodes 1"};
  }
  // A multi-host head hosts the agents' store (c10d; at --rdzv-endpoint's
  // port when given, else a free one) and numbers the hosts' agents
  // itself; check_hosts() holds --nnodes to its hosts.
  if (!o.hosts.empty() || o.remote.launcher == "slurm") {
    const std::string head =
        "a multi-host head (--hosts, --hostfile, --launcher slurm)";
    if (r.backend == "etcd") {
      throw BadValue{"--rdzv-backend etcd: " + head +
                     " meets its agents in a store of its own; drop "
                     "--rdzv-backend, or start each host's dlaunch yourself "
                     "with the etcd endpoints"};
    }
    if (r.node_rank >= 0) {
      throw BadValue{"--node-rank: " + head +
                     " numbers its hosts' agents itself; drop --node-rank"};
    }
    if (o.agent.master_addr != AgentDefaults().master_addr) {
      throw BadValue{"--master-addr: with " + head +
                     " MASTER_ADDR is group rank 0's address; drop "
                     "--master-addr"};
    }
    if (o.standalone) {
      throw BadValue{"--standalone runs one node, and " + head +
                     " runs one agent per host; keep one"};
    }
    check_etcd(o);
    check_store_port(o);
    return;
  }
  if (o.standalone && !r.endpoint_host.empty()) {
    throw BadValue{
        "--standalone hosts its own store on a free port; drop it or "
        "--rdzv-endpoint"};
  }
  if (r.backend == "static" && r.min_nodes != r.max_nodes) {
    throw BadValue{nnodes +
                   ": the static backend runs a fixed number of nodes; use "
                   "--rdzv-backend c10d for MIN:MAX"};
  }
  if (r.backend == "static" && r.max_nodes > 1 && r.node_rank < 0) {
    throw BadValue{nnodes + " with the static backend needs --node-rank (0.." +
                   std::to_string(r.max_nodes - 1) + ")"};
  }
  if (r.node_rank >= r.max_nodes) {
    throw BadValue{"--node-rank " + std::to_string(r.node_rank) +
                   " is not below " + nnodes + "; use 0.." +
                   std::to_string(r.max_nodes - 1)};
  }
  check_etcd(o);
  if (r.backend == "c10d" && r.node_rank >= 0) {
    throw BadValue{
        "--node-rank applies to --rdzv-backend static; c10d assigns node "
        "ranks itself (drop --node-rank)"};
  }
  if (r.backend == "c10d" && r.max_nodes > 1) {
    if (r.endpoint_host.empty()) {
      throw BadValue{nnodes +
                     " with --rdzv-backend c10d needs --rdzv-endpoint "
                     "HOST[:PORT] (where the agents meet)"};
    }
    if (o.agent.master_addr != AgentDefaults().master_addr) {
      throw BadValue{
          "--master-addr applies to --rdzv-backend static; with c10d "
          "MASTER_ADDR is group rank 0's address (drop --master-addr, or "
          "set --local-addr on each node)"};
    }
  }
  if (r.endpoint_port == 0 && r.max_nodes > 1) {
    throw BadValue{
        "--rdzv-endpoint with port 0 (a free port) works for one node only; "
        "the other nodes need a fixed port like 29400"};
  }
  // Static multi-node: node rank 0 hosts the agents' store at the master
  // address, on 29400 so that MASTER_PORT stays the workers'.
  if (r.endpoint_host.empty() && r.max_nodes > 1) {
    r.endpoint_host = o.agent.master_addr;
  }
  if (r.max_nodes > 1 && r.backend != "etcd") check_store_port(o);
}

void check_hosts(LaunchOptions& o, const agent::EnvMap& env) {
  RemoteOptions& r = o.remote;
  if (!r.hosts_text.empty() && !r.hostfile.empty()) {
    throw BadValue{"--hosts and --hostfile both name the hosts; keep one"};
  }
  if (r.launcher == "slurm") {
    // The allocation's nodes, or the given ones that are in it.
    try {
      o.hosts = slurm_hosts(read_slurm_allocation(env), o.hosts);
    } catch (const HostsError& e) {
      throw BadValue{e.what()};
    }
  }
  if ((!r.include.empty() || !r.exclude.empty()) && o.hosts.empty()) {
    throw BadValue{std::string(r.include.empty() ? "--exclude" : "--include") +
                   " selects among the job's hosts; give them with --hosts "
                   "or --hostfile"};
  }
  try {
    o.hosts = select_hosts(
        std::move(o.hosts),
        r.include.empty() ? std::vector<HostFilter>{}
                          : parse_host_filter(r.include),
        r.exclude.empty() ? std::vector<HostFilter>{}
                          : parse_host_filter(r.exclude),
        // gpu as this machine counted its GPUs (hosts alike); 0 (not
        // known) when it could not, and for auto and cpu, which may count
        // CPUs here.
        o.nproc_per_node_unresolved.empty() && (o.nproc_per_node_spec.empty() ||
                                                o.nproc_per_node_spec == "gpu")
            ? o.agent.nproc_per_node
            : 0);
  } catch (const HostsError& e) {
    throw BadValue{e.what()};
  }
  // Hosts narrowed by name are named hosts (a printed Slurm job keeps them).
  if (!r.include.empty() || !r.exclude.empty()) o.hosts_given = true;
  r.include.clear();
  r.exclude.clear();
  // One agent per host: a fixed --nnodes, when given (1 included), names
  // the hosts' count, and MIN:MAX needs at least MAX hosts.
  const auto& z = o.rdzv;
  const int n = static_cast<int>(o.hosts.size());
  const std::string nnodes = "--nnodes " + nnodes_text(o.rdzv);
  const std::string given =
      std::to_string(n) + (n == 1 ? " host" : " hosts") + " (one agent each)";
  if (n > 0 && o.nnodes_given && z.min_nodes == z.max_nodes &&
      z.max_nodes != n) {
    throw BadValue{nnodes + ": the job has " + given +
                   "; drop --nnodes or name " + std::to_string(z.max_nodes) +
                   (z.max_nodes == 1 ? " host" : " hosts")};
  }
  if (n > 0 && z.max_nodes > n && z.min_nodes != z.max_nodes) {
    throw BadValue{nnodes + ": the job has " + given + ", fewer than MAX " +
                   std::to_string(z.max_nodes) + "; use MIN:MAX with MIN <= " +
                   "MAX <= " + std::to_string(n) + " or name more hosts"};
  }
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else if (quote == '"' && c == '\\' && i + 1 < text.size() &&
                 std::strchr("\\\"$`", text[i + 1])) {
        word += text[++i];
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote) {
    throw BadValue{"'" + text + "' has an unclosed " + std::string(1, quote) +
                   "; close it"};
  }
  if (in_word) words.push_back(std::move(word));
  return words;
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

bool is_rdzv_conf_path(std::string_view key) {
  return key == "token_file" || key == "cacert" || key == "cert" ||
         key == "key" || key == "password_file";
}

bool is_variable_name(std::string_view name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
         });
}

}  // namespace dlaunch::launcher
