#include "tests/testing/slurm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <random>
#include <thread>

#include "tests/testing/net.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

CommandOptions argv(std::vector<std::string> words,
                    std::map<std::string, std::string> env = {}) {
  CommandOptions o;
  o.argv = std::move(words);
  o.env = std::move(env);
  return o;
}

// Stops a daemon of the test's: SIGTERM, then (after `bound`) SIGKILL.
void stop(std::unique_ptr<Subprocess>& p, std::chrono::milliseconds bound) {
  if (!p) return;
  p->signal(SIGTERM);
  p->wait(bound);
  p.reset();
}

}  // namespace

std::unique_ptr<Subprocess> TestSlurm::daemon(std::vector<std::string> words,
                                              const std::string& name) {
  // Its output goes to a file: a pipe nobody reads would stop it once full.
  int fd = ::open((dir_ / (name + ".out")).c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  CommandOptions o = argv(std::move(words));
  o.stdout_fd = o.stderr_fd = fd;
  auto p = std::make_unique<Subprocess>(o);
  if (fd >= 0) ::close(fd);
  return p;
}

TestSlurm::TestSlurm() {
  if (::geteuid() != 0) {
    why_not_ = "a test Slurm needs root (slurmd runs as root); run as root";
    return;
  }
  for (const char* tool :
       {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd",
        "/usr/bin/srun", "/usr/bin/salloc", "/usr/bin/scancel"}) {
    if (::access(tool, X_OK) != 0) {
      why_not_ = std::string(tool) +
                 " is not installed (scripts/setup installs slurm-wlm, "
                 "slurmctld, slurmd, slurm-client and munge)";
      return;
    }
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  node_ = std::string(host).substr(0, std::string(host).find('.'));
  if (!start()) ADD_FAILURE() << "the test Slurm did not start:\n" << logs();
}

bool TestSlurm::start() {
  // munge: a random 1024-byte key readable by root alone, its own socket.
  std::random_device rd;
  std::string key(1024, '\0');
  for (char& c : key) c = static_cast<char>(rd() & 0xff);
  write_file(dir_ / "munge.key", key, 0400);
  ::chmod(dir_.path().c_str(), 0700);
  const std::string sock = (dir_ / "munge.sock").string();
  munged_ =
      daemon({"/usr/sbin/munged", "--foreground", "--force", "--socket=" + sock,
              "--key-file=" + (dir_ / "munge.key").string(),
              "--pid-file=" + (dir_ / "munged.pid").string(),
              "--log-file=" + (dir_ / "munged.log").string(),
              "--seed-file=" + (dir_ / "munged.seed").string()},
             "munged");

  const int ctld_port = free_port(), slurmd_port = free_port();
  if (ctld_port <= 0 || slurmd_port <= 0) return false;
  for (const char* d : {"state", "spool"}) ::mkdir((dir_ / d).c_str(), 0700);
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const std::string d = dir_.path().string();
  std::string conf =
      "ClusterName=dltest\n"
      "SlurmctldHost=" +
      node_ +
      "(127.0.0.1)\n"
      "SlurmctldPort=" +
      std::to_string(ctld_port) +
      "\n"
      "SlurmdPort=" +
      std::to_string(slurmd_port) +
      "\n"
      "SlurmUser=root\nSlurmdUser=root\n"
      "AuthType=auth/munge\nCredType=cred/munge\n"
      "AuthInfo=socket=" +
      sock +
      "\n"
      "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
      "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
      "SchedulerType=sched/builtin\nMpiDefault=none\n"
      "SwitchType=switch/none\nJobCompType=jobcomp/none\n"
      "AccountingStorageType=accounting_storage/none\n"
      "JobAcctGatherType=jobacct_gather/none\n"
      "SlurmdParameters=config_overrides\nReturnToService=2\n"
      "StateSaveLocation=" +
      d + "/state\nSlurmdSpoolDir=" + d + "/spool\nSlurmctldPidFile=" + d +
      "/slurmctld.pid\nSlurmdPidFile=" + d +
      "/slurmd.pid\nSlurmctldLogFile=" + d +
      "/slurmctld.log\nSlurmdLogFile=" + d +
      "/slurmd.log\n"
      "NodeName=" +
      node_ + " NodeAddr=127.0.0.1 CPUs=" + std::to_string(cpus) +
      " RealMemory=1 State=UNKNOWN\n"
      "PartitionName=test Nodes=" +
      node_ + " Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
  write_file(dir_ / "slurm.conf", conf, 0644);
  const std::string conf_path = (dir_ / "slurm.conf").string();

  // munged answers once its socket exists.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (::access(sock.c_str(), F_OK) != 0) {
    if (!process_alive(munged_->pid()) ||
        std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(20ms);  // polling observed state
  }
  slurmctld_ =
      daemon({"/usr/sbin/slurmctld", "-D", "-c", "-f", conf_path}, "slurmctld");
  slurmd_ = daemon({"/usr/sbin/slurmd", "-D", "-f", conf_path, "-N", node_},
                   "slurmd");
  // Ready once the node is idle (slurmd registered with slurmctld).
  while (std::chrono::steady_clock::now() < deadline) {
    CommandResult s =
        run_command(argv({"sinfo", "-h", "-N", "-o", "%T"}, env()), 10s);
    if (s.exit_code == 0 && s.out.starts_with("idle")) return true;
    if (!process_alive(slurmctld_->pid()) || !process_alive(slurmd_->pid())) {
      return false;
    }
    std::this_thread::sleep_for(100ms);  // polling observed state
  }
  return false;
}

TestSlurm::~TestSlurm() {
  if (slurmctld_) {
    // The cluster's jobs (this controller's only) end before the daemons
    // go, so that no step daemon (slurmstepd) is left behind.
    run_command(argv({"scancel", "--full", "--user=root"}, env()), 20s);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      CommandResult q = run_command(argv({"squeue", "-h"}, env()), 10s);
      if (q.exit_code != 0 || q.out.empty()) break;
      std::this_thread::sleep_for(100ms);  // polling observed state
    }
  }
  stop(slurmd_, 20s);
  stop(slurmctld_, 20s);
  stop(munged_, 10s);
}

std::map<std::string, std::string> TestSlurm::env() const {
  return {{"SLURM_CONF", (dir_ / "slurm.conf").string()}};
}

std::string TestSlurm::logs() const {
  std::string out;
  for (const char* f : {"munged.log", "munged.out", "slurmctld.log",
                        "slurmctld.out", "slurmd.log", "slurmd.out"}) {
    out += std::string("--- ") + f + "\n" + read_file(dir_ / f);
  }
  return out;
}

}  // namespace dlaunch::testing
