// --launcher local: each host's agent is a process on this machine that
// advertises the host's address (loopback "hosts" 127.0.0.x): the same
// paths as ssh without a network, for tests and one machine with several
// addresses.
#include <algorithm>

#include "launcher/backends/backends.h"
#include "launcher/ship.h"

namespace dlaunch::launcher::backends {
namespace {

class LocalLauncher : public AgentLauncher {
 public:
  std::vector<AgentCommand> check_commands(
      const LaunchPlan& plan) const override {
    // One machine: one check stands for every host that shares a dlaunch
    // (a shipped copy checks itself).
    std::vector<AgentCommand> out;
    for (const RemoteJob& j : plan.jobs) {
      std::vector<std::string> argv = check_argv(plan, j.host);
      auto same = std::find_if(out.begin(), out.end(),
                               [&](const auto& c) { return c.argv == argv; });
      if (same != out.end()) {
        same->hosts.push_back(j.host);
        continue;
      }
      AgentCommand c;
      c.argv = std::move(argv);
      c.hosts = {j.host};
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<AgentCommand> start_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    for (const RemoteJob& j : plan.jobs) {
      AgentCommand c;
      c.argv = dlaunch_argv(plan, j.host);
      c.argv.insert(c.argv.end(),
                    {"--remote-agent", "--job-tag", plan.job_tag});
      c.hosts = {j.host};
      c.stdin_data = encode_remote_job(j);
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<AgentCommand> stop_commands(
      const LaunchPlan& plan) const override {
    // Any host's dlaunch stops the job on this one machine.
    AgentCommand c;
    for (const RemoteJob& j : plan.jobs) c.hosts.push_back(j.host);
    c.argv = c.hosts.empty() ? std::vector<std::string>{plan.remote_dlaunch}
                             : dlaunch_argv(plan, c.hosts[0]);
    c.argv.insert(c.argv.end(), {"--remote-stop", plan.job_tag});
    return {c};
  }

  std::vector<AgentCommand> ship_commands(
      const LaunchPlan& plan) const override {
    return local_ship_commands(plan);
  }

  bool head_agent_in_process() const override { return true; }
};

}  // namespace

std::vector<AgentCommand> local_ship_commands(const LaunchPlan& plan) {
  std::vector<AgentCommand> out;
  for (const auto& [host, path] : plan.shipped) {
    for (const auto& [from, to] : shipped_files(plan, host)) {
      AgentCommand c;
      c.argv = {"sh", "-c", ship_script(plan.ship_cache, to)};
      c.hosts = {host};
      c.stdin_file = from;
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::unique_ptr<AgentLauncher> make_local() {
  return std::make_unique<LocalLauncher>();
}

}  // namespace dlaunch::launcher::backends
