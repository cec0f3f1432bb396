// --launcher pdsh: one `pdsh -S -b -f FANOUT -w HOSTS` for all hosts; the
// rcmd module is pdsh's own choice (PDSH_RCMD_TYPE, -R through
// --ssh-args is not used). pdsh gives remote commands no stdin, so every
// host's job goes in one 0600 file placed on the hosts first (written
// directly with the exec module, which runs on this machine; pdcp
// otherwise); each agent takes its own entry by host name and removes the
// file once read. -S: pdsh exits with the largest remote status.
#include "launcher/backends/backends.h"
#include "launcher/ship.h"

namespace dlaunch::launcher::backends {
namespace {

class PdshLauncher : public AgentLauncher {
 public:
  std::vector<AgentCommand> check_commands(
      const LaunchPlan& plan) const override {
    std::vector<AgentCommand> out;
    if (!exec_module(plan)) {
      // Place the job file first (pdcp reaches the same hosts).
      AgentCommand copy;
      copy.argv = {"pdcp",
                   "-f",
                   std::to_string(plan.options.pdsh_fanout),
                   "-w",
                   host_list(plan),
                   local_job_file(plan).string(),
                   job_file(plan).string()};
      copy.hosts = hosts(plan);
      copy.host_prefixed_lines = true;
      copy.local_files[local_job_file(plan)] = all_jobs(plan);
      out.push_back(std::move(copy));
    }
    // check_argv() less its dlaunch, which pdsh() puts first.
    const std::string& first =
        plan.shipped.empty() ? plan.jobs[0].host : plan.shipped.begin()->first;
    std::vector<std::string> check = check_argv(plan, first);
    check.erase(check.begin(),
                check.begin() + static_cast<std::ptrdiff_t>(
                                    dlaunch_argv(plan, first).size()));
    AgentCommand c = pdsh(plan, check);
    // The exec module's "hosts" share this machine's /tmp: one file each.
    if (exec_module(plan)) {
      for (const RemoteJob& j : plan.jobs) {
        c.local_files[job_file(plan, j.host)] = encode_remote_job(j);
      }
    }
    out.push_back(std::move(c));
    return out;
  }

  std::vector<AgentCommand> start_commands(
      const LaunchPlan& plan) const override {
    // The exec module substitutes %h; over ssh the agent finds its entry
    // by its own names.
    if (exec_module(plan)) {
      return {
          pdsh(plan, {"--remote-agent", "--job-tag", plan.job_tag, "--job-file",
                      job_file(plan, "%h").string(), "--host", "%h"})};
    }
    return {pdsh(plan, {"--remote-agent", "--job-tag", plan.job_tag,
                        "--job-file", job_file(plan).string()})};
  }

  std::vector<AgentCommand> stop_commands(
      const LaunchPlan& plan) const override {
    return {
        pdsh(plan, {"--remote-stop", plan.job_tag, "--job-file",
                    job_file(plan, exec_module(plan) ? "%h" : "").string()})};
  }

  // The exec module's hosts are this machine: a local copy each. Over a
  // network pdsh gives remote commands no stdin to copy through.
  std::vector<AgentCommand> ship_commands(
      const LaunchPlan& plan) const override {
    if (!exec_module(plan)) return {};
    return local_ship_commands(plan);
  }

  bool head_agent_in_process() const override { return true; }

 private:
  static bool exec_module(const LaunchPlan& plan) {
    auto it = plan.head_env.find("PDSH_RCMD_TYPE");
    return it != plan.head_env.end() && it->second == "exec";
  }

  static std::vector<std::string> hosts(const LaunchPlan& plan) {
    std::vector<std::string> out;
    for (const RemoteJob& j : plan.jobs) out.push_back(j.host);
    return out;
  }

  static std::string host_list(const LaunchPlan& plan) {
    std::string out;
    for (const RemoteJob& j : plan.jobs) {
      out += (out.empty() ? "" : ",") + j.host;
    }
    return out;
  }

  static std::string all_jobs(const LaunchPlan& plan) {
    return encode_remote_jobs(plan.jobs);
  }

  // Where each host finds the job: /tmp, named by the job's tag (and the
  // host, when the hosts share this machine).
  static std::filesystem::path job_file(const LaunchPlan& plan,
                                        const std::string& host = "") {
    return "/tmp/" + plan.job_tag + (host.empty() ? "" : "-" + host) + ".job";
  }
  static std::filesystem::path local_job_file(const LaunchPlan& plan) {
    return plan.staging_dir / "job";
  }

  // `pdsh ... DLAUNCH ARGS...`: one command reaches every host, so a
  // cached copy (the exec module's hosts share this machine's cache)
  // stands for all.
  static AgentCommand pdsh(const LaunchPlan& plan,
                           std::vector<std::string> args) {
    std::vector<std::string> remote =
        plan.shipped.empty() ? std::vector<std::string>{plan.remote_dlaunch}
                             : dlaunch_argv(plan, plan.shipped.begin()->first);
    remote.insert(remote.end(), args.begin(), args.end());
    // Over a network pdsh joins the words for the remote shell, which
    // splits them again: each goes quoted (the exec module keeps words).
    if (!exec_module(plan)) {
      for (std::string& w : remote) w = shell_command({w});
    }
    AgentCommand c;
    c.argv = {"pdsh",
              "-S",
              "-b",
              "-f",
              std::to_string(plan.options.pdsh_fanout),
              "-w",
              host_list(plan)};
    c.argv.insert(c.argv.end(), remote.begin(), remote.end());
    c.hosts = hosts(plan);
    c.host_prefixed_lines = true;
    return c;
  }
};

}  // namespace

std::unique_ptr<AgentLauncher> make_pdsh() {
  return std::make_unique<PdshLauncher>();
}

}  // namespace dlaunch::launcher::backends
