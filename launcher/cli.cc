#include "launcher/cli.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <thread>

#include "agent/posix_env.h"

namespace dlaunch::launcher {
namespace {

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

// A flag or value we reject; caught in parse_command_line.
struct Bad {
  std::string message;
};

template <typename T>
bool parse_number(const std::string& s, T& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

int parse_int_flag(const std::string& flag, const std::string& v, int lo,
                   int hi, const std::string& forms) {
  int n = 0;
  if (!parse_number(v, n) || n < lo || n > hi) {
    throw Bad{flag + ": '" + v + "' is not valid; use " + forms};
  }
  return n;
}

double parse_seconds(const std::string& flag, const std::string& v,
                     bool allow_zero) {
  double d = 0;
  if (!parse_number(v, d) || d < 0 || (!allow_zero && d == 0)) {
    throw Bad{flag + ": '" + v + "' is not valid; use a number of seconds " +
              (allow_zero ? ">= 0" : "> 0") + " like 0.5 or 30"};
  }
  return d;
}

int resolve_nproc(const std::string& v, const agent::EnvMap& env) {
  if (v == "cpu") {
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  auto gpus = [&] {
    try {
      return cuda_device_count(env);
    } catch (const std::exception& e) {
      throw Bad{"--nproc-per-node " + v + ": " + e.what()};
    }
  };
  if (v == "gpu") {
    int n = gpus();
    if (n == 0) {
      throw Bad{
          "--nproc-per-node gpu: no CUDA device is visible; use a "
          "number, cpu or auto"};
    }
    return n;
  }
  if (v == "auto") {
    int n = gpus();
    return n > 0 ? n
                 : static_cast<int>(
                       std::max(1u, std::thread::hardware_concurrency()));
  }
  return parse_int_flag("--nproc-per-node", v, 1, 1 << 16,
                        "a positive number, cpu, gpu or auto");
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

std::vector<int> parse_signals(const std::string& v) {
  static const std::pair<const char*, int> kKnown[] = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},   {"SIGHUP", SIGHUP},
      {"SIGQUIT", SIGQUIT}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  std::vector<int> out;
  for (const std::string& name : split(v, ',')) {
    int sig = 0;
    for (const auto& [n, s] : kKnown) {
      if (name == n) sig = s;
    }
    if (sig == 0) {
      throw Bad{"--signals-to-handle: '" + name +
                "' is not valid; use a comma-separated list of SIGTERM, "
                "SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2"};
    }
    out.push_back(sig);
  }
  return out;
}

agent::StreamsSpec parse_streams_flag(const std::string& flag,
                                      const std::string& v) {
  try {
    return agent::parse_streams(v);
  } catch (const std::invalid_argument& e) {
    throw Bad{flag + ": " + e.what()};
  }
}

// One command-line option taken as text; PET_<NAME> fills it when absent.
struct Flag {
  CLI::Option* opt = nullptr;
  std::string pet;
  std::string value;
  bool given = false;
};

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
  if (code != 0 || !parse_number(text, n) || n < 0) {
    throw std::runtime_error("cannot count CUDA devices: " + helper.string() +
                             " exited with " + std::to_string(code) +
                             " and printed '" + text + "'");
  }
  return n;
}

ParseResult parse_command_line(const std::vector<std::string>& args,
                               const agent::EnvMap& env) {
  CLI::App app("dlaunch", "dlaunch");
  app.set_help_flag();   // our own --help text
  app.prefix_command();  // everything after PROG belongs to PROG
  app.allow_extras();

  bool help = false;
  app.add_flag("-h,--help", help);
  std::map<std::string, Flag> f;
  // `key` is the flag's dash name; its variable is PET_KEY_IN_CAPITALS.
  auto register_flag = [&](const std::string& key, CLI::Option* o) {
    Flag& fl = f[key];
    fl.opt = o;
    fl.pet = "PET_" + key;
    for (char& c : fl.pet)
      c = c == '-' ? '_' : static_cast<char>(std::toupper(c));
  };
  auto opt = [&](const std::string& key, const std::string& names) {
    register_flag(key, app.add_option(names, f[key].value));
  };
  auto flag = [&](const std::string& key, const std::string& names) {
    register_flag(key, app.add_flag(names));
  };
  opt("nnodes", "--nnodes");
  opt("nproc-per-node", "--nproc-per-node,--nproc_per_node");
  opt("node-rank", "--node-rank,--node_rank");
  opt("rdzv-backend", "--rdzv-backend,--rdzv_backend");
  opt("rdzv-endpoint", "--rdzv-endpoint,--rdzv_endpoint");
  opt("rdzv-id", "--rdzv-id,--rdzv_id,--run-id,--run_id");
  opt("rdzv-conf", "--rdzv-conf,--rdzv_conf");
  flag("standalone", "--standalone");
  opt("max-restarts", "--max-restarts,--max_restarts");
  opt("monitor-interval", "--monitor-interval,--monitor_interval");
  opt("start-method", "--start-method,--start_method");
  opt("role", "--role");
  flag("module", "-m,--module");
  flag("no-python", "--no-python,--no_python");
  opt("python", "--python");
  opt("log-dir", "--log-dir,--log_dir");
  opt("redirects", "-r,--redirects");
  opt("tee", "-t,--tee");
  opt("local-ranks-filter", "--local-ranks-filter,--local_ranks_filter");
  opt("master-addr", "--master-addr,--master_addr");
  opt("master-port", "--master-port,--master_port");
  opt("term-timeout", "--term-timeout,--term_timeout");
  opt("signals-to-handle", "--signals-to-handle,--signals_to_handle");

  // CLI11 wants argv order reversed in a vector<string>.
  std::vector<std::string> rev(args.rbegin(), args.rend());
  try {
    app.parse(rev);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    if (msg.find('\n') != std::string::npos)
      msg = msg.substr(0, msg.find('\n'));
    return UsageError{"dlaunch: " + msg +
                      "; run 'dlaunch --help' for the valid forms"};
  }
  if (help) return HelpRequested{};

  for (auto& [key, fl] : f) {
    fl.given = fl.opt->count() > 0;
    if (fl.given) {
      if (fl.value.empty() && fl.opt->get_expected_min() == 0) fl.value = "1";
      continue;
    }
    auto it = env.find(fl.pet);
    if (it != env.end()) {
      fl.value = it->second;
      fl.given = true;
    }
  }
  auto given = [&](const char* k) { return f[k].given; };
  auto value = [&](const char* k) -> const std::string& { return f[k].value; };
  auto truthy = [&](const char* k) {
    const std::string& v = value(k);
    return given(k) && v != "0" && v != "false" && v != "False" && v != "";
  };

  std::vector<std::string> rest = app.remaining();
  const bool separated = !rest.empty() && rest[0] == "--";
  if (separated) rest.erase(rest.begin());
  if (!separated && !rest.empty() && rest[0].size() > 1 && rest[0][0] == '-') {
    return UsageError{"dlaunch: unknown option '" + rest[0] +
                      "'; run 'dlaunch --help' for the valid options"};
  }
  if (rest.empty()) {
    return UsageError{
        "dlaunch: no program given; usage: dlaunch [options] "
        "PROG [ARGS...] (see 'dlaunch --help')"};
  }

  LaunchOptions o;
  try {
    o.program = rest[0];
    o.program_args.assign(rest.begin() + 1, rest.end());
    if (given("nnodes")) {
      const std::string& v = value("nnodes");
      if (v != "1" && v != "1:1") {
        throw Bad{"--nnodes: '" + v +
                  "' is not supported yet; this version runs one node (use "
                  "--nnodes 1)"};
      }
    }
    if (given("node-rank")) {
      o.node_rank = parse_int_flag("--node-rank", value("node-rank"), 0, 0,
                                   "0 (one node)");
    }
    if (given("rdzv-backend")) {
      const std::string& v = value("rdzv-backend");
      if (v != "static" && v != "c10d") {
        throw Bad{"--rdzv-backend: '" + v +
                  "' is not valid; use static or c10d"};
      }
      o.rdzv_backend = v;
    }
    if (given("rdzv-endpoint")) {
      const std::string& v = value("rdzv-endpoint");
      size_t colon = v.rfind(':');
      if (v.empty() || colon == 0) {
        throw Bad{"--rdzv-endpoint: '" + v +
                  "' is not valid; use HOST or HOST:PORT"};
      }
      if (colon != std::string::npos) {
        parse_int_flag("--rdzv-endpoint", v.substr(colon + 1), 0, 65535,
                       "HOST or HOST:PORT with a port 0..65535");
      }
      o.rdzv_endpoint = v;
    }
    o.standalone = truthy("standalone") || o.rdzv_endpoint.empty();
    if (given("rdzv-id")) o.agent.run_id = value("rdzv-id");
    if (given("nproc-per-node")) {
      o.agent.nproc_per_node = resolve_nproc(value("nproc-per-node"), env);
    }
    if (given("max-restarts")) {
      o.agent.max_restarts = parse_int_flag(
          "--max-restarts", value("max-restarts"), 0, 1 << 20, "a number >= 0");
    }
    if (given("monitor-interval")) {
      o.monitor_interval_s =
          parse_seconds("--monitor-interval", value("monitor-interval"), true);
    }
    if (given("start-method")) {
      const std::string& v = value("start-method");
      if (v != "spawn" && v != "fork" && v != "forkserver") {
        throw Bad{"--start-method: '" + v +
                  "' is not valid; use spawn, fork or forkserver (all start "
                  "workers the same way in dlaunch)"};
      }
    }
    if (given("role")) {
      if (value("role").empty()) throw Bad{"--role: must not be empty"};
      o.agent.role = value("role");
    }
    o.module = truthy("module");
    o.no_python = truthy("no-python");
    if (o.module && o.no_python) {
      throw Bad{"--module and --no-python cannot be used together; drop one"};
    }
    if (given("python")) {
      o.python = value("python");
    } else if (auto it = env.find("PYTHON");
               it != env.end() && !it->second.empty()) {
      o.python = it->second;
    }
    if (given("log-dir")) o.agent.log_dir = value("log-dir");
    if (given("redirects")) {
      o.agent.redirects = parse_streams_flag("--redirects", value("redirects"));
    }
    if (given("tee")) o.agent.tee = parse_streams_flag("--tee", value("tee"));
    if (given("local-ranks-filter")) {
      std::set<int> ranks;
      for (const std::string& r : split(value("local-ranks-filter"), ',')) {
        ranks.insert(parse_int_flag("--local-ranks-filter", r, 0, 1 << 16,
                                    "comma-separated local ranks like 0,2"));
      }
      o.agent.local_ranks_filter = std::move(ranks);
    }
    if (given("master-addr")) {
      if (value("master-addr").empty())
        throw Bad{"--master-addr: must not be empty"};
      o.agent.master_addr = value("master-addr");
    }
    if (given("master-port")) {
      o.agent.master_port = parse_int_flag(
          "--master-port", value("master-port"), 0, 65535, "a port 0..65535");
    }
    if (given("term-timeout")) {
      o.agent.term_timeout = std::chrono::milliseconds(static_cast<int64_t>(
          parse_seconds("--term-timeout", value("term-timeout"), false) * 1e3));
    }
    if (given("signals-to-handle")) {
      o.agent.signals_to_handle = parse_signals(value("signals-to-handle"));
    }
  } catch (const Bad& b) {
    return UsageError{"dlaunch: " + b.message};
  }

  // The worker command.
  bool python =
      !o.no_python &&
      (o.module || (o.program.size() > 3 &&
                    o.program.compare(o.program.size() - 3, 3, ".py") == 0));
  std::vector<std::string>& cmd = o.agent.entrypoint;
  if (python) {
    if (!o.module && ::access(o.program.c_str(), R_OK) != 0) {
      return UsageError{"dlaunch: '" + o.program +
                            "': " + std::strerror(errno) +
                            " (the script to run under " + o.python + ")",
                        127};
    }
    cmd = {o.python, "-u"};
    if (o.module) cmd.push_back("-m");
  }
  cmd.push_back(o.program);
  cmd.insert(cmd.end(), o.program_args.begin(), o.program_args.end());
  return o;
}

}  // namespace dlaunch::launcher
