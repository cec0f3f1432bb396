#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/launch_options.h"
#include "launcher/remote_job.h"

namespace dlaunch::launcher {

// What a backend needs to start, check and stop the agents of one job on
// its remote hosts. The head fills it once; plain data.
struct LaunchPlan {
  // One job per remote host, in host order (RemoteJob::host names it).
  std::vector<RemoteJob> jobs;
  // dlaunch's path on every host.
  std::string remote_dlaunch;
  // The job's program as the remote agents will look it up (pre-flight).
  std::string program;
  // --ssh-port, --ssh-args, --connect-timeout, --pdsh-fanout, ...
  RemoteOptions options;
  // Job-unique, non-secret id: teardown stops the processes carrying it.
  std::string job_tag;
  // A 0600 folder of the head's for files a backend hands to its hosts
  // (pdsh's job file); removed at the end.
  std::filesystem::path staging_dir;
  // The head's environment (PDSH_RCMD_TYPE, SSH_AUTH_SOCK, PATH).
  std::map<std::string, std::string> head_env;
  // The hosts that run the head's own dlaunch from their per-user cache
  // (they lacked a usable one at remote_dlaunch): host -> the copy's path
  // as their shell expands it (ship.h). Empty (default): every host uses
  // remote_dlaunch.
  std::map<std::string, std::string> shipped;
  // The head's dlaunch, its checksum (ship.h), its dlaunch-cuda-devices
  // and dlaunch-watchdog (empty when the head has none) and their cache
  // folder's name, for ship_commands(); set when shipping.
  std::filesystem::path ship_from, ship_cuda_devices_from, ship_watchdog_from;
  std::string ship_checksum, ship_cache;
};

// dlaunch's path on `host`, for messages: its cached copy, else
// plan.remote_dlaunch.
const std::string& dlaunch_on(const LaunchPlan& plan, const std::string& host);

// The argv that runs dlaunch on `host` (its arguments follow):
// {plan.remote_dlaunch}, or for a cached copy ship.h's cached_dlaunch_argv().
std::vector<std::string> dlaunch_argv(const LaunchPlan& plan,
                                      const std::string& host);

// The pre-flight's remote command on `host`: `DLAUNCH --remote-check
// PROGRAM`, `--chdir DIR` when its job has one (the program is looked for
// there, as its agent will), and for a shipped copy `--checksum SUM` (the
// copy checks itself).
std::vector<std::string> check_argv(const LaunchPlan& plan,
                                    const std::string& host);

// One process the head runs on its own machine to reach some hosts:
// `ssh HOST dlaunch --remote-agent`, one `pdsh -w HOSTS ...`, `srun ...`.
struct AgentCommand {
  // argv[0] looked up in PATH; it runs in the head's environment.
  std::vector<std::string> argv;
  // The hosts it reaches; its output is theirs.
  std::vector<std::string> hosts;
  // Written to its stdin first (the job); stdin then stays open while the
  // head runs, so that its end tells the agent the head is gone. Empty:
  // stdin is /dev/null.
  std::string stdin_data;
  // Instead of stdin_data: a file of the head's that is the command's
  // stdin, opened for it and never read into the head's memory; stdin
  // ends with the file (shipping dlaunch: `cat > PATH` there). Empty: none.
  std::filesystem::path stdin_file;
  // Its output lines start with "HOST: " (pdsh): the head takes the host
  // from there. Otherwise every line is hosts[0]'s.
  bool host_prefixed_lines = false;
  // Its output lines start with "N: " (srun --label, spaces before N
  // allowed): they are hosts[N]'s.
  bool task_labelled_lines = false;
  // It runs in a process group of its own, out of reach of the signals a
  // terminal sends the head's group (Ctrl-C): the head stops it.
  bool own_process_group = false;
  // Files the head writes first (pdsh's exec module runs on this machine:
  // its job file is placed directly), path -> contents, mode 0600.
  std::map<std::filesystem::path, std::string> local_files;
};

// How the head reaches the hosts of a job (--launcher). A backend only
// builds commands: the head (launcher/multi_host.cc) runs them, reads
// their output, watches their exits and tears them down, so backends
// share one tested runner and can be unit-tested as text. Implementations
// live in launcher/backends/, one file each, listed in backends.cc.
class AgentLauncher {
 public:
  virtual ~AgentLauncher() = default;
  // Pre-flight, every host at once: each host's `dlaunch --remote-check`
  // prints one line (remote_check.h) saying whether dlaunch runs there
  // and the program is found. Run to the end before anything starts.
  virtual std::vector<AgentCommand> check_commands(
      const LaunchPlan& plan) const = 0;
  // Starts one agent per host (`dlaunch --remote-agent`), each reading its
  // RemoteJob from stdin or a 0600 file.
  virtual std::vector<AgentCommand> start_commands(
      const LaunchPlan& plan) const = 0;
  // Teardown: `dlaunch --remote-stop TAG` on every host, which stops the
  // processes carrying the job's tag (and removes its job files). Run when
  // the job ends early or the head is interrupted.
  virtual std::vector<AgentCommand> stop_commands(
      const LaunchPlan& plan) const = 0;
  // Shipping: copies plan.ship_from into the cache folder
  // plan.ship_cache on each host of plan.shipped (and
  // its helper programs beside it, ship.h names them), each copy through
  // ship_script() with the file on stdin. A
  // backend that cannot (pdsh over a network gives remote commands no
  // stdin) returns none, and the pre-flight table says so.
  virtual std::vector<AgentCommand> ship_commands(const LaunchPlan&) const {
    return {};
  }
  // Whether the head runs its own machine's agent in-process when that
  // machine is one of the hosts (ssh, pdsh, local); false: the backend
  // starts every host's agent, the head's machine's too (slurm: each
  // agent is a task of the allocation, on its resources).
  virtual bool head_agent_in_process() const = 0;
};

// The backend called `name` ("ssh", "pdsh", "slurm", "local"); nullptr
// for none.
std::unique_ptr<AgentLauncher> make_agent_launcher(std::string_view name);

// The names make_agent_launcher() knows, for messages.
std::vector<std::string_view> agent_launcher_names();

// The remote command line `dlaunch ARGS...` as one shell word list (ssh
// and pdsh hand the remote shell one string): each word single-quoted
// when it needs it.
std::string shell_command(const std::vector<std::string>& argv);

}  // namespace dlaunch::launcher
