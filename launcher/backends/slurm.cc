// --launcher slurm: inside an allocation, one `srun` step with one task
// per node runs every node's agent, the head's node included (each agent
// is a task of the job, on its resources). srun hands every task the
// same stdin (--input=all): the head writes all nodes' jobs there and
// each agent takes its own by SLURMD_NODENAME; stdin then stays open and
// its end stops the agents. --label numbers each line by task, and with
// one task per node task N runs on the step's N-th node in Slurm's order,
// the order of LaunchPlan::jobs (launcher/slurm.h). --overlap: the check
// and stop steps run beside the agents' step (which holds every CPU of
// the job on its nodes), and a head that is itself an srun task can
// start steps at all.
#include "launcher/backends/backends.h"

namespace dlaunch::launcher::backends {
namespace {

class SlurmLauncher : public AgentLauncher {
 public:
  std::vector<AgentCommand> check_commands(
      const LaunchPlan& plan) const override {
    // One check for every node (a step's tasks share the head's folder).
    return {srun(plan, check_argv(plan, plan.jobs.at(0).host))};
  }

  std::vector<AgentCommand> start_commands(
      const LaunchPlan& plan) const override {
    AgentCommand c = srun(plan, {plan.remote_dlaunch, "--remote-agent",
                                 "--job-tag", plan.job_tag, "--slurm-task"});
    c.argv.insert(c.argv.begin() + 1, "--input=all");
    c.stdin_data = encode_remote_jobs(plan.jobs);
    return {c};
  }

  std::vector<AgentCommand> stop_commands(
      const LaunchPlan& plan) const override {
    return {srun(plan, {plan.remote_dlaunch, "--remote-stop", plan.job_tag})};
  }

  bool head_agent_in_process() const override { return false; }

 private:
  static AgentCommand srun(const LaunchPlan& plan,
                           const std::vector<std::string>& remote) {
    AgentCommand c;
    const std::string n = std::to_string(plan.jobs.size());
    std::string nodes;
    for (const RemoteJob& j : plan.jobs) {
      nodes += (nodes.empty() ? "" : ",") + j.host;
      c.hosts.push_back(j.host);
    }
    // --ntasks too: a SLURM_NTASKS of the allocation's (salloc -n) would
    // otherwise ask for more tasks than nodes.
    c.argv = {"srun",
              "--nodes=" + n,
              "--ntasks=" + n,
              "--ntasks-per-node=1",
              "--nodelist=" + nodes,
              "--overlap",
              "--label",
              "--kill-on-bad-exit=0"};
    c.argv.insert(c.argv.end(), remote.begin(), remote.end());
    c.task_labelled_lines = true;
    // The head stops the job its way on Ctrl-C; srun, which takes a
    // terminal's SIGINT as "print the tasks' state", never sees it.
    c.own_process_group = true;
    return c;
  }
};

}  // namespace

std::unique_ptr<AgentLauncher> make_slurm() {
  return std::make_unique<SlurmLauncher>();
}

}  // namespace dlaunch::launcher::backends
