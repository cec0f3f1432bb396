#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::testing {

// A Slurm cluster of the test's own: munged on a private socket,
// slurmctld and one slurmd per node (run as root, in the foreground) with
// their config, state, spool and logs in a temporary folder and ports free
// right now. By default one node: this machine, named by its host name at
// 127.0.0.1. Given loopback addresses ("127.0.0.2", "127.0.0.3"), one node
// per address, named by it (a name every process here resolves), each
// slurmd on its own port: a several-node cluster on one machine. Owned by
// one test suite; the destructor cancels the cluster's jobs and stops the
// daemons. available() is false, with the reason and its fix, where Slurm
// or munge is not installed or this is not root (a test then skips);
// started() is false, with the daemons' logs in start_failure(), where
// they are installed but did not come up (a test then fails).
class TestSlurm {
 public:
  explicit TestSlurm(std::vector<std::string> addresses = {});
  ~TestSlurm();
  TestSlurm(const TestSlurm&) = delete;
  TestSlurm& operator=(const TestSlurm&) = delete;

  bool available() const { return why_not_.empty(); }
  // Why it is not available; empty when it is.
  const std::string& why_not() const { return why_not_; }
  bool started() const { return start_failure_.empty(); }
  // What did not start, with the daemons' logs; empty when all did.
  const std::string& start_failure() const { return start_failure_; }
  // The first node's name (this machine's host name by default).
  const std::string& node() const { return nodes_.front(); }
  // Every node's name, in Slurm's order.
  const std::vector<std::string>& nodes() const { return nodes_; }
  // The environment Slurm's commands (salloc, srun) need: SLURM_CONF.
  std::map<std::string, std::string> env() const;
  // The daemons' logs, for a failed test's message.
  std::string logs() const;

 private:
  bool start(const std::vector<std::string>& addresses);
  // Starts one daemon in the foreground, its output in NAME.out.
  std::unique_ptr<Subprocess> daemon(std::vector<std::string> argv,
                                     const std::string& name);

  TempDir dir_{"dlaunch-slurm"};
  std::string host_;  // this machine's short name: slurmctld's host
  std::vector<std::string> nodes_;
  std::string why_not_;
  std::string start_failure_;
  std::unique_ptr<Subprocess> munged_, slurmctld_;
  std::vector<std::unique_ptr<Subprocess>> slurmds_;
};

}  // namespace dlaunch::testing
