#pragma once

#include <string>
#include <vector>

namespace dlaunch::launcher {

// The commands the head runs on its hosts through a backend
// (agent_launcher.h); `dlaunch` dispatches to them when its first
// argument is one of these flags. Each returns the process exit code.

// `dlaunch --remote-agent --job-tag TAG [--job-file PATH [--host NAME]]
// [--slurm-task]`: one host's agent. Reads its RemoteJob from stdin (ssh,
// local; with --slurm-task, an srun task's stdin carrying every node's
// job, its own the one for SLURMD_NODENAME), or its entry of a
// 0600 job file (pdsh: by --host, else by this machine's names; the file
// is removed once read); sets the job's environment and working folder
// and runs the agent as `dlaunch ARGS` would. With stdin, the end of stdin
// after the job (the head's connection dropped) stops the workers and
// ends the agent.
int remote_agent_main(const std::vector<std::string>& args);

// `dlaunch --remote-check PROGRAM [--chdir DIR] [--checksum SUM]`:
// pre-flight. Prints one line, "dlaunch-check VERSION ok", "dlaunch-check
// VERSION program-missing: WHY" or (a shipped copy whose own checksum,
// ship.h, is not SUM) "dlaunch-check VERSION damaged: WHY", and exits 0
// either way (a failure to run at all is the head's to report).
int remote_check_main(const std::vector<std::string>& args);

// `dlaunch --remote-stop TAG [--job-file PATH]`: teardown. Removes the job
// file, sends SIGTERM to this user's processes whose environment holds
// DLAUNCH_JOB_TAG=TAG (the job's agents and their workers, nothing else),
// SIGKILLs those left after 10 s, and prints how many it stopped (shipped
// copies of dlaunch stay in the user's cache, ship.h).
int remote_stop_main(const std::vector<std::string>& args);

// The processes of this user whose environment holds DLAUNCH_JOB_TAG=`tag`
// (workers), or the agents of job `tag`: `DLAUNCH --remote-agent ...
// --job-tag tag ...`, or the shipped copy's shim `sh -c SCRIPT dlaunch
// --remote-agent ...` before it execs; this one excluded (read from
// /proc). The head's srun or pdsh, whose command line carries the agents'
// after its own options, is not one of them.
std::vector<int> processes_with_tag(const std::string& tag);

}  // namespace dlaunch::launcher
