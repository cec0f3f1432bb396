#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "agent/options.h"
#include "agent/rendezvous/rendezvous.h"

namespace dlaunch::launcher {

// One host of a job: a name and how many workers it runs (0: the job's
// nproc_per_node), and when --include/--exclude named GPU indices on it,
// those (its CUDA_VISIBLE_DEVICES; slots is then their count).
struct Host {
  std::string name;
  int slots = 0;
  std::vector<int> gpus = {};
  bool operator==(const Host&) const = default;
};

// How the head of a multi-host job starts one agent per host (the HOSTS
// flags). The hosts themselves are LaunchOptions::hosts. Plain data.
struct RemoteOptions {
  // --hosts as given (a hostlist whose items may end in :SLOTS); empty
  // (default): none on the command line.
  std::string hosts_text;
  // --hostfile as given; empty (default): none.
  std::string hostfile;
  // --include / --exclude in deepspeed's syntax (NAME[:GPU,...]@...); empty
  // (default): every host, every slot.
  std::string include;
  std::string exclude;
  // --launcher: "ssh" (default), "pdsh", or "local" (each host's agent a
  // process on this machine advertising the host's address: loopback
  // "hosts" 127.0.0.x, tests). Backends: launcher/backends/.
  std::string launcher = "ssh";
  // --ssh-port; 0 (default): ssh's own (22, or ~/.ssh/config's).
  int ssh_port = 0;
  // --ssh-args, split like a shell would (quotes kept together); passed to
  // every ssh before the host. Default none.
  std::vector<std::string> ssh_args;
  // --connect-timeout: ssh's ConnectTimeout and the bound on each host's
  // pre-flight and on each name lookup deciding whether a host (or the
  // rendezvous endpoint) is this machine. Default 10 s.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  // --pdsh-fanout: hosts pdsh reaches at once (pdsh -f). Default 32.
  int pdsh_fanout = 32;
  // --remote-dlaunch: where dlaunch is on every host; empty (default): the
  // head's own path.
  std::string remote_dlaunch;
  // -x/--export, in order: NAME (the head's value, if set) or NAME=VALUE.
  // Default none (the default forwarded set still goes).
  std::vector<std::string> exports;
  // --env-file: NAME=VALUE lines set on every host. Empty (default): none.
  std::string env_file;
  // --chdir: the working folder of every host's agent and workers; empty
  // (default): the head's current folder.
  std::string chdir;
};

// Everything `dlaunch` was asked to do, with documented defaults: the
// command line (cli.h) and a YAML job file (job_file.h) fill it; the
// flag table (flags.h) maps each flag and key to a field. The agent's part is
// `agent`; the rest is about where and how the agent runs. Plain data.
struct LaunchOptions {
  // The node agent's options (workers, restarts, logs, signals).
  agent::AgentOptions agent;
  // How this node meets the others (--nnodes, --rdzv-*, --node-rank,
  // --local-addr, --exit-barrier-timeout). Default: one node.
  agent::rendezvous::RendezvousOptions rdzv;
  // Host an embedded TCP store on a free port while the job runs (torchrun's
  // --standalone). Default: off; one node without an endpoint meets no
  // other agent and needs none (a thread and a socket saved per launch).
  bool standalone = false;
  // Rendezvous settings (--rdzv-conf K=V,...); accepted as torchrun does.
  // Default empty.
  std::map<std::string, std::string> rdzv_conf;
  // Accepted for torchrun compatibility (dlaunch detects exits through
  // events, not polling). Default 0.1 s.
  std::chrono::milliseconds monitor_interval{100};
  // Accepted for torchrun compatibility (every method starts workers the
  // same way). Default "spawn".
  std::string start_method = "spawn";
  // The program as given (before python wrapping) and its arguments.
  std::string program;
  std::vector<std::string> program_args;
  // Run `program` as a module: PYTHON -u -m PROGRAM. Default false.
  bool module = false;
  // Execute `program` directly even when it ends in .py. Default false.
  bool no_python = false;
  // Run `program` under the interpreter whatever its name (torchrun's
  // --run-path); wins over no_python. Default false.
  bool run_path = false;
  // Interpreter for .py programs and modules. Default: --python, else
  // $PYTHON, else "python3".
  std::string python = "python3";
  // Set in every worker's environment on top of dlaunch's own (a job
  // file's `env` map); --env-file and -x win over it, and the worker
  // contract (RANK, ...) over all. Default empty.
  std::map<std::string, std::string> env;
  // The job's hosts (--hosts, --hostfile, or a job file's `hosts`: a list
  // or a hostfile), parsed and validated, after --include/--exclude.
  // Default empty: this node only, no remote agents.
  std::vector<Host> hosts;
  // How the agents on `hosts` are started.
  RemoteOptions remote;
  // Whether --nproc-per-node (or its key or PET_ variable) was given: a
  // host's slots decide its worker count only when it was not. Default
  // false.
  bool nproc_per_node_given = false;
  // Whether --nnodes (or its key or PET_ variable) was given: a multi-host
  // head holds a given count, 1 included, to its hosts. Default false.
  bool nnodes_given = false;
  // The hosts were named (--hosts, --hostfile, a job file's hosts), not
  // taken from a Slurm allocation alone.
  bool hosts_given = false;
  // The fault specs as given (--fault, PET_FAULTS, DLAUNCH_FAULTS, the job
  // file's faults:), for --print-config and job.yaml; agent.faults holds
  // them parsed. Default empty.
  std::vector<std::string> faults;
  // The job file read with --config (absolute); empty when none.
  std::filesystem::path config_file;
  // The folder dlaunch was started in (set by parse_command_line): a job's
  // relative --env-file, --hostfile and --chdir are its, also once a
  // single node's agent has entered --chdir. Empty: the current folder.
  std::filesystem::path launch_dir;
  // One host's agent of a multi-host job: the whole job as --print-config
  // prints it, which its job.yaml holds (its own part needs the head's
  // store of that run). Empty otherwise.
  std::string whole_job;
  // --dry-run only: why this machine cannot resolve --nproc-per-node gpu
  // (no CUDA device visible here, no driver); the plan then shows the
  // worker counts as decided by the host that runs the job. Empty
  // otherwise.
  std::string nproc_per_node_unresolved;
  // --nproc-per-node as given when it was cpu, gpu or auto: in a
  // multi-host job each host's agent resolves it itself (its own CPUs and
  // GPUs), not the head. Empty (default): a number, or not given.
  std::string nproc_per_node_spec;
  // What to do with the job: run it (default), print the plan
  // (--dry-run), print the job as YAML (--print-config) or run it as a
  // drill and print the verdict (--drill).
  enum class Mode { kRun, kDryRun, kPrintConfig, kDrill } mode = Mode::kRun;
};

}  // namespace dlaunch::launcher
