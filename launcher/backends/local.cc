// --launcher local: each host's agent is a process on this machine that
// advertises the host's address (loopback "hosts" 127.0.0.x): the same
// paths as ssh without a network, for tests and one machine with several
// addresses.
#include "launcher/backends/backends.h"

namespace dlaunch::launcher::backends {
namespace {

class LocalLauncher : public AgentLauncher {
 public:
  std::vector<AgentCommand> check_commands(
      const LaunchPlan& plan) const override {
    // One machine: one check stands for every host.
    AgentCommand c;
    c.argv = {plan.remote_dlaunch, "--remote-check", plan.program};
    for (const RemoteJob& j : plan.jobs) c.hosts.push_back(j.host);
    return {c};
  }

  std::vector<AgentCommand> start_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    for (const RemoteJob& j : plan.jobs) {
      AgentCommand c;
      c.argv = {plan.remote_dlaunch, "--remote-agent", "--job-tag",
                plan.job_tag};
      c.hosts = {j.host};
      c.stdin_data = encode_remote_job(j);
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<AgentCommand> stop_commands(
      const LaunchPlan& plan) const override {
    AgentCommand c;
    c.argv = {plan.remote_dlaunch, "--remote-stop", plan.job_tag};
    for (const RemoteJob& j : plan.jobs) c.hosts.push_back(j.host);
    return {c};
  }
};

}  // namespace

std::unique_ptr<AgentLauncher> make_local() {
  return std::make_unique<LocalLauncher>();
}

}  // namespace dlaunch::launcher::backends
