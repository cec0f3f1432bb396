#include "launcher/launcher.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <variant>

#include "agent/agent.h"
#include "agent/posix_env.h"
#include "agent/rendezvous/static_rendezvous.h"
#include "comm/store/server.h"
#include "launcher/cli.h"
#include "launcher/job_print.h"

namespace dlaunch::launcher {
namespace {

void write_stderr(const std::string& s) { agent::write_all(STDERR_FILENO, s); }

// Why this version cannot run the job's hosts; nullopt when it can (none
// given, or only this node with slots agreeing with nproc_per_node).
std::optional<std::string> unsupported_hosts(const LaunchOptions& o) {
  if (o.hosts.empty()) return std::nullopt;
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  const Host& h = o.hosts[0];
  bool local =
      h.name == "localhost" || h.name.rfind("127.", 0) == 0 || h.name == name;
  if (o.hosts.size() > 1 || !local) {
    return "hosts: " + std::to_string(o.hosts.size()) +
           " host(s) starting with '" + h.name +
           "': multi-node launch is not implemented yet; this version runs "
           "on this node only (hosts: [localhost] or no hosts key); "
           "--dry-run shows the plan";
  }
  if (h.slots > 0 && h.slots != o.agent.nproc_per_node) {
    return "hosts: " + h.name + ":" + std::to_string(h.slots) + " asks for " +
           std::to_string(h.slots) + " workers but nproc_per_node is " +
           std::to_string(o.agent.nproc_per_node) + "; make them agree";
  }
  return std::nullopt;
}

// A fresh run id (TORCHELASTIC_RUN_ID): 12 random hex digits.
std::string random_run_id() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%012llx",
                static_cast<unsigned long long>(
                    ((uint64_t{rd()} << 32) | rd()) & 0xffffffffffffULL));
  return buf;
}

// LOG_DIR/RUN_ID/job.yaml: the effective job, so `dlaunch --config` on it
// reruns the job into a fresh log folder. A failure is reported, not fatal.
void write_job_yaml(const LaunchOptions& o) {
  std::filesystem::path dir = o.agent.log_dir / o.agent.run_id;
  std::filesystem::path file = dir / "job.yaml";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream out(file);
  out << job_yaml(o, /*with_run_id=*/false);
  out.close();
  if (ec || !out) {
    write_stderr("dlaunch: warning: cannot write " + file.string() + ": " +
                 (ec ? ec.message() : std::string(std::strerror(errno))) +
                 "; the job runs without it\n");
  }
}

}  // namespace

int launch(const LaunchOptions& job) {
  LaunchOptions options = job;
  if (!options.agent.log_dir.empty()) {
    if (options.agent.run_id.empty()) options.agent.run_id = random_run_id();
    write_job_yaml(options);
  }
  agent::PosixEnv env;  // first: it records the limits workers get
  // --standalone: this node hosts the rendezvous store on torchrun's
  // localhost:0 endpoint. Workers do not use it
  // (TORCHELASTIC_USE_AGENT_STORE=False: rank 0 serves theirs).
  std::unique_ptr<comm::store::StoreServer> store;
  if (options.standalone) {
    try {
      store = comm::store::StoreServer::start({.host = "127.0.0.1", .port = 0});
    } catch (const std::exception& e) {
      throw std::runtime_error(
          std::string("--standalone: cannot host the rendezvous store: ") +
          e.what());
    }
  }
  env.set_drain_timeout(options.agent.drain_timeout);
  agent::rendezvous::StaticRendezvous rdzv(
      options.agent.master_addr, options.agent.master_port,
      [&env](const std::string& host) { return env.free_port(host); });
  // Workers inherit dlaunch's environment with the job's env map on top.
  agent::EnvMap base = agent::current_environment();
  for (const auto& [name, value] : options.env) base[name] = value;
  // The agent's messages queue behind the workers' lines: a stalled or
  // vanished console never blocks or kills the agent.
  agent::Agent agent(options.agent, env, rdzv, std::move(base),
                     [&env](const std::string& s) { env.write_console(2, s); });
  return agent.run().exit_code;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
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
      agent::write_all(STDOUT_FILENO, dry_run_plan(options));
      return 0;
    case LaunchOptions::Mode::kRun:
      break;
  }
  if (auto why = unsupported_hosts(options)) {
    write_stderr("dlaunch: " + *why + "\n");
    return 2;
  }
  if (!options.faults.empty()) {
    write_stderr("dlaunch: note: " + options.config_file.string() + ": " +
                 std::to_string(options.faults.size()) +
                 " faults entries are not applied yet (reserved for failure "
                 "injection)\n");
  }
  try {
    return launch(options);
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 1;
  }
}

}  // namespace dlaunch::launcher
