// Injected faults and hang detection end to end: the real dlaunch, real
// workers (sh, dl-sgd), real signals. Each fault kind fires for real, is
// logged, and is marked injected in the report and summary.json.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "tests/testing/bin.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "workloads/checkpoint.h"
#include "workloads/idx.h"

namespace dlaunch {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;
using testing::free_port;
using ::testing::HasSubstr;
using testing::marked;
using testing::none_marked;
using ::testing::Not;
using testing::read_file;
using testing::Subprocess;
using testing::TempDir;
using namespace std::chrono_literals;

const std::string kDlaunch = testing::bin("dlaunch");

CommandResult dlaunch(std::vector<std::string> args,
                      std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), kDlaunch);
  return testing::run_command({args, env, {}, ""}, 120s);
}

nlohmann::json summary(const fs::path& log_dir, const std::string& id) {
  return nlohmann::json::parse(read_file(log_dir / id / "summary.json"));
}

// A value of DLT_MARK for one run's processes (workers and their children
// inherit it), unique to this test process and `name`.
std::string run_mark(const std::string& name) {
  return "faults-" + std::to_string(::getpid()) + "-" + name;
}

// A worker that runs until killed in the first attempt and succeeds in
// the next.
const std::string kFirstAttemptHangs =
    "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi; "
    "echo \"rank $RANK ok\"";

TEST(Faults, KillFiresRestartsTheGroupAndIsRecorded) {
  TempDir dir;
  CommandResult r =
      dlaunch({"--nproc-per-node", "2", "--max-restarts", "1", "--log-dir",
               dir.path().string(), "--rdzv-id", "k", "--fault",
               "kill:rank=1:after=0.2", "sh", "-c", kFirstAttemptHangs});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err,
              HasSubstr("dlaunch: fault injected: kill:rank=1:after=0.2: "
                        "SIGKILL to rank 1 (local rank 1, pid "));
  EXPECT_THAT(r.err, HasSubstr("failed with signal SIGKILL (9) (injected: "
                               "kill:rank=1:after=0.2); restarting"));
  EXPECT_THAT(r.out, HasSubstr("rank 1 ok"));
  nlohmann::json s = summary(dir.path(), "k");
  ASSERT_EQ(s["faults"].size(), 1u) << s.dump(2);
  const nlohmann::json& f = s["faults"][0];
  EXPECT_EQ(f["spec"], "kill:rank=1:after=0.2");
  EXPECT_EQ(f["attempt"], 0);
  EXPECT_EQ(f["pid"], s["attempts"][0]["workers"][1]["pid"]);
  EXPECT_FALSE(f["detected"].is_null());
  EXPECT_FALSE(f["running_again"].is_null());
  EXPECT_EQ(s["attempts"][0]["workers"][1]["injected_fault"],
            "kill:rank=1:after=0.2");
  EXPECT_EQ(s["attempts"][0]["workers"][1]["signal"], "SIGKILL");
  EXPECT_TRUE(s["attempts"][0]["workers"][0]["injected_fault"].is_null());
  EXPECT_EQ(s["attempts"][1]["outcome"], "succeeded");
}

TEST(Faults, ASignalOtherThanKillAndAnAttemptOtherThanTheFirst) {
  // attempt=1: the first start runs clean up to its own failure; the
  // fault hits the restart.
  TempDir dir;
  CommandResult r = dlaunch(
      {"--nproc-per-node", "2", "--max-restarts", "2", "--log-dir",
       dir.path().string(), "--rdzv-id", "a", "--fault",
       "kill:rank=0:signal=TERM:attempt=1", "sh", "-c",
       "case $TORCHELASTIC_RESTART_COUNT in 0) exit 7;; 1) exec sleep 60;; "
       "esac; echo fine"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  nlohmann::json s = summary(dir.path(), "a");
  ASSERT_EQ(s["attempts"].size(), 3u);
  EXPECT_EQ(s["faults"][0]["attempt"], 1);
  EXPECT_EQ(s["attempts"][1]["workers"][0]["signal"], "SIGTERM");
  EXPECT_EQ(s["attempts"][1]["workers"][0]["injected_fault"],
            "kill:rank=0:signal=TERM:attempt=1");
}

TEST(Faults, ExitEndsTheRankWithItsCodeAndTheReportSaysInjected) {
  TempDir dir;
  CommandResult r =
      dlaunch({"--nproc-per-node", "2", "--log-dir", dir.path().string(),
               "--rdzv-id", "e", "--fault", "exit:rank=0:code=3:after=0.1",
               "sh", "-c", "exec sleep 60"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("rank 0 ended as exit code 3"));
  EXPECT_THAT(r.err, HasSubstr("    exit       : exit code 3\n"));
  EXPECT_THAT(r.err,
              HasSubstr("    injected   : fault exit:rank=0:code=3:after=0.1 "
                        "(dlaunch caused this failure on purpose)"));
  nlohmann::json s = summary(dir.path(), "e");
  EXPECT_EQ(s["root_cause"]["exit_code"], 3);
  EXPECT_EQ(s["root_cause"]["injected_fault"], "exit:rank=0:code=3:after=0.1");
  EXPECT_EQ(s["exit_code"], 3);
}

// Two ranks that beat (touch DLAUNCH_HEARTBEAT_FILE, as programs without
// comm opt in) until `fault` stops one; restarted, they print "recovered".
// `start` runs before the first beat. The hang timeout is 5 s: rank 0's
// loop (a touch and a sleep, two forks each beat) must not go quiet for
// that long, which a loaded machine can make it do for 1 s.
CommandResult stopped_beating(const fs::path& log_dir, const std::string& id,
                              const std::string& fault,
                              const std::string& start = "") {
  return dlaunch({"--nproc-per-node", "2", "--max-restarts", "1",
                  "--hang-timeout", "5", "--log-dir", log_dir.string(),
                  "--rdzv-id", id, "--fault", fault, "sh", "-c",
                  "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ]; then echo "
                  "recovered; exit 0; fi; " +
                      start +
                      "while :; do touch \"$DLAUNCH_HEARTBEAT_FILE\"; "
                      "sleep 0.05; done"});
}

TEST(Faults, StopFreezesARankAndHangTimeoutFindsIt) {
  TempDir dir;
  CommandResult r = stopped_beating(dir.path(), "h", "stop:rank=1:after=1.5");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("fault injected: stop:rank=1:after=1.5: "
                               "SIGSTOP to rank 1 (frozen)"));
  EXPECT_THAT(r.err,
              HasSubstr("dlaunch: hang: no progress for 5 s "
                        "(--hang-timeout); stuck: rank 1 (local rank 1"));
  EXPECT_THAT(r.err, HasSubstr(") in heartbeat at progress "));
  EXPECT_THAT(r.out, HasSubstr("recovered"));
  nlohmann::json s = summary(dir.path(), "h");
  const nlohmann::json& w1 = s["attempts"][0]["workers"][1];
  EXPECT_TRUE(w1["hung"].get<bool>());
  EXPECT_EQ(w1["operation"], "heartbeat");
  EXPECT_EQ(w1["signal"], "SIGKILL");
  EXPECT_FALSE(s["attempts"][0]["workers"][0]["hung"].get<bool>());
  EXPECT_FALSE(s["faults"][0]["detected"].is_null());
}

// A rank frozen by a stop fault before its first beat (still starting) is
// found hung too, though the others beat on; before, only ranks that had
// shown progress were watched, and the job waited for ever.
TEST(Faults, ARankFrozenBeforeItsFirstBeatIsFoundHung) {
  TempDir dir;
  CommandResult r =
      stopped_beating(dir.path(), "early", "stop:rank=1:after=0.1",
                      "if [ $RANK = 1 ]; then sleep 3; fi; ");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("stuck: rank 1 (local rank 1, pid "));
  EXPECT_THAT(r.err, HasSubstr(") in no operation yet at progress 0 (others "
                               "up to "));
  EXPECT_THAT(r.out, HasSubstr("recovered"));
}

// Where no rank has shown progress yet (rank 0 waits for rank 1 in
// set-up, say), the rank a stop fault froze is the one named stuck and the
// root cause, not every rank at progress 0.
TEST(Faults, AmongRanksWithoutProgressTheFrozenOneIsStuck) {
  TempDir dir;
  CommandResult r =
      dlaunch({"--nproc-per-node", "2", "--hang-timeout", "1", "--log-dir",
               dir.path().string(), "--rdzv-id", "zero", "--fault",
               "stop:rank=1:after=0.1", "sh", "-c", "exec sleep 60"});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("stuck: rank 1 (local rank 1, pid "));
  EXPECT_THAT(r.err, Not(HasSubstr("stuck: rank 0")));
  nlohmann::json s = summary(dir.path(), "zero");
  EXPECT_EQ(s["root_cause"]["local_rank"], 1) << s.dump();
  EXPECT_FALSE(s["attempts"][0]["workers"][0]["hung"].get<bool>());
  EXPECT_TRUE(s["attempts"][0]["workers"][1]["hung"].get<bool>());
}

// Rank 0 beats once, then waits (as for a peer); rank 1 never shows any
// progress: it is the one named stuck.
TEST(Faults, AWorkerThatNeverShowedProgressIsNamedWhenOthersWait) {
  CommandResult r =
      dlaunch({"--nproc-per-node", "2", "--hang-timeout", "0.5", "sh", "-c",
               "if [ $RANK = 0 ]; then touch \"$DLAUNCH_HEARTBEAT_FILE\"; fi; "
               "exec sleep 60"});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("stuck: rank 1 (local rank 1, pid "));
  EXPECT_THAT(r.err, HasSubstr(") in no operation yet at progress 0 (others "
                               "up to 1)"));
  EXPECT_THAT(r.err, HasSubstr("    hung       : no progress within "
                               "--hang-timeout: stuck in no operation yet"));
}

TEST(Faults, WorkersThatShowNoProgressAreNotWatched) {
  CommandResult r = dlaunch({"--nproc-per-node", "2", "--hang-timeout", "0.2",
                             "sh", "-c", "sleep 1; echo quiet-done"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, Not(HasSubstr("hang")));
}

TEST(Faults, RankOutOfRangeOfAnElasticRoundIsAnErrorNamingTheSpec) {
  const int port = free_port();
  TempDir dir;
  CommandResult r = dlaunch(
      {"--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
       "127.0.0.1:" + std::to_string(port), "--rdzv-conf",
       "last_call_timeout=0.1", "--nproc-per-node", "2", "--fault",
       "kill:rank=5", "sh", "-c", "touch " + (dir / "started").string()});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dlaunch: fault 'kill:rank=5': rank 5 is out "
                               "of range: 2 workers (ranks 0..1) in round 0"));
  EXPECT_FALSE(fs::exists(dir / "started"));
}

// Agent `i` of a two-node elastic job (--nnodes 1:2) on 127.0.0.(i+1),
// agent 0 hosting the store, with `fault`. Its worker records its pid and
// sleeps while both nodes run; alone, it prints alone-ok.
std::unique_ptr<Subprocess> node_agent(int i, int port, const std::string& id,
                                       const fs::path& dir,
                                       const std::string& fault,
                                       const std::string& conf = "") {
  std::vector<std::string> argv = {
      kDlaunch, "--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
      "127.0.0.1:" + std::to_string(port), "--rdzv-id", id, "--local-addr",
      "127.0.0." + std::to_string(i + 1), "--rdzv-conf",
      std::string("is_host=") + (i == 0 ? "true" : "false") +
          ",join_timeout=60,last_call_timeout=30" + conf,
      "--nproc-per-node", "1", "--fault", fault, "sh", "-c",
      // Written whole (a temporary renamed): a worker killed mid-write
      // leaves no half a pid.
      "f=" + (dir / "pid_").string() + std::to_string(i) +
          "_$GROUP_WORLD_SIZE; echo $$ > $f.tmp; mv $f.tmp $f; "
          "if [ $GROUP_WORLD_SIZE = 2 ]; then exec sleep 60; fi; "
          "echo alone-ok"};
  return std::make_unique<Subprocess>(
      testing::CommandOptions{argv, {}, {}, ""});
}

// Waits (bounded) for `pid` to be gone.
bool gone(int pid) {
  return testing::eventually([pid] { return !testing::process_alive(pid); },
                             30s, 20ms);
}

// Whether the worker whose pid is in `file` is gone (bounded wait); a
// worker killed before it wrote the file is.
bool worker_gone(const fs::path& file) {
  if (!fs::exists(file)) return true;
  return gone(std::stoi(read_file(file)));
}

// Node 1's agent kills itself; node 0 re-forms the group alone and the
// job finishes; nothing of node 1 is left.
TEST(Faults, KillAgentEndsThatNodeAndTheOthersGoOn) {
  const int port = free_port();
  TempDir dir;
  const std::string fault = "kill-agent:node=1:after=0.3";
  auto a0 = node_agent(0, port, "ka", dir.path(), fault);
  ASSERT_TRUE(a0->wait_for_output("waiting for nodes", 30s)) << a0->err();
  auto a1 = node_agent(1, port, "ka", dir.path(), fault);
  CommandResult r1 = a1->wait(60s);
  EXPECT_EQ(r1.signal, SIGKILL) << r1.err;
  EXPECT_THAT(r1.err, HasSubstr("fault injected: kill-agent:node=1:after=0.3: "
                                "SIGKILL to the agent of node 1 (this agent"));
  CommandResult r0 = a0->wait(60s);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  EXPECT_THAT(r0.out, HasSubstr("alone-ok"));
  // Node 1's worker died with its agent (the watchdog).
  EXPECT_TRUE(worker_gone(dir / "pid_1_2"));
}

// Node 1 falls silent to the store past its keep-alive (10 s here, which
// a loaded machine cannot make node 0 miss as it did 2 s): the store drops
// it, node 0 goes on alone, node 1 learns it was declared lost and stops
// its worker.
TEST(Faults, CutNodeIsDroppedAndTheOthersGoOn) {
  const int port = free_port();
  TempDir dir;
  const std::string fault = "cut:node=1:for=30:after=0.3";
  const std::string conf = ",keep_alive_interval=1,keep_alive_max_attempt=10";
  auto a0 = node_agent(0, port, "cut", dir.path(), fault, conf);
  ASSERT_TRUE(a0->wait_for_output("waiting for nodes", 30s)) << a0->err();
  auto a1 = node_agent(1, port, "cut", dir.path(), fault, conf);
  CommandResult r0 = a0->wait(60s);
  ASSERT_EQ(r0.exit_code, 0) << r0.out << r0.err;
  EXPECT_THAT(r0.out, HasSubstr("alone-ok"));
  CommandResult r1 = a1->wait(60s);
  EXPECT_EQ(r1.exit_code, 1) << r1.err;
  EXPECT_THAT(r1.err, HasSubstr("fault injected: cut:node=1:for=30:after=0.3: "
                                "node 1 silent to the agents' store for 30 s"));
  EXPECT_THAT(r1.err, HasSubstr("declared this node lost"));
  EXPECT_TRUE(worker_gone(dir / "pid_1_2"));
}

// --drill runs a job file with its faults and prints the verdict table.
TEST(Drill, PrintsAVerdictRowPerFaultAndPassesWhenTheJobRecovers) {
  TempDir dir;
  testing::write_file(dir / "drill.yaml",
                      "program: sh\nargs: [-c, '" + kFirstAttemptHangs +
                          "']\nnproc_per_node: 2\nmax_restarts: 1\nfaults:\n"
                          "  - kill:rank=1:after=0.2\n");
  CommandResult r = dlaunch({"--drill", (dir / "drill.yaml").string()});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("dlaunch --drill: verdict"));
  EXPECT_THAT(r.out, HasSubstr("fault"));
  EXPECT_THAT(r.out, HasSubstr("detected after"));
  EXPECT_THAT(r.out, HasSubstr("running again after"));
  std::smatch m;
  std::string out = r.out;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex("kill:rank=1:after=0.2 +([0-9.]+) s +([0-9.]+) s +([0-9.]+) "
                 "s +ok\n")))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("job: exit 0 after 2 group start(s) (expected "
                               "exit 0): ok\ndrill: PASSED\n"));

  // A fault that never fires (attempt 3 never comes) fails the drill, and a
  // flag beside --drill adds to the file's faults.
  r = dlaunch({"--drill", (dir / "drill.yaml").string(), "--fault",
               "kill:rank=0:attempt=3"});
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("kill:rank=0:attempt=3"));
  EXPECT_THAT(r.out, HasSubstr("FAIL: never fired"));
  EXPECT_THAT(r.out, HasSubstr("drill: FAILED\n"));
}

// A drill leaves no process behind: each worker of the first two attempts
// starts a child of its own, the stopped rank's and the killed rank's
// included.
TEST(Drill, LeavesNoProcessBehind) {
  TempDir dir;
  const std::string mark = run_mark("drill");
  testing::write_file(
      dir / "drill.yaml",
      "program: sh\nargs: [-c, 'if [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; "
      "then sleep 60 & while :; do touch \"$DLAUNCH_HEARTBEAT_FILE\"; "
      "sleep 0.05; done; fi']\nnproc_per_node: 3\nmax_restarts: 2\n"
      "hang_timeout: 5\nfaults:\n  - stop:rank=2:after=0.3\n"
      "  - kill:rank=1:after=0.3:attempt=1\n");
  CommandResult r =
      dlaunch({"--drill", (dir / "drill.yaml").string()}, {{"DLT_MARK", mark}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("drill: PASSED\n"));
  EXPECT_TRUE(none_marked(mark, 30s))
      << marked(mark).size() << " processes left";
}

// dl-sgd, checkpointing each epoch, as two workers under dlaunch.
class Sgd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(workloads::kDefaultDataDir) /
                    "train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "dataset-fashion-mnist is not installed";
    }
  }
  CommandResult run(const std::string& ckpt, std::vector<std::string> flags,
                    std::map<std::string, std::string> env = {}) {
    std::vector<std::string> args = {"--nproc-per-node", "2",
                                     "--log-dir",        dir_.path().string(),
                                     "--rdzv-id",        ckpt};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {testing::bin("dl-sgd"), "--epochs", "3",
                             "--limit-train", "2000", "--limit-test", "500",
                             "--checkpoint-dir", (dir_ / ckpt).string()});
    env["DLAUNCH_COMM_TIMEOUT"] = "60";
    env["DLT_MARK"] = run_mark(ckpt);
    return dlaunch(args, env);
  }
  // The final weights equal those of a run without faults.
  void expect_same_weights_as_clean_run(const std::string& ckpt) {
    CommandResult clean = run("clean", {});
    ASSERT_EQ(clean.exit_code, 0) << describe(clean);
    auto a = workloads::load_checkpoint(dir_ / "clean");
    auto b = workloads::load_checkpoint(dir_ / ckpt);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(b->epoch, 3);
    EXPECT_EQ(a->params, b->params);
    EXPECT_EQ(a->momentum, b->momentum);
  }
  TempDir dir_;
};

// Rank 1 SIGKILLs itself at its 25th all_reduce (epoch 2): rank 0, waiting
// in the same all_reduce, is stopped at once, the group restarts from the
// epoch-1 checkpoint and ends where an uninterrupted run ends.
TEST_F(Sgd, RankKilledMidAllReduceResumesToTheSameWeights) {
  CommandResult r =
      run("killed", {"--max-restarts", "1"},
          {{"DLAUNCH_COMM_FAULTS", "kill:rank=1:op=all_reduce:call=25"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dlaunch comm: fault injected: "
                               "kill:rank=1:op=all_reduce:call=25 (call 25 of "
                               "all_reduce): raising SIGKILL"));
  EXPECT_THAT(r.err, HasSubstr("local rank 1 (pid "));
  // The restart line says it was injected (comm told the agent).
  EXPECT_THAT(r.err, HasSubstr("failed with signal SIGKILL (9) (injected: "
                               "kill:rank=1:op=all_reduce:call=25); "
                               "restarting"));
  EXPECT_THAT(r.out, HasSubstr("resuming after epoch 1"));
  nlohmann::json s = summary(dir_.path(), "killed");
  EXPECT_EQ(s["attempts"][0]["workers"][1]["injected_by"], "comm");
  // Rank 0 was stopped by the agent, not left to time out.
  EXPECT_TRUE(s["attempts"][0]["workers"][0]["stopped_by_agent"].get<bool>());
  EXPECT_TRUE(none_marked(run_mark("killed"), 30s));
  expect_same_weights_as_clean_run("killed");
}

// Rank 1 freezes (SIGSTOP) as it calls its 20th all_reduce; rank 0 waits
// in it. --hang-timeout finds rank 1 (the lowest progress), SIGKILLs it,
// and the restarted group finishes with the clean run's weights. The
// timeout is 5 s: after its last all_reduce a rank evaluates and writes
// its checkpoint, which took over 1 s on a loaded machine (a 1 s timeout
// called the restarted rank 1 hung there).
TEST_F(Sgd, FrozenRankIsFoundHungAndNamedWithItsOperation) {
  CommandResult r =
      run("frozen", {"--max-restarts", "1", "--hang-timeout", "5"},
          {{"DLAUNCH_COMM_FAULTS",
            "kill:rank=1:op=all_reduce:call=20:signal=STOP"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("dlaunch: hang: no progress for 5 s "
                               "(--hang-timeout); stuck: rank 1 (local rank 1, "
                               "pid "));
  EXPECT_THAT(r.err, HasSubstr(") in between operations (last: all_reduce) at "
                               "progress "));
  EXPECT_THAT(r.err, HasSubstr("(others up to "));
  EXPECT_THAT(r.err, HasSubstr("(hung in between operations (last: "
                               "all_reduce)) (injected: "
                               "kill:rank=1:op=all_reduce:call=20:signal=STOP);"
                               " restarting"));
  nlohmann::json s = summary(dir_.path(), "frozen");
  const nlohmann::json& w = s["attempts"][0]["workers"];
  EXPECT_TRUE(w[1]["hung"].get<bool>());
  EXPECT_FALSE(w[0]["hung"].get<bool>());
  EXPECT_EQ(w[1]["signal"], "SIGKILL");
  // The frozen rank (a stopped process ignores SIGTERM) is gone too.
  EXPECT_TRUE(none_marked(run_mark("frozen"), 30s));
  expect_same_weights_as_clean_run("frozen");
}

// Rank 1 opens its training data 10 s after rank 0 (strace delays that
// openat), twice the --hang-timeout (5 s, which a rank's work after its last
// all_reduce does not reach on a loaded machine, as 1 s did): dl-sgd loads its
// data before it joins the group, so rank 0 waits in the group's rendezvous,
// which is not timed, not in a first collective, which is; no rank is called
// hung.
TEST_F(Sgd, ARankLoadingItsDataLateIsNotCalledHung) {
  if (testing::run_command({{"strace", "-V"}, {}, {}, ""}).exit_code != 0) {
    GTEST_SKIP() << "strace is not installed (scripts/setup)";
  }
  const std::string images =
      (fs::path(workloads::kDefaultDataDir) / "train-images-idx3-ubyte.gz")
          .string();
  const std::string sgd = testing::bin("dl-sgd") +
                          " --epochs 1 --limit-train 2000 --limit-test 500 "
                          "--no-checkpoint";
  CommandResult r =
      dlaunch({"--nproc-per-node", "2", "--hang-timeout", "5", "sh", "-c",
               "if [ $RANK = 1 ]; then exec strace -o /dev/null -P " + images +
                   " -e trace=openat -e inject=openat:delay_enter=10000000 " +
                   sgd + "; fi; exec " + sgd},
              {{"DLAUNCH_COMM_TIMEOUT", "60"}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, Not(HasSubstr("hang")));
  EXPECT_THAT(r.out, HasSubstr("[default0]:epoch 1/1 loss "));
}

// DLAUNCH_COMM_FAULTS: fail throws CommError from the call, exit ends the
// process with its code, stall blocks and goes on, and a bad spec is an
// error from init_process_group naming it.
TEST(CommFaults, FailExitStallAndBadSpecs) {
  auto collectives = [](const std::string& faults) {
    return dlaunch(
        {"--nproc-per-node", "2", testing::bin("dl-collectives")},
        {{"DLAUNCH_COMM_FAULTS", faults}, {"DLAUNCH_COMM_TIMEOUT", "30"}});
  };
  CommandResult fail = collectives("fail:rank=1:op=all_reduce:call=2");
  EXPECT_NE(fail.exit_code, 0) << describe(fail);
  // The line comm writes as the fault fires: the CommError's own message can
  // be lost when rank 0 sees rank 1 leave and fails first, and the agent
  // stops rank 1 before it prints.
  EXPECT_THAT(fail.err, HasSubstr("fault injected: "
                                  "fail:rank=1:op=all_reduce:call=2 (call 2 "
                                  "of all_reduce)"));
  CommandResult exit = collectives("exit:rank=0:op=barrier:code=4");
  EXPECT_EQ(exit.exit_code, 4) << describe(exit);
  CommandResult stall = collectives("stall:rank=1:op=broadcast:for=0.2");
  EXPECT_EQ(stall.exit_code, 0) << describe(stall);
  EXPECT_THAT(stall.err, HasSubstr("stalling 0.2 s"));
  // Another attempt's fault does not fire.
  CommandResult later = collectives("fail:rank=1:op=all_reduce:attempt=1");
  EXPECT_EQ(later.exit_code, 0) << describe(later);
  CommandResult bad = collectives("fail:rank=1:op=allreduce");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("DLAUNCH_COMM_FAULTS: fault "
                                 "'fail:rank=1:op=allreduce': op='allreduce' "
                                 "is not an operation"));
}

// A comm fault that ends its worker is reported as injected like the
// launcher's own: the report's root cause, summary.json's worker record and
// its faults list (source "comm"); one that ends nothing is listed as fired
// and marks no worker. A rank outside the world is an error naming the spec.
TEST(CommFaults, TheReportAndSummarySayInjected) {
  TempDir dir;
  auto collectives = [&](const std::string& id, const std::string& faults,
                         std::vector<std::string> flags = {}) {
    std::vector<std::string> args = {"--nproc-per-node", "2",
                                     "--log-dir",        dir.path().string(),
                                     "--rdzv-id",        id};
    args.insert(args.end(), flags.begin(), flags.end());
    args.push_back(testing::bin("dl-collectives"));
    return dlaunch(args, {{"DLAUNCH_COMM_FAULTS", faults},
                          {"DLAUNCH_COMM_TIMEOUT", "30"}});
  };
  CommandResult r = collectives("killed", "kill:rank=1:op=all_reduce:call=2");
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  EXPECT_THAT(
      r.err,
      HasSubstr("    injected   : fault kill:rank=1:op=all_reduce:call=2 "
                "(DLAUNCH_COMM_FAULTS: comm caused this failure on "
                "purpose)\n"));
  nlohmann::json s = summary(dir.path(), "killed");
  EXPECT_EQ(s["root_cause"]["rank"], 1) << s.dump(2);
  EXPECT_EQ(s["root_cause"]["injected_fault"],
            "kill:rank=1:op=all_reduce:call=2");
  EXPECT_EQ(s["root_cause"]["injected_by"], "comm");
  EXPECT_TRUE(s["attempts"][0]["workers"][0]["injected_fault"].is_null());
  ASSERT_EQ(s["faults"].size(), 1u) << s.dump(2);
  const nlohmann::json& f = s["faults"][0];
  EXPECT_EQ(f["spec"], "kill:rank=1:op=all_reduce:call=2");
  EXPECT_EQ(f["source"], "comm");
  EXPECT_EQ(f["action"], "raising SIGKILL");
  EXPECT_EQ(f["pid"], s["attempts"][0]["workers"][1]["pid"]);
  EXPECT_FALSE(f["detected"].is_null());

  // With a restart: the restart line says injected, the drill's table
  // lists it, and the group runs again.
  r = collectives("restarted", "exit:rank=0:op=barrier:code=4",
                  {"--max-restarts", "1"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("failed with exit code 4 (injected: "
                               "exit:rank=0:op=barrier:code=4); restarting"));
  s = summary(dir.path(), "restarted");
  ASSERT_EQ(s["faults"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["faults"][0]["source"], "comm");
  EXPECT_FALSE(s["faults"][0]["running_again"].is_null());
  EXPECT_EQ(s["attempts"][0]["workers"][0]["injected_by"], "comm");

  // A stall the job survives fired, and failed nobody.
  r = collectives("stalled", "stall:rank=1:op=broadcast:for=0.2");
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  s = summary(dir.path(), "stalled");
  ASSERT_EQ(s["faults"].size(), 1u) << s.dump(2);
  EXPECT_EQ(s["faults"][0]["action"], "stalling 0.2 s");
  EXPECT_TRUE(s["faults"][0]["detected"].is_null());
  EXPECT_TRUE(s["attempts"][0]["workers"][1]["injected_fault"].is_null());

  r = collectives("range", "fail:rank=2:op=all_reduce");
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("DLAUNCH_COMM_FAULTS: fault "
                               "'fail:rank=2:op=all_reduce': rank 2 is out of "
                               "range: 2 workers (ranks 0..1)"));
}

// Ranks 1 and 2 of three stall at the same all_reduce (before entering
// it); rank 0 waits inside it. The hang report names both stuck ranks (the
// lowest progress), each with its operation, and not rank 0; the failure
// report lists both, each injected. (--hang-timeout 5 s: a rank a loaded
// machine leaves unscheduled for 1 s between two calls is not hung.)
TEST(CommFaults, EveryStuckRankIsNamedWithItsOperation) {
  TempDir dir;
  CommandResult r = dlaunch(
      {"--nproc-per-node", "3", "--hang-timeout", "5", "--log-dir",
       dir.path().string(), "--rdzv-id", "two", testing::bin("dl-collectives")},
      {{"DLAUNCH_COMM_FAULTS",
        "stall:rank=1:op=all_reduce:call=3,stall:rank=2:op=all_reduce:call=3"},
       {"DLAUNCH_COMM_TIMEOUT", "60"}});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  std::smatch m;
  std::string err = r.err;
  ASSERT_TRUE(std::regex_search(
      err, m,
      std::regex("dlaunch: hang: no progress for 5 s \\(--hang-timeout\\); "
                 "stuck: rank 1 \\(local rank 1, pid [0-9]+\\) in between "
                 "operations \\(last: all_reduce\\), rank 2 \\(local rank 2, "
                 "pid [0-9]+\\) in between operations \\(last: all_reduce\\) "
                 "at progress ([0-9]+) \\(others up to ([0-9]+)\\); SIGKILL to "
                 "the stuck, SIGTERM to the others\n")))
      << r.err;
  EXPECT_LT(std::stoi(m[1]), std::stoi(m[2]));
  EXPECT_THAT(r.err, HasSubstr("    hung       : no progress within "
                               "--hang-timeout: stuck in between operations "
                               "(last: all_reduce)"));
  EXPECT_THAT(r.err, HasSubstr("    injected   : fault "
                               "stall:rank=1:op=all_reduce:call=3 "
                               "(DLAUNCH_COMM_FAULTS"));
  EXPECT_THAT(r.err, HasSubstr("  also failed: rank 2 (local rank 2, pid "));
  EXPECT_THAT(r.err, HasSubstr("no progress within --hang-timeout: stuck in "
                               "between operations (last: all_reduce) "
                               "(progress counter " +
                               m[1].str() +
                               ") (injected: "
                               "stall:rank=2:op=all_reduce:call=3)\n"));
  nlohmann::json s = summary(dir.path(), "two");
  const nlohmann::json& w = s["attempts"][0]["workers"];
  EXPECT_FALSE(w[0]["hung"].get<bool>()) << s.dump(2);
  EXPECT_TRUE(w[1]["hung"].get<bool>());
  EXPECT_TRUE(w[2]["hung"].get<bool>());
  EXPECT_EQ(w[2]["operation"], "between operations (last: all_reduce)");
  EXPECT_EQ(w[2]["injected_by"], "comm");
  EXPECT_EQ(s["faults"].size(), 2u);
}

// --drill lists the comm faults that fired beside the job's own.
TEST(Drill, ListsCommFaultsThatFired) {
  TempDir dir;
  testing::write_file(dir / "drill.yaml",
                      "program: " + testing::bin("dl-collectives") +
                          "\nnproc_per_node: 2\nmax_restarts: 1\nenv:\n"
                          "  DLAUNCH_COMM_FAULTS: "
                          "kill:rank=1:op=all_reduce:call=2\n"
                          "  DLAUNCH_COMM_TIMEOUT: '30'\n");
  CommandResult r = dlaunch({"--drill", (dir / "drill.yaml").string()});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  std::string out = r.out;
  EXPECT_TRUE(std::regex_search(
      out, m,
      std::regex(
          "comm kill:rank=1:op=all_reduce:call=2 +([0-9.]+) s +([0-9.]+) "
          "s +([0-9.]+) s +ok\n")))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("drill: PASSED\n"));
}

}  // namespace
}  // namespace dlaunch
