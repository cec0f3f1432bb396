#include "tests/testing/slurm.h"

#include <fcntl.h>
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

TestSlurm::TestSlurm(std::vector<std::string> addresses) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  host_ = std::string(host).substr(0, std::string(host).find('.'));
  nodes_ = addresses.empty() ? std::vector<std::string>{host_} : addresses;
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
  // The test decides what a failed start means (it fails).
  if (!start(addresses)) {
    start_failure_ = "the test Slurm did not start:\n" + logs();
  }
}

bool TestSlurm::start(const std::vector<std::string>& addresses) {
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

  const int ctld_port = free_port();
  if (ctld_port <= 0) return false;
  // One slurmd port per node: they share this machine. Paths with %n are
  // the node's own.
  std::string node_lines, node_names;
  for (const std::string& n : nodes_) {
    const int port = free_port();
    if (port <= 0) return false;
    const std::string addr = addresses.empty() ? "127.0.0.1" : n;
    node_lines +=
        "NodeName=" + n + " NodeAddr=" + addr +
        " Port=" + std::to_string(port) + " CPUs=" +
        std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
        " RealMemory=1 State=UNKNOWN\n";
    node_names += (node_names.empty() ? "" : ",") + n;
    ::mkdir((dir_ / ("spool-" + n)).c_str(), 0700);
  }
  ::mkdir((dir_ / "state").c_str(), 0700);
  const std::string d = dir_.path().string();
  std::string conf =
      "ClusterName=dltest\n"
      "SlurmctldHost=" +
      host_ + "(127.0.0.1)\nSlurmctldPort=" + std::to_string(ctld_port) +
      "\nSlurmUser=root\nSlurmdUser=root\n"
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
      d + "/state\nSlurmdSpoolDir=" + d + "/spool-%n\nSlurmctldPidFile=" + d +
      "/slurmctld.pid\nSlurmdPidFile=" + d +
      "/slurmd-%n.pid\nSlurmctldLogFile=" + d +
      "/slurmctld.log\nSlurmdLogFile=" + d + "/slurmd-%n.log\n" + node_lines +
      "PartitionName=test Nodes=" + node_names +
      " Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n";
  write_file(dir_ / "slurm.conf", conf, 0644);
  const std::string conf_path = (dir_ / "slurm.conf").string();

  // munged answers once its socket exists.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (::access(sock.c_str(), F_OK) != 0) {
    if (!process_alive(munged_->pid()) ||
        std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(20ms);  // polling observed state
  }
  slurmctld_ =
      daemon({"/usr/sbin/slurmctld", "-D", "-c", "-f", conf_path}, "slurmctld");
  for (const std::string& n : nodes_) {
    slurmds_.push_back(daemon(
        {"/usr/sbin/slurmd", "-D", "-f", conf_path, "-N", n}, "slurmd-" + n));
  }
  // Ready once every node is idle (its slurmd registered with slurmctld).
  while (std::chrono::steady_clock::now() < deadline) {
    CommandResult s =
        run_command(argv({"sinfo", "-h", "-N", "-o", "%T"}, env()), 10s);
    size_t idle = 0;
    for (size_t at = s.out.find("idle"); at != std::string::npos;
         at = s.out.find("idle", at + 1)) {
      ++idle;
    }
    if (s.exit_code == 0 && idle == nodes_.size()) return true;
    if (!process_alive(slurmctld_->pid())) return false;
    for (const auto& p : slurmds_) {
      if (!process_alive(p->pid())) return false;
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
  for (auto& p : slurmds_) stop(p, 20s);
  stop(slurmctld_, 20s);
  stop(munged_, 10s);
}

std::map<std::string, std::string> TestSlurm::env() const {
  return {{"SLURM_CONF", (dir_ / "slurm.conf").string()}};
}

std::string TestSlurm::logs() const {
  std::vector<std::string> files = {"munged.log", "munged.out", "slurmctld.log",
                                    "slurmctld.out"};
  for (const std::string& n : nodes_) {
    files.push_back("slurmd-" + n + ".log");
    files.push_back("slurmd-" + n + ".out");
  }
  std::string out;
  for (const std::string& f : files) {
    out += "--- " + f + "\n" + read_file(dir_ / f);
  }
  return out;
}

}  // namespace dlaunch::testing
