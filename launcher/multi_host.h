#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "launcher/agent_launcher.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// Where a job's hosts run their agents, decided once for the launcher and
// launch_hosts alike: each host name is resolved at most once, since two
// DNS answers for one name may disagree.
struct HostPlan {
  // Whether `options` is the head's job (launch_hosts): more than one
  // host, a host other than this machine, or a backend that starts every
  // host's agent itself (slurm).
  bool needs_head = false;
  // The index in options.hosts of the host whose agent the head runs
  // in-process: the first that names this machine, with a backend that
  // allows it. None: the backend starts every host's agent.
  std::optional<size_t> in_process;
};

// The plan of options.hosts. `is_here` (default: names_this_machine with
// --local-addr, 127.0.0.1 and ::1 the only loopback addresses of this
// machine, each lookup bounded by --connect-timeout: throws LookupTimeout)
// is asked about each host in order until one names this machine, and
// only when the backend may run that agent in-process.
HostPlan plan_hosts(
    const LaunchOptions& options,
    const std::function<bool(const std::string&)>& is_here = nullptr);

// Runs `options` over options.hosts from this machine, the head: hosts
// the agents' store (c10d rendezvous) and generates the job's token and
// tag; checks every other host at once (pre-flight: reachable, dlaunch
// runs, the program is found; all failures in one table, nothing
// started); starts one agent per host through the --launcher backend
// (agent_launcher.h) and runs this machine's own agent in-process when it
// is one of the hosts; shows every host's lines with its name; on Ctrl-C
// or a failed host stops every host's agent by the job's tag. Returns the
// exit code: this host's agent's when it failed, else the largest of the
// other hosts'. `hosts` is plan_hosts(options)'s.
int launch_hosts(const LaunchOptions& options, const HostPlan& hosts);

// The variables every host's agent gets on top of its own environment:
// PATH, LD_LIBRARY_PATH and the NCCL_ CUDA_ GLOO_ OMP_ PYTHON DLAUNCH_
// TORCH variables of `head_env`, then --env-file's, then --export's, then
// the job file's env map; never the head's DLAUNCH_FAULTS, whose faults
// reach the agents as --fault (agent_args). Throws std::runtime_error for
// an unreadable or bad --env-file (naming its line).
std::map<std::string, std::string> remote_environment(
    const LaunchOptions& options, const agent::EnvMap& head_env);

// The part of remote_environment the user asked for: the job file's env
// map, then --env-file's, then --export's (a bare NAME takes `head_env`'s
// value, if set), each over the ones before. Throws like
// remote_environment.
std::map<std::string, std::string> asked_environment(
    const LaunchOptions& options, const agent::EnvMap& head_env);

// Makes this process the host that --export, --env-file and --chdir
// describe, for an agent that runs in it (the head's own host, the one
// node of a job without hosts, a remote agent): sets `env` in its
// environment and enters `chdir` (none when empty), returning it absolute
// ("" for none). `host` names this machine in the error ("": "this machine
// (its name)"). Throws std::runtime_error naming the folder, the host and
// the fix.
std::string settle_host(const std::map<std::string, std::string>& env,
                        const std::string& chdir, const std::string& host = "");

// The dlaunch arguments of one host's agent: the job's flags as the table
// prints them (HOSTS flags and the rendezvous settings the head decides
// left out), then the head's rendezvous (`endpoint`, `run_id`, `nnodes`,
// is_host=false, --local-addr HOST), this host's worker count, `--` and
// the program.
std::vector<std::string> agent_args(const LaunchOptions& options,
                                    const Host& host,
                                    const std::string& endpoint,
                                    const std::string& run_id);

// A host's worker count: its GPUs, else its slots unless --nproc-per-node
// was given, else --nproc-per-node's; as text, since cpu, gpu and auto
// are the host's to resolve.
std::string workers_on(const LaunchOptions& options, const Host& host);

// Runs a teardown (`stop`: the backend's stop_commands for job `tag`,
// `dlaunch --remote-stop TAG` on each host) and waits up to `bound`.
// Returns "" when every command ended, else one line naming the hosts
// whose stop did not end and how to stop them by hand; what still runs
// is then SIGKILLed.
std::string run_stop(const std::vector<AgentCommand>& stop,
                     std::chrono::milliseconds bound, const std::string& tag);

}  // namespace dlaunch::launcher
