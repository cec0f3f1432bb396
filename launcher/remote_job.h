#pragma once

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch::launcher {

// What the head hands one host's agent: the command line it runs, the
// environment set on top of the host's, the working folder, and the
// names that tie it to its job. It travels on the agent's stdin (ssh,
// local) or in a 0600 file (pdsh), never in argv. Plain data.
struct RemoteJob {
  // dlaunch's arguments for this host's agent, program included.
  std::vector<std::string> args;
  // Set on top of the host's environment before the agent parses `args`
  // (forwarded variables, --export, --env-file, DLAUNCH_RDZV_TOKEN).
  std::map<std::string, std::string> env;
  // The agent's working folder; empty: where the remote command started.
  std::string chdir;
  // The name the head knows this host by: ${hostname} in line prefixes.
  std::string host;
  // Job-unique, non-secret id (DLAUNCH_JOB_TAG in the agent's and its
  // workers' environment): teardown finds the job's processes by it.
  std::string job_tag;
  // The whole job as --print-config prints it: the host's job.yaml.
  std::string whole_job;
  bool operator==(const RemoteJob&) const = default;
};

// A job text that cannot be decoded: names the field and the problem.
class RemoteJobError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The job as text: "dlaunch-job 1\n", then one record per field as
// "KIND LENGTH\n" + LENGTH bytes + "\n", ending with "end 0\n\n". Lengths
// make any byte (spaces, quotes, '$', newlines) travel intact.
std::string encode_remote_job(const RemoteJob& job);

// Several hosts' jobs in one text (pdsh's job file, srun's stdin), for
// decode_remote_jobs: a whole_job equal to the one before it is written
// once, so the text grows with the hosts, not their square.
std::string encode_remote_jobs(const std::vector<RemoteJob>& jobs);

// The jobs of several hosts, one after another (pdsh's 0600 file holds
// every host's; each agent picks its own by host name). A job without a
// whole_job has the one of the job before it.
std::vector<RemoteJob> decode_remote_jobs(std::string_view text);

// Reads one encoded job from `fd` up to its end record, byte-exact, and
// no further (the rest of the stream stays unread: for ssh, its end is
// the head's connection closing). Waits at most `timeout` for all of it.
// Throws RemoteJobError naming what was missing or malformed.
RemoteJob read_remote_job(int fd, std::chrono::milliseconds timeout);

}  // namespace dlaunch::launcher
