#include "launcher/launcher.h"

#include <unistd.h>

#include <stdexcept>
#include <string>
#include <variant>

#include "agent/agent.h"
#include "agent/posix_env.h"
#include "agent/rendezvous/static_rendezvous.h"
#include "comm/store/server.h"
#include "launcher/cli.h"

namespace dlaunch::launcher {
namespace {

void write_stderr(const std::string& s) { agent::write_all(STDERR_FILENO, s); }

}  // namespace

int launch(const LaunchOptions& options) {
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
  // The agent's messages queue behind the workers' lines: a stalled or
  // vanished console never blocks or kills the agent.
  agent::Agent agent(options.agent, env, rdzv, agent::current_environment(),
                     [&env](const std::string& s) { env.write_console(2, s); });
  return agent.run().exit_code;
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  ParseResult parsed = parse_command_line(args, agent::current_environment());
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
  try {
    return launch(std::get<LaunchOptions>(parsed));
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 1;
  }
}

}  // namespace dlaunch::launcher
