// --launcher ssh: one ssh connection per host, non-interactive
// (BatchMode=yes: a missing key fails at once instead of asking), with a
// connect timeout. The job, its environment and token go on the
// connection's stdin, which stays open: its end stops the remote agent.
#include "launcher/backends/backends.h"
#include "launcher/ship.h"

namespace dlaunch::launcher::backends {
namespace {

class SshLauncher : public AgentLauncher {
 public:
  std::vector<AgentCommand> check_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    for (const RemoteJob& j : plan.jobs) {
      out.push_back(command(plan, j.host, check_argv(plan, j.host)));
    }
    return out;
  }

  std::vector<AgentCommand> start_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    for (const RemoteJob& j : plan.jobs) {
      std::vector<std::string> argv = dlaunch_argv(plan, j.host);
      argv.insert(argv.end(), {"--remote-agent", "--job-tag", plan.job_tag});
      AgentCommand c = command(plan, j.host, argv);
      c.stdin_data = encode_remote_job(j);
      out.push_back(std::move(c));
    }
    return out;
  }

  std::vector<AgentCommand> stop_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    for (const RemoteJob& j : plan.jobs) {
      std::vector<std::string> argv = dlaunch_argv(plan, j.host);
      argv.insert(argv.end(), {"--remote-stop", plan.job_tag});
      out.push_back(command(plan, j.host, argv));
    }
    return out;
  }

  // Over the same kind of connection: `cat` into the host's cache.
  std::vector<AgentCommand> ship_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    for (const auto& [host, path] : plan.shipped) {
      for (const auto& [from, to] : shipped_files(plan, host)) {
        AgentCommand c =
            command(plan, host, {"sh", "-c", ship_script(plan.ship_cache, to)});
        c.stdin_file = from;
        out.push_back(std::move(c));
      }
    }
    return out;
  }

  bool head_agent_in_process() const override { return true; }

 private:
  static AgentCommand command(const LaunchPlan& plan, const std::string& host,
                              const std::vector<std::string>& remote) {
    const RemoteOptions& o = plan.options;
    AgentCommand c;
    c.hosts = {host};
    auto seconds = std::chrono::ceil<std::chrono::seconds>(o.connect_timeout);
    c.argv = {"ssh",
              "-o",
              "BatchMode=yes",
              "-o",
              "ConnectTimeout=" + std::to_string(seconds.count()),
              "-T"};
    if (o.ssh_port > 0) {
      c.argv.insert(c.argv.end(), {"-p", std::to_string(o.ssh_port)});
    }
    c.argv.insert(c.argv.end(), o.ssh_args.begin(), o.ssh_args.end());
    c.argv.push_back(host);
    c.argv.push_back("exec " + shell_command(remote));
    return c;
  }
};

}  // namespace

std::unique_ptr<AgentLauncher> make_ssh() {
  return std::make_unique<SshLauncher>();
}

}  // namespace dlaunch::launcher::backends
