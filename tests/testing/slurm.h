#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::testing {

// A one-node Slurm cluster of the test's own: munged on a private socket,
// slurmctld and slurmd (run as root, in the foreground) with their
// config, state, spool and logs in a temporary folder and ports free
// right now; the node is this machine, named by its host name at
// 127.0.0.1. Owned by one test; the destructor cancels the cluster's jobs
// and stops the three daemons. available() is false, with the reason and
// its fix, where Slurm or munge is not installed or this is not root.
class TestSlurm {
 public:
  TestSlurm();
  ~TestSlurm();
  TestSlurm(const TestSlurm&) = delete;
  TestSlurm& operator=(const TestSlurm&) = delete;

  bool available() const { return why_not_.empty(); }
  // Why it is not available; empty when it is.
  const std::string& why_not() const { return why_not_; }
  // The node's name (this machine's host name).
  const std::string& node() const { return node_; }
  // The environment Slurm's commands (salloc, srun) need: SLURM_CONF.
  std::map<std::string, std::string> env() const;
  // The daemons' logs, for a failed test's message.
  std::string logs() const;

 private:
  bool start();
  // Starts one daemon in the foreground, its output in NAME.out.
  std::unique_ptr<Subprocess> daemon(std::vector<std::string> argv,
                                     const std::string& name);

  TempDir dir_{"dlaunch-slurm"};
  std::string node_;
  std::string why_not_;
  std::unique_ptr<Subprocess> munged_, slurmctld_, slurmd_;
};

}  // namespace dlaunch::testing
