// --launcher slurm against a real one-node Slurm of the test's own
// (munged, slurmctld and slurmd; tests/testing/slurm.h): dlaunch under
// salloc runs its agents as srun tasks, the workers get torchrun's
// environment inside the job step, and a head stopped by Ctrl-C or
// SIGKILL leaves no step, agent or worker. dlaunch started by srun once
// per node of a real two-node Slurm (a slurmd per loopback address) meets
// the other node with the store on the first. The error cases need no
// cluster. Processes are found by a marker variable in /proc; waits are
// bounded and on observed state.
#include "tests/testing/slurm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <thread>

#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using ::testing::HasSubstr;
using testing::marked;
using testing::none_marked;
using testing::Subprocess;
using testing::unique_mark;
using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN_DIR "/dlaunch";

testing::CommandOptions cmd(std::vector<std::string> argv,
                            std::map<std::string, std::string> env = {},
                            std::vector<std::string> unset = {}) {
  testing::CommandOptions o;
  o.argv = std::move(argv);
  o.env = std::move(env);
  o.unset_env = std::move(unset);
  return o;
}

// The variables of Slurm's that an allocation's shell would hold, with
// any of the test's own removed.
const std::vector<std::string> kSlurmVars = {
    "SLURM_JOB_ID",         "SLURM_JOBID",           "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",       "SLURM_JOB_NUM_NODES",   "SLURM_NNODES",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_ID",         "SLURM_NTASKS",
    "SLURM_STEPID",         "SLURM_STEP_NODELIST",   "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS", "SLURM_NODEID",          "SLURM_PROCID",
    "SLURM_LOCALID",        "SLURM_STEP_RESV_PORTS", "MASTER_PORT"};

class Slurm : public ::testing::Test {
 protected:
  // The cluster's nodes (TestSlurm's addresses): this machine alone.
  virtual std::vector<std::string> addresses() const { return {}; }
  static void TearDownTestSuite() {
    delete slurm_;
    slurm_ = nullptr;
  }
  void SetUp() override {
    // Started by the suite's first test, not in SetUpTestSuite: a failure
    // there would make gtest skip every test, and ctest report a skip.
    if (slurm_ == nullptr) slurm_ = new testing::TestSlurm(addresses());
    if (!slurm_->available()) GTEST_SKIP() << slurm_->why_not();
    ASSERT_TRUE(slurm_->started()) << slurm_->start_failure();
  }

  // An allocation of the one node with no shell (salloc --no-shell): the
  // head then runs directly in it, as in an sbatch script.
  std::map<std::string, std::string> allocate() {
    CommandResult r = testing::run_command(
        cmd({"salloc", "--no-shell", "-N1", "--job-name=dlaunch-test"},
            slurm_->env()),
        60s);
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.err, m,
                                  std::regex("Granted job allocation (\\d+)")))
        << r.err << slurm_->logs();
    if (m.empty()) return {};
    job_ = m[1];
    auto env = slurm_->env();
    env["SLURM_JOB_ID"] = job_;
    env["SLURM_JOB_NODELIST"] = slurm_->node();
    env["SLURM_JOB_NUM_NODES"] = "1";
    return env;
  }

  // The head, run in a fresh allocation, of a job whose two workers sleep,
  // once they run; its processes carry DLT_MARK=`mark`. nullptr (and a
  // failure) when it does not get there.
  std::unique_ptr<Subprocess> start_sleeping_job(const std::string& mark) {
    auto env = allocate();
    if (env.empty()) return nullptr;
    env["DLT_MARK"] = mark;
    auto head = std::make_unique<Subprocess>(cmd(
        {kDlaunch, "--launcher", "slurm", "--local-addr", "127.0.0.1",
         "--nproc-per-node", "2", "sh", "-c", "echo up-$RANK; exec sleep 300"},
        env, kSlurmVars));
    for (const char* up : {"up-0", "up-1"}) {
      if (!head->wait_for_output(up, 60s)) {
        ADD_FAILURE() << "no " << up << ":\n"
                      << head->out() << head->err() << slurm_->logs();
        return nullptr;
      }
    }
    // The agent (srun passes the head's environment on) and its workers.
    EXPECT_TRUE(
        testing::eventually([&] { return marked(mark).size() >= 3u; }, 30s))
        << marked(mark).size();
    return head;
  }

  // The steps of the allocation still known to Slurm.
  std::string steps() const {
    return testing::run_command(
               cmd({"squeue", "-h", "-s", "-j", job_}, slurm_->env()), 20s)
        .out;
  }

  void TearDown() override {
    if (!job_.empty()) {
      testing::run_command(cmd({"scancel", job_}, slurm_->env()), 20s);
    }
  }

  static testing::TestSlurm* slurm_;
  std::string job_;
};

testing::TestSlurm* Slurm::slurm_ = nullptr;

TEST_F(Slurm, SallocRunsTheAgentsAsSrunTasksWithTorchrunsEnvironment) {
  const std::string mark = unique_mark("s");
  auto env = slurm_->env();
  env["DLT_MARK"] = mark;
  CommandResult r = testing::run_command(
      cmd({"salloc", "-N1", kDlaunch, "--launcher", "slurm", "--local-addr",
           "127.0.0.1", "--nproc-per-node", "2", "sh", "-c",
           "echo ENV rank=$RANK ws=$WORLD_SIZE lr=$LOCAL_RANK "
           "gr=$GROUP_RANK gws=$GROUP_WORLD_SIZE job=$SLURM_JOB_ID "
           "step=$SLURM_STEP_ID node=$SLURMD_NODENAME "
           "tok=${#DLAUNCH_RDZV_TOKEN}"},
          env, kSlurmVars),
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << slurm_->logs();
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(r.err, m, std::regex("Granted job allocation (\\d+)")))
      << r.err;
  const std::string job = m[1], node = slurm_->node();
  for (int rank : {0, 1}) {
    // The host before each line, RANK = LOCAL_RANK on the one node, in a
    // step of the allocation (not its batch or extern step).
    const std::string r_text = std::to_string(rank);
    EXPECT_THAT(r.out,
                ::testing::ContainsRegex(
                    node + " \\[default" + r_text + "\\]:ENV rank=" + r_text +
                    " ws=2 lr=" + r_text + " gr=0 gws=1 job=" + job +
                    " step=[0-9]+ node=" + node + " tok=64"))
        << r.out << r.err;
  }
  EXPECT_TRUE(none_marked(mark, 30s));
}

TEST_F(Slurm, CtrlCOnTheHeadEndsTheStepAndEveryProcess) {
  const std::string mark = unique_mark("s");
  std::unique_ptr<Subprocess> head = start_sleeping_job(mark);
  ASSERT_TRUE(head);
  head->signal(SIGINT);
  CommandResult r = head->wait(60s);
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_TRUE(none_marked(mark, 30s)) << marked(mark).size() << " left";
  EXPECT_TRUE(testing::eventually([&] { return steps().empty(); }, 30s))
      << steps();
}

// The head cannot stop anything: srun dies with it, and the agent, its
// link to the head's store gone, stops its workers and ends the step.
TEST_F(Slurm, SigkillToTheHeadLeavesNoAgentOrWorker) {
  const std::string mark = unique_mark("s");
  std::unique_ptr<Subprocess> head = start_sleeping_job(mark);
  ASSERT_TRUE(head);
  head->signal(SIGKILL);
  EXPECT_EQ(head->wait(30s).signal, SIGKILL);
  EXPECT_TRUE(none_marked(mark, 60s)) << marked(mark).size() << " left";
  EXPECT_TRUE(testing::eventually([&] { return steps().empty(); }, 60s))
      << steps();
}

// dlaunch started by hand as a task of an srun step, torchrun's way:
// each node's dlaunch reads the step from its environment, the first
// node's agent hosts the store on MASTER_PORT and the workers get
// torchrun's environment across the nodes. The workers print their
// agent's pid and wait at `gate` until the test has looked at the agents.
const std::string kTaskScript =
    "echo ENV rank=$RANK ws=$WORLD_SIZE gr=$GROUP_RANK gws=$GROUP_WORLD_SIZE "
    "ma=$MASTER_ADDR run=$TORCHELASTIC_RUN_ID agent=$PPID; read x < ";

// Waits for the four workers' ENV lines in `out` (of `who`); checks them
// against step `job`.`step` on 127.0.0.2-3 and that the first node's agent,
// alone, listens on `port`. Then lets the workers go.
void check_step(const std::function<std::string()>& out,
                const std::function<bool(const std::string&)>& wait_for,
                const std::string& job, const std::string& step, int port,
                testing::Gate& gate) {
  std::map<int, pid_t> agent_of_rank;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string r = std::to_string(rank), gr = std::to_string(rank / 2);
    ASSERT_TRUE(wait_for("ENV rank=" + r + " ")) << out();
    std::smatch m;
    const std::string text = out();
    ASSERT_TRUE(
        std::regex_search(text, m,
                          std::regex("ENV rank=" + r + " ws=4 gr=" + gr +
                                     " gws=2 ma=127.0.0.2 run=" + job + "\\." +
                                     step + " agent=(\\d+)")))
        << text;
    agent_of_rank[rank] = std::stoi(m[1]);
  }
  EXPECT_EQ(agent_of_rank[0], agent_of_rank[1]);
  EXPECT_NE(agent_of_rank[0], agent_of_rank[2]);
  EXPECT_TRUE(testing::listening_ports(agent_of_rank[0]).contains(port));
  EXPECT_FALSE(testing::listening_ports(agent_of_rank[2]).contains(port));
  for (int i = 0; i < 4; ++i) gate.open_once();
}

// The variables srun gives task `node` of step 77.0 on 127.0.0.[2-3].
std::map<std::string, std::string> srun_task_env(int node) {
  const std::string id = std::to_string(node);
  return {{"SLURM_JOB_ID", "77"},
          {"SLURM_JOB_NODELIST", "127.0.0.[2-3]"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NODELIST", "127.0.0.[2-3]"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NNODES", "2"},
          {"SLURM_NODELIST", "127.0.0.[2-3]"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_NODEID", id},
          {"SLURM_PROCID", id},
          {"SLURM_LOCALID", "0"},
          {"SLURMD_NODENAME", "127.0.0." + std::to_string(node + 2)}};
}

// The same without a Slurm: two dlaunch processes with the variables srun
// would give them (the real cluster's test is SlurmTwoNodes below).
TEST(SlurmTask, EachNodesDlaunchJoinsTheStepWithTheStoreOnTheFirstNode) {
  testing::TempDir dir;
  testing::Gate gate((dir / "gate").string());
  const int port = testing::free_port();
  ASSERT_GT(port, 0);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  // Node 1 first: it waits for the first node's store.
  for (int node : {1, 0}) {
    auto env = srun_task_env(node);
    env["MASTER_PORT"] = std::to_string(port);
    env["DLAUNCH_RDZV_TOKEN"] = std::string(64, 'c');
    nodes.push_back(std::make_unique<Subprocess>(
        cmd({kDlaunch, "--nproc-per-node", "2", "sh", "-c",
             kTaskScript + gate.path()},
            env, kSlurmVars)));
  }
  auto out = [&] { return nodes[0]->out() + nodes[1]->out(); };
  check_step(
      out,
      [&](const std::string& text) {
        return testing::eventually(
            [&] {
              nodes[0]->wait_for_output(text, 10ms);
              nodes[1]->wait_for_output(text, 10ms);
              return out().find(text) != std::string::npos;
            },
            60s);
      },
      "77", "0", port, gate);
  for (auto& n : nodes) {
    CommandResult r = n->wait(60s);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  }
}

// A two-node cluster of the test's own (a slurmd per loopback address).
class SlurmTwoNodes : public Slurm {
 protected:
  std::vector<std::string> addresses() const override {
    return {"127.0.0.2", "127.0.0.3"};
  }
};

TEST_F(SlurmTwoNodes, SrunTasksMeetWithTheStoreOnTheFirstNode) {
  testing::TempDir dir;
  testing::Gate gate((dir / "gate").string());
  const int port = testing::free_port();
  ASSERT_GT(port, 0);
  auto env = slurm_->env();
  env["MASTER_PORT"] = std::to_string(port);
  env["DLAUNCH_RDZV_TOKEN"] = std::string(64, 'd');
  Subprocess srun(cmd({"srun", "-N2", "--ntasks-per-node=1",
                       "--job-name=dlaunch-test", kDlaunch, "--nproc-per-node",
                       "2", "sh", "-c", kTaskScript + gate.path()},
                      env, kSlurmVars));
  // The job id from a worker's run id (JOB.STEP); srun's own step is 0.
  ASSERT_TRUE(srun.wait_for_output("ENV rank=", 120s))
      << srun.out() << srun.err() << slurm_->logs();
  std::smatch m;
  const std::string first = srun.out();
  ASSERT_TRUE(std::regex_search(first, m, std::regex("run=(\\d+)\\.0 ")))
      << first;
  job_ = m[1];
  check_step(
      [&] { return srun.out(); },
      [&](const std::string& text) { return srun.wait_for_output(text, 60s); },
      job_, "0", port, gate);
  CommandResult r = srun.wait(60s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST_F(SlurmTwoNodes, TwoTasksOnANodeOrNoTokenAreRefusedNamingTheFix) {
  auto env = slurm_->env();
  env["DLAUNCH_RDZV_TOKEN"] = std::string(64, 'e');
  CommandResult r = testing::run_command(
      cmd({"srun", "-N1", "-n2", "--job-name=dlaunch-test", kDlaunch, "true"},
          env, kSlurmVars),
      120s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("runs 2 tasks on 1 node(s), and dlaunch, which "
                               "starts its node's workers itself, must run "
                               "once per node; start it with srun "
                               "--ntasks-per-node=1"))
      << r.err;
  env.erase("DLAUNCH_RDZV_TOKEN");
  r = testing::run_command(cmd({"srun", "-N2", "--ntasks-per-node=1",
                                "--job-name=dlaunch-test", kDlaunch, "true"},
                               env, kSlurmVars),
                           120s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("nodes, dlaunch meets the other nodes in a "
                               "store on 127.0.0.2 that the network can "
                               "reach, and the job has no token"))
      << r.err;
}

// Errors before anything starts; no cluster needed.
TEST(SlurmErrors, OutsideAnAllocationOrWithForeignHostsOrWithoutSrun) {
  CommandResult r = testing::run_command(
      cmd({kDlaunch, "--launcher", "slurm", "true"}, {}, kSlurmVars));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--launcher slurm runs inside a Slurm "
                               "allocation, and SLURM_JOB_ID is not set; run "
                               "dlaunch under salloc or in an sbatch script"));
  const std::map<std::string, std::string> alloc = {
      {"SLURM_JOB_ID", "5"},
      {"SLURM_JOB_NODELIST", "n[1-2]"},
      {"SLURM_JOB_NUM_NODES", "2"}};
  r = testing::run_command(
      cmd({kDlaunch, "--launcher", "slurm", "--hosts", "n2,n3", "true"}, alloc,
          kSlurmVars));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("host 'n3' is not in Slurm job 5's "
                               "allocation (n1,n2); name nodes of the "
                               "allocation, or drop --hosts"));
  // The plan names the allocation's nodes; no srun is needed for it.
  auto no_srun = alloc;
  testing::TempDir empty;
  no_srun["PATH"] = empty.path().string();
  r = testing::run_command(
      cmd({kDlaunch, "--launcher", "slurm", "--dry-run", "true"}, no_srun,
          kSlurmVars));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("hosts:     n1, n2 (one agent each, started "
                               "with --launcher slurm"));
  r = testing::run_command(
      cmd({kDlaunch, "--launcher", "slurm", "/bin/true"}, no_srun, kSlurmVars));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--launcher slurm runs srun, which is not in "
                               "PATH"));
}

}  // namespace
}  // namespace dlaunch
