// The agent's state machine over a fake Env with a virtual clock: every
// path (success, failure, restarts, escalation, signals, spawn errors)
// without real processes or real time.
#include "agent/agent.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "agent/rendezvous/static_rendezvous.h"
#include "tests/agent/fake_env.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::agent {
namespace {

using testing::Behaviour;
using testing::env_value;
using testing::FakeEnv;
using ::testing::HasSubstr;
using ::testing::Not;
using ms = std::chrono::milliseconds;

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() {
    options.entrypoint = {"/bin/true", "--rank", "${local_rank}"};
    options.nproc_per_node = 4;
    options.log_dir = dir.path();
    options.run_id = "job";
    base_env = {{"PATH", "/usr/bin:/bin"}, {"HOME", "/root"}};
  }

  // Workers that ignore SIGTERM, and SIGTERM at 50 ms and at `second`.
  RunResult run_with_two_sigterms(ms second) {
    env.behave = [](const ProcessSpec&, int) {
      Behaviour b;
      b.never_exits = true;
      b.ignores_stop = true;
      return b;
    };
    env.raise_at(ms(50), SIGTERM);
    env.raise_at(second, SIGTERM);
    return run();
  }

  RunResult run() {
    rendezvous::StaticRendezvous rdzv(
        options.master_addr, options.master_port,
        [this](const std::string& h) { return env.free_port(h); });
    Agent agent(options, env, rdzv, base_env,
                [this](const std::string& m) { messages += m; });
    return agent.run();
  }

  std::vector<int> signals_to(int pid) {
    std::vector<int> out;
    for (const auto& s : env.signals_sent) {
      if (s.pid == pid) out.push_back(s.sig);
    }
    return out;
  }

  dlaunch::testing::TempDir dir;
  AgentOptions options;
  EnvMap base_env;
  FakeEnv env;
  std::string messages;
};

TEST_F(AgentTest, AllWorkersSucceedGivesExitZeroAndOneAttempt) {
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 0);
  ASSERT_EQ(r.attempts.size(), 1u);
  EXPECT_EQ(r.attempts[0].outcome, "succeeded");
  ASSERT_EQ(env.spawned.size(), 4u);
  EXPECT_TRUE(env.signals_sent.empty());
  EXPECT_EQ(r.root_cause(), nullptr);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "job" / "summary.json"));
}

TEST_F(AgentTest, SetsTheWholeEnvContract) {
  base_env["OMP_NUM_THREADS"] = "7";
  run();
  ASSERT_EQ(env.spawned.size(), 4u);
  const ProcessSpec& s = env.spawned[2];
  EXPECT_EQ(s.core_slot, -1);  // no --cpu-bind: runs wherever dlaunch may
  EXPECT_EQ(env_value(s, "RANK"), "2");
  EXPECT_EQ(env_value(s, "LOCAL_RANK"), "2");
  EXPECT_EQ(env_value(s, "WORLD_SIZE"), "4");
  EXPECT_EQ(env_value(s, "LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(env_value(s, "GROUP_RANK"), "0");
  EXPECT_EQ(env_value(s, "GROUP_WORLD_SIZE"), "1");
  EXPECT_EQ(env_value(s, "ROLE_NAME"), "default");
  EXPECT_EQ(env_value(s, "ROLE_RANK"), "2");
  EXPECT_EQ(env_value(s, "ROLE_WORLD_SIZE"), "4");
  EXPECT_EQ(env_value(s, "MASTER_ADDR"), "127.0.0.1");
  EXPECT_EQ(env_value(s, "MASTER_PORT"), "20000");
  EXPECT_EQ(env_value(s, "TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_EQ(env_value(s, "TORCHELASTIC_MAX_RESTARTS"), "0");
  EXPECT_EQ(env_value(s, "TORCHELASTIC_RUN_ID"), "job");
  EXPECT_EQ(env_value(s, "TORCHELASTIC_USE_AGENT_STORE"), "False");
  EXPECT_EQ(env_value(s, "TORCHELASTIC_ERROR_FILE"),
            (dir.path() / "job" / "attempt_0" / "2" / "error.json").string());
  EXPECT_EQ(env_value(s, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(env_value(s, "OMP_NUM_THREADS"), "7");  // the user's wins
  EXPECT_EQ(env_value(s, "HOME"), "/root");         // inherited
  EXPECT_EQ(s.argv, (std::vector<std::string>{"/bin/true", "--rank", "2"}));
  EXPECT_EQ(s.prefix, "[default2]:");
  EXPECT_EQ(messages.find("OMP_NUM_THREADS"), std::string::npos);
}

// --cpu-bind core: local rank L asks for core slot L (the default, -1,
// binds nothing: SetsTheWholeEnvContract).
TEST_F(AgentTest, CpuBindCoreGivesEachLocalRankItsCoreSlot) {
  options.cpu_binding = CpuBinding::kCore;
  ASSERT_EQ(run().exit_code, 0);
  ASSERT_EQ(env.spawned.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(env.spawned[i].core_slot,
              std::stoi(env_value(env.spawned[i], "LOCAL_RANK")));
  }
}

TEST_F(AgentTest, SetsOmpNumThreadsAndSaysSoWhenUnset) {
  run();
  EXPECT_EQ(env_value(env.spawned[0], "OMP_NUM_THREADS"), "1");
  EXPECT_THAT(messages, HasSubstr("OMP_NUM_THREADS=1"));
}

TEST_F(AgentTest, FailureStopsTheOthersAndReportsTheRootCause) {
  env.behave = [](const ProcessSpec& s, int) {
    Behaviour b;
    if (env_value(s, "LOCAL_RANK") == "2") {
      b.runs_for = ms(5);
      b.exit = ExitStatus{3, 0};
      b.error_file_text =
          R"({"message": {"message": "ValueError: bad shard"}})";
    } else {
      b.never_exits = true;
    }
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 3);
  ASSERT_EQ(r.attempts.size(), 1u);
  const WorkerRecord* root = r.root_cause();
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->local_rank, 2);
  EXPECT_EQ(root->error_message, "ValueError: bad shard");
  for (int pid : {1000, 1001, 1003}) {
    EXPECT_EQ(signals_to(pid), std::vector<int>{SIGTERM}) << pid;
  }
  EXPECT_TRUE(r.attempts[0].workers[0].stopped_by_agent);
  EXPECT_THAT(messages, HasSubstr("root cause"));
  EXPECT_THAT(messages, HasSubstr("rank       : 2 (local rank 2)"));
  EXPECT_THAT(messages, HasSubstr("exit code 3"));
  EXPECT_THAT(messages, HasSubstr("ValueError: bad shard"));
  std::string summary =
      dlaunch::testing::read_file(dir.path() / "job" / "summary.json");
  EXPECT_THAT(summary, HasSubstr("\"exit_code\": 3"));
  EXPECT_THAT(summary, HasSubstr("ValueError: bad shard"));
}

TEST_F(AgentTest, RestartsWithACountAndAFreshPortUntilSuccess) {
  options.max_restarts = 3;
  env.behave = [](const ProcessSpec& s, int) {
    Behaviour b;
    if (env_value(s, "TORCHELASTIC_RESTART_COUNT") == "0" &&
        env_value(s, "LOCAL_RANK") == "1") {
      b.exit = ExitStatus{1, 0};
      b.runs_for = ms(2);
    }
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 0);
  ASSERT_EQ(r.attempts.size(), 2u);
  EXPECT_EQ(r.attempts[0].outcome, "failed");
  EXPECT_EQ(r.attempts[1].outcome, "succeeded");
  ASSERT_EQ(env.spawned.size(), 8u);
  EXPECT_EQ(env_value(env.spawned[4], "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(env_value(env.spawned[4], "TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_NE(env_value(env.spawned[0], "MASTER_PORT"),
            env_value(env.spawned[4], "MASTER_PORT"));
  EXPECT_THAT(env_value(env.spawned[4], "TORCHELASTIC_ERROR_FILE"),
              HasSubstr("attempt_1"));
  EXPECT_THAT(messages,
              HasSubstr("restarting the worker group (restart 1 of 3)"));
}

TEST_F(AgentTest, GivesUpWhenRestartsRunOutWithTheLastRootCause) {
  options.max_restarts = 2;
  env.behave = [](const ProcessSpec& s, int) {
    Behaviour b;
    if (env_value(s, "LOCAL_RANK") == "3") {
      b.exit = ExitStatus{0, SIGSEGV};
      b.runs_for = ms(1);
    } else {
      b.never_exits = true;
    }
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV);
  EXPECT_EQ(r.attempts.size(), 3u);
  EXPECT_THAT(messages, HasSubstr("signal SIGSEGV (11)"));
}

TEST_F(AgentTest, SigkillFollowsTermTimeoutForWorkersIgnoringSigterm) {
  options.term_timeout = std::chrono::seconds(30);
  env.behave = [](const ProcessSpec& s, int) {
    Behaviour b;
    if (env_value(s, "LOCAL_RANK") == "0") {
      b.exit = ExitStatus{5, 0};
    } else {
      b.never_exits = true;
      b.ignores_stop = true;
    }
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_EQ(signals_to(1001), (std::vector<int>{SIGTERM, SIGKILL}));
  bool killed_at_30s = false;
  for (const auto& s : env.signals_sent) {
    if (s.sig == SIGKILL)
      killed_at_30s = s.at == ms(10) + std::chrono::seconds(30);
  }
  EXPECT_TRUE(killed_at_30s);
  EXPECT_THAT(messages, HasSubstr("still running 30 s after being signalled"));
}

TEST_F(AgentTest, AWorkerThatSurvivesSigkillIsAbandonedAfterKillTimeout) {
  options.term_timeout = ms(100);
  options.kill_timeout = ms(500);
  env.behave = [](const ProcessSpec& s, int) {
    Behaviour b;
    if (env_value(s, "LOCAL_RANK") == "0") {
      b.exit = ExitStatus{1, 0};
    } else if (env_value(s, "LOCAL_RANK") == "1") {
      b.never_exits = true;
      b.stuck = true;
    } else {
      b.never_exits = true;
    }
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(env.virtual_now(), ms(10 + 100 + 500));
  EXPECT_THAT(
      messages,
      HasSubstr("local rank 1 (pid 1001) did not exit within 500 ms after "
                "SIGKILL; abandoning"));
  EXPECT_FALSE(r.attempts[0].workers[1].status.has_value());
}

TEST_F(AgentTest, StopSignalIsForwardedAndExitIs128PlusSignalWithoutRestart) {
  options.max_restarts = 5;
  env.behave = [](const ProcessSpec&, int) {
    Behaviour b;
    b.never_exits = true;
    return b;
  };
  env.raise_at(ms(50), SIGINT);
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 128 + SIGINT);
  EXPECT_EQ(r.attempts.size(), 1u);
  EXPECT_EQ(signals_to(1000), std::vector<int>{SIGINT});
  EXPECT_EQ(r.attempts[0].outcome, "stopped by SIGINT");
  EXPECT_EQ(r.root_cause(), nullptr);
  EXPECT_THAT(messages,
              HasSubstr("received SIGINT; forwarding it to 4 worker(s)"));
}

TEST_F(AgentTest, ASecondStopSignalKillsAtOnce) {
  RunResult r = run_with_two_sigterms(ms(1060));
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(signals_to(1002), (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_EQ(env.virtual_now(), ms(1060));
}

// timeout(1) sends its SIGTERM to dlaunch and then to dlaunch's process
// group: one request, twice at once. It once counted as a second Ctrl-C
// and SIGKILLed the workers at once, with no grace period.
TEST_F(AgentTest, OneStopSignalDeliveredTwiceAtOnceKeepsTheGracePeriod) {
  options.term_timeout = std::chrono::seconds(30);
  RunResult r = run_with_two_sigterms(ms(50));
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(signals_to(1002), (std::vector<int>{SIGTERM, SIGKILL}));
  EXPECT_EQ(env.virtual_now(), ms(50) + std::chrono::seconds(30));
  EXPECT_THAT(messages, HasSubstr("received SIGTERM again within 1 s, taken "
                                  "as the same request"));
}

// A group that cannot start, restarted many times: each restart once
// nested a call chain in the last, and the agent crashed (SIGSEGV) after
// some 12,000.
TEST_F(AgentTest, ManyRestartsOfAGroupThatCannotStartEndCleanly) {
  options.nproc_per_node = 1;
  options.max_restarts = 30000;
  options.log_dir.clear();  // 30,001 attempt folders would take a minute
  env.fail_spawn = [](const ProcessSpec&) { return true; };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(r.attempts.size(), 30001u);
}

TEST_F(AgentTest, Usr1IsForwardedAndTheJobGoesOn) {
  env.behave = [](const ProcessSpec&, int) {
    Behaviour b;
    b.runs_for = ms(100);
    return b;
  };
  env.raise_at(ms(10), SIGUSR1);
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(signals_to(1003), std::vector<int>{SIGUSR1});
  EXPECT_THAT(env.handled_signals, ::testing::Contains(SIGUSR2));
}

TEST_F(AgentTest, AMissingProgramExits127BeforeAnySpawn) {
  options.entrypoint = {"definitely-not-a-program-xyz"};
  options.max_restarts = 3;
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_TRUE(env.spawned.empty());
  EXPECT_THAT(
      messages,
      HasSubstr("'definitely-not-a-program-xyz': command not found in PATH"));
}

TEST_F(AgentTest, ANonExecutableFileExits127) {
  dlaunch::testing::write_file(dir / "script", "echo hi\n", 0644);
  options.entrypoint = {(dir / "script").string()};
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(messages, HasSubstr("not executable"));
}

TEST_F(AgentTest, ASpawnFailureIsTheRootCauseWithExit127) {
  env.fail_spawn = [](const ProcessSpec& s) {
    return env_value(s, "LOCAL_RANK") == "2";
  };
  env.behave = [](const ProcessSpec&, int) {
    Behaviour b;
    b.never_exits = true;
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(env.spawned.size(), 2u);  // ranks 0, 1; 3 never started
  EXPECT_EQ(signals_to(1000), std::vector<int>{SIGTERM});
  ASSERT_NE(r.root_cause(), nullptr);
  EXPECT_EQ(r.root_cause()->local_rank, 2);
  EXPECT_THAT(messages, HasSubstr("could not start: fake: cannot execute"));
}

TEST_F(AgentTest, RedirectTeeAndFilterChooseEachStreamsTargets) {
  options.redirects = parse_streams("1");  // stdout to files only
  options.tee = parse_streams("0:2,1:2");  // stderr of ranks 0,1 teed
  options.local_ranks_filter = std::set<int>{0, 2};
  run();
  const std::string attempt = (dir.path() / "job" / "attempt_0").string();
  // rank 0: stdout file only; stderr file + console.
  EXPECT_EQ(env.spawned[0].out.console_fd, -1);
  EXPECT_EQ(env.spawned[0].out.file, attempt + "/0/stdout.log");
  EXPECT_EQ(env.spawned[0].err.console_fd, 2);
  EXPECT_EQ(env.spawned[0].err.file, attempt + "/0/stderr.log");
  // rank 1: filtered off the console.
  EXPECT_EQ(env.spawned[1].err.console_fd, -1);
  EXPECT_EQ(env.spawned[1].err.file, attempt + "/1/stderr.log");
  // rank 2: stderr console only.
  EXPECT_EQ(env.spawned[2].err.console_fd, 2);
  EXPECT_TRUE(env.spawned[2].err.file.empty());
}

TEST_F(AgentTest, PrefixTemplateComesFromTheEnvironment) {
  base_env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] =
      "${role_name}/${rank}|${local_rank}> ";
  options.role = "trainer";
  run();
  EXPECT_EQ(env.spawned[3].prefix, "trainer/3|3> ");
  EXPECT_EQ(env_value(env.spawned[3], "ROLE_NAME"), "trainer");
}

TEST_F(AgentTest, WithoutLogDirTheTemporaryFolderIsRemoved) {
  options.log_dir.clear();
  base_env["TMPDIR"] = dir.path().string();
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(r.run_dir));
  EXPECT_TRUE(r.summary_file.empty());
  // Should the agent be killed, its watchdog removes the folder instead.
  EXPECT_EQ(env.orphan_dir, r.run_dir);
}

// Logs without --log-dir go to a temporary folder, named once at the
// start (it was named only when a worker failed).
TEST_F(AgentTest, ATemporaryLogFolderIsNamedAtTheStart) {
  options.log_dir.clear();
  base_env["TMPDIR"] = dir.path().string();
  for (const char* flag : {"redirects", "tee"}) {
    SCOPED_TRACE(flag);
    options.redirects = parse_streams(flag == std::string("tee") ? "0" : "3");
    options.tee = parse_streams(flag == std::string("tee") ? "0:1" : "0");
    messages.clear();
    RunResult r = run();
    EXPECT_EQ(r.exit_code, 0);
    const std::string line = "dlaunch: no --log-dir given; the logs go to " +
                             r.run_dir.string() + "\n";
    EXPECT_THAT(messages, HasSubstr(line));
    EXPECT_EQ(messages.find(line), messages.rfind(line)) << "once";
  }
  // TMPDIR with a trailing '/': the folder is named without "//".
  base_env["TMPDIR"] = dir.path().string() + "/";
  messages.clear();
  RunResult slash = run();
  EXPECT_EQ(slash.run_dir.parent_path(), dir.path());
  EXPECT_THAT(messages, Not(HasSubstr("//")));
  // Nothing to name without logs, or with the user's own folder.
  options.tee = parse_streams("0");
  options.redirects = parse_streams("0");
  messages.clear();
  run();
  options.log_dir = dir.path() / "logs";
  options.tee = parse_streams("3");
  run();
  EXPECT_THAT(messages, Not(HasSubstr("--log-dir")));
}

TEST_F(AgentTest, FoldersWithLogsAreNeverLeftToTheWatchdog) {
  options.log_dir.clear();
  base_env["TMPDIR"] = dir.path().string();
  options.tee = parse_streams("3");
  RunResult r = run();
  EXPECT_TRUE(std::filesystem::exists(r.run_dir));
  EXPECT_TRUE(env.orphan_dir.empty());
  options.log_dir = dir.path() / "logs";  // the user's folder: never
  options.tee = parse_streams("0");
  run();
  EXPECT_TRUE(env.orphan_dir.empty());
}

}  // namespace
}  // namespace dlaunch::agent

namespace dlaunch::agent {
namespace {

// Injected faults (agent/fault.h) over the fake Env: when and where each
// fires, what stopping the group then does, and out-of-range targets.
class AgentFaultTest : public AgentTest {};

TEST_F(AgentFaultTest, AKillFiresAtItsTimeInItsAttemptOnly) {
  options.max_restarts = 1;
  options.faults = {parse_fault("kill:rank=2:after=2")};
  env.behave = [](const ProcessSpec&, int spawn) {
    Behaviour b;
    b.never_exits = spawn < 4;  // the first group runs until stopped
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 0) << messages;
  ASSERT_EQ(r.attempts.size(), 2u);
  const WorkerRecord& victim = r.attempts[0].workers[2];
  EXPECT_EQ(victim.injected_fault, "kill:rank=2:after=2");
  ASSERT_FALSE(env.signals_sent.empty());
  EXPECT_EQ(env.signals_sent[0].pid, victim.pid);
  EXPECT_EQ(env.signals_sent[0].sig, SIGKILL);
  EXPECT_EQ(env.signals_sent[0].at, ms(2000));
  ASSERT_EQ(r.faults.size(), 1u);
  EXPECT_EQ(r.faults[0].fired, WallTime(ms(2000)));
  EXPECT_EQ(r.faults[0].detected, WallTime(ms(2000)));
  EXPECT_EQ(r.faults[0].running_again, r.attempts[1].start_time);
  // The restarted group (restart count 1) gets no fault.
  for (const auto& w : r.attempts[1].workers) {
    EXPECT_TRUE(w.injected_fault.empty());
  }
  EXPECT_THAT(messages,
              HasSubstr("dlaunch: fault injected: kill:rank=2:after=2: "
                        "SIGKILL to rank 2 (local rank 2, pid "));
}

TEST_F(AgentFaultTest, AFrozenRankGetsSigkillWhenTheGroupStops) {
  options.faults = {parse_fault("stop:rank=1:after=1")};
  env.behave = [](const ProcessSpec& s, int) {
    Behaviour b;
    if (env_value(s, "LOCAL_RANK") == "0") {
      b.runs_for = ms(1500);
      b.exit = ExitStatus{3, 0};
    } else {
      b.never_exits = true;
    }
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 3);
  const int frozen = r.attempts[0].workers[1].pid;
  EXPECT_EQ(signals_to(frozen), (std::vector<int>{SIGSTOP, SIGKILL}));
  EXPECT_EQ(signals_to(r.attempts[0].workers[2].pid),
            (std::vector<int>{SIGTERM}));
  EXPECT_TRUE(r.attempts[0].workers[1].frozen);
  // The stop did not end the job before the timeout: rank 0's exit did.
  EXPECT_EQ(r.root_cause()->local_rank, 0);
}

TEST_F(AgentFaultTest, AnExitFaultRecordsItsCode) {
  options.faults = {parse_fault("exit:rank=3:code=9:after=0.5")};
  env.behave = [](const ProcessSpec&, int) {
    Behaviour b;
    b.never_exits = true;
    return b;
  };
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 9);
  ASSERT_NE(r.root_cause(), nullptr);
  EXPECT_EQ(r.root_cause()->local_rank, 3);
  EXPECT_EQ(r.root_cause()->status->code, 9);
  EXPECT_EQ(r.root_cause()->injected_fault, "exit:rank=3:code=9:after=0.5");
}

TEST_F(AgentFaultTest, ARankOutsideTheRoundStartsNothingAndExits2) {
  options.faults = {parse_fault("kill:rank=4")};
  RunResult r = run();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(env.spawned.empty());
  EXPECT_THAT(messages, HasSubstr("dlaunch: fault 'kill:rank=4': rank 4 is "
                                  "out of range: 4 workers (ranks 0..3) in "
                                  "round 0; give a target that exists"));
}

}  // namespace
}  // namespace dlaunch::agent
