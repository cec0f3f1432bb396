// `dlaunch` end to end: the real binary, real worker processes (sh), real
// signals. Each test takes well under a few seconds.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "agent/cpu_cores.h"
#include "tests/testing/bin.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::read_file;
using testing::Subprocess;
using testing::TempDir;
using namespace std::chrono_literals;

const std::string kDlaunch = testing::bin("dlaunch");

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// dlaunch ARGS..., run to the end.
CommandResult dlaunch(std::vector<std::string> args,
                      std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), kDlaunch);
  return testing::run_command({args, env, {}, ""}, 60s);
}

// dlaunch --nproc-per-node N sh -c SCRIPT with extra flags first.
CommandResult sh(int n, const std::string& script,
                 std::vector<std::string> flags = {},
                 std::map<std::string, std::string> env = {}) {
  std::vector<std::string> args = {"--nproc-per-node", std::to_string(n)};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {"sh", "-c", script});
  return dlaunch(args, env);
}

TEST(Launch, SetsTheEnvContractAndAFreeMasterPort) {
  CommandResult r =
      sh(3,
         "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE "
         "LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE "
         "RN=$ROLE_NAME RR=$ROLE_RANK RW=$ROLE_WORLD_SIZE "
         "A=$MASTER_ADDR RC=$TORCHELASTIC_RESTART_COUNT "
         "MR=$TORCHELASTIC_MAX_RESTARTS ID=$TORCHELASTIC_RUN_ID "
         "AS=$TORCHELASTIC_USE_AGENT_STORE OMP=$OMP_NUM_THREADS "
         "NCCL=$TORCH_NCCL_ASYNC_ERROR_HANDLING\"",
         {"--rdzv-id", "e2e", "--max-restarts", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int i = 0; i < 3; ++i) {
    std::string want =
        "[default" + std::to_string(i) + "]:R=" + std::to_string(i) +
        " L=" + std::to_string(i) +
        " W=3 LW=3 G=0 GW=1 RN=default RR=" + std::to_string(i) +
        " RW=3 A=127.0.0.1 RC=0 MR=1 ID=e2e AS=False OMP=1 NCCL=1";
    EXPECT_THAT(r.out, HasSubstr(want + "\n"));
  }
}

// --gpu-binding per-rank: each real worker process sees its own entry of
// the user's CUDA_VISIBLE_DEVICES (or its local rank) and device 0.
TEST(Launch, GpuBindingPerRankGivesEachWorkerItsOwnGpu) {
  const std::string show =
      "echo \"CVD=$CUDA_VISIBLE_DEVICES D=$DLAUNCH_CUDA_DEVICE\"";
  CommandResult r = sh(3, show, {"--gpu-binding", "per-rank"},
                       {{"CUDA_VISIBLE_DEVICES", "7,GPU-x,2"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:CVD=7 D=0\n"));
  EXPECT_THAT(r.out, HasSubstr("[default1]:CVD=GPU-x D=0\n"));
  EXPECT_THAT(r.out, HasSubstr("[default2]:CVD=2 D=0\n"));
  r = sh(2, show, {"--gpu-binding", "per-rank"},
         {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default1]:CVD=1 D=0\n"));
  // The default leaves the user's list alone and sets no device.
  r = sh(2, show, {}, {{"CUDA_VISIBLE_DEVICES", "7,5"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default1]:CVD=7,5 D=\n"));
  r = sh(3, show, {"--gpu-binding", "per-rank"},
         {{"CUDA_VISIBLE_DEVICES", "7,5"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("CUDA_VISIBLE_DEVICES=7,5 lists 2"));
}

// The CPUs in a Cpus_allowed_list value ("0-2,5").
std::set<int> cpu_list(const std::string& text) {
  std::set<int> out;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const size_t dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi =
        dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) out.insert(c);
  }
  return out;
}

// --cpu-bind core: each real worker (and its children) may run on one core
// only, local rank L on core L mod N of the N cores dlaunch may use, in
// the order of their lowest CPU; without it, wherever dlaunch may.
TEST(Launch, CpuBindCorePinsEachLocalRankToItsOwnCore) {
  const std::vector<std::vector<int>> cores = agent::allowed_cores();
  ASSERT_FALSE(cores.empty());
  std::set<int> all;
  for (const auto& core : cores) all.insert(core.begin(), core.end());
  // A child of the worker reports, so inheritance is checked too.
  const std::string show =
      "sh -c 'grep Cpus_allowed_list: /proc/self/status' | "
      "sed \"s/^/L=$LOCAL_RANK /\"";
  const int n = 3;
  for (const bool bind : {false, true}) {
    CommandResult r = sh(n, show,
                         bind ? std::vector<std::string>{"--cpu-bind", "core"}
                              : std::vector<std::string>{});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::map<int, std::set<int>> got;
    std::regex line(R"(L=(\d+) Cpus_allowed_list:\s*(\S+))");
    for (const std::string& l : lines_of(r.out)) {
      std::smatch m;
      if (std::regex_search(l, m, line)) got[std::stoi(m[1])] = cpu_list(m[2]);
    }
    ASSERT_EQ(got.size(), static_cast<size_t>(n)) << r.out;
    for (int l = 0; l < n; ++l) {
      const auto& core = cores[l % cores.size()];
      EXPECT_EQ(got[l], bind ? std::set<int>(core.begin(), core.end()) : all)
          << "local rank " << l << (bind ? " bound" : " unbound");
    }
  }
}

TEST(Launch, RankZeroCanBindMasterPort) {
  // Rank 0 serves the store on MASTER_PORT itself (torch's env:// does).
  CommandResult r = sh(2,
                       "if [ $RANK = 0 ]; then /usr/bin/python3 -c \"import "
                       "socket,os; s=socket.socket(); "
                       "s.bind((os.environ['MASTER_ADDR'], "
                       "int(os.environ['MASTER_PORT']))); print('bound', "
                       "os.environ['MASTER_PORT'])\"; fi");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:bound "));
}

TEST(Launch, WorkersKeepTheUsersOpenFileLimit) {
  // The embedded store raises dlaunch's own soft limit to the hard one;
  // workers must still see the limit dlaunch was started with.
  CommandResult r =
      testing::run_command({{"sh", "-c",
                             "ulimit -Sn 512 && exec " + kDlaunch +
                                 " --standalone sh -c 'ulimit -Sn'"},
                            {},
                            {},
                            ""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[default0]:512\n");
}

// The agent's fds grow with the workers (pipes, pidfds, log files): at a
// soft limit of 1024, 210 workers with log files once failed to start
// ("pipe: Too many open files"). The agent takes the hard limit.
TEST(Launch, ManyWorkersStartUnderTheCommonSoftFdLimit) {
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_max < 4096) {
    GTEST_SKIP() << "the hard open-file limit " << lim.rlim_max
                 << " is below 4096: nothing to raise to";
  }
  TempDir dir;
  CommandResult r = testing::run_command(
      {{"sh", "-c",
        "ulimit -Sn 1024 && exec " + kDlaunch +
            " --nproc-per-node 300 --log-dir " + dir.path().string() +
            " -t 3 sh -c 'ulimit -Sn'"},
       {},
       {},
       ""},
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default299]:1024\n"));
}

TEST(Launch, ReplacesLocalRankInArguments) {
  CommandResult r =
      dlaunch({"--nproc-per-node", "2", "echo", "shard-${local_rank}"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("[default0]:shard-0\n"));
  EXPECT_THAT(r.out, HasSubstr("[default1]:shard-1\n"));
}

TEST(Launch, PrefixesEveryLineAndNeverInterleavesWithinALine) {
  // Each line is written in three pieces (three write() calls).
  CommandResult r =
      sh(4,
         "i=0; while [ $i -lt 300 ]; do printf '%s-' $LOCAL_RANK; "
         "printf '%s-' $LOCAL_RANK; printf '%s\\n' $LOCAL_RANK; "
         "printf 'e%s\\n' $LOCAL_RANK >&2; i=$((i+1)); done; "
         "printf 'tail%s' $LOCAL_RANK");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::regex line(R"(\[default([0-3])\]:(\d)-(\d)-(\d))");
  std::regex tail(R"(\[default([0-3])\]:tail(\d))");
  std::map<std::string, int> count;
  for (const std::string& l : lines_of(r.out)) {
    std::smatch m;
    if (std::regex_match(l, m, line)) {
      EXPECT_TRUE(m[1] == m[2] && m[2] == m[3] && m[3] == m[4]) << l;
      ++count[m[1]];
    } else {
      ASSERT_TRUE(std::regex_match(l, m, tail)) << "torn line: " << l;
      EXPECT_EQ(m[1], m[2]);
    }
  }
  for (const char* rank : {"0", "1", "2", "3"}) EXPECT_EQ(count[rank], 300);
  std::regex err_line(R"(\[default([0-3])\]:e([0-3]))");
  for (const std::string& l : lines_of(r.err)) {
    if (l.rfind("dlaunch:", 0) == 0) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, err_line)) << l;
    EXPECT_EQ(m[1], m[2]);
  }
}

TEST(Launch, ANonBlockingSlowConsoleLosesNoLine) {
  // stdout is a non-blocking pipe nobody reads for a while: dlaunch must
  // wait for room (EAGAIN), not drop or tear lines.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::fcntl(p[1], F_SETFL, ::fcntl(p[1], F_GETFL) | O_NONBLOCK);
  Subprocess d({{kDlaunch, "--nproc-per-node", "4", "sh", "-c",
                 "i=0; while [ $i -lt 2000 ]; do echo "
                 "line-$LOCAL_RANK-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                 "xxxxx; i=$((i+1)); done"},
                {},
                {},
                "",
                p[1]});
  // The pipe fills up long before the 480 KB of output end.
  auto full = [&] {
    pollfd room{p[1], POLLOUT, 0};
    return ::poll(&room, 1, 0) == 0;
  };
  for (int i = 0; i < 2000 && !full(); ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(full()) << "the console pipe never filled";
  ::close(p[1]);
  std::string data;
  char buf[65536];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) data.append(buf, n);
  ::close(p[0]);
  EXPECT_EQ(d.wait(30s).exit_code, 0);
  std::regex line(R"(\[default([0-3])\]:line-([0-3])-x+)");
  std::vector<std::string> lines = lines_of(data);
  EXPECT_EQ(lines.size(), 8000u);
  for (const std::string& l : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    EXPECT_EQ(m[1], m[2]);
  }
}

TEST(Launch, TeeWritesFilesAndConsole) {
  TempDir dir;
  CommandResult r =
      sh(2, "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2",
         {"--log-dir", dir.path().string(), "--run-id", "t", "-t", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default1]:out1\n"));
  EXPECT_THAT(r.err, HasSubstr("[default1]:err1\n"));
  EXPECT_EQ(read_file(dir / "t/attempt_0/1/stdout.log"), "out1\n");
  EXPECT_EQ(read_file(dir / "t/attempt_0/1/stderr.log"), "err1\n");
  auto summary = nlohmann::json::parse(read_file(dir / "t/summary.json"));
  EXPECT_EQ(summary["exit_code"], 0);
  EXPECT_EQ(summary["attempts"][0]["outcome"], "succeeded");
}

TEST(Launch, RedirectSendsStreamsOnlyToFilesPerRank) {
  TempDir dir;
  CommandResult r =
      sh(2, "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2",
         {"--log-dir", dir.path().string(), "--run-id", "t", "-r", "0:3,1:2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("out0")));
  EXPECT_THAT(r.err, Not(HasSubstr("err0")));
  EXPECT_THAT(r.out, HasSubstr("[default1]:out1\n"));  // rank 1: stderr only
  EXPECT_THAT(r.err, Not(HasSubstr("err1")));
  EXPECT_EQ(read_file(dir / "t/attempt_0/0/stdout.log"), "out0\n");
  EXPECT_EQ(read_file(dir / "t/attempt_0/0/stderr.log"), "err0\n");
  EXPECT_EQ(read_file(dir / "t/attempt_0/1/stderr.log"), "err1\n");
  EXPECT_FALSE(std::filesystem::exists(dir / "t/attempt_0/1/stdout.log"));
}

TEST(Launch, LocalRanksFilterHidesOtherRanksFromTheConsole) {
  CommandResult r = sh(3, "echo hi$LOCAL_RANK", {"--local-ranks-filter", "1"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "[default1]:hi1\n");
  EXPECT_THAT(r.err, Not(HasSubstr("warning")));
}

// A filter or a per-rank map naming only ranks this node does not run
// says so (it once showed or logged nothing without a word).
TEST(Launch, LocalRanksThisNodeDoesNotRunAreNamed) {
  // The tee's log outlives the run: in the test's TMPDIR, not /tmp.
  TempDir tmp;
  CommandResult r = sh(2, "echo hi$LOCAL_RANK",
                       {"--local-ranks-filter", "1,5", "-t", "0:1,3:3"},
                       {{"TMPDIR", tmp.path().string()}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[default1]:hi1\n");
  EXPECT_THAT(r.err, HasSubstr("dlaunch: warning: --local-ranks-filter names "
                               "local rank(s) 5, and this node runs local "
                               "ranks 0..1\n"));
  EXPECT_THAT(r.err, HasSubstr("dlaunch: warning: --tee names local rank(s) 3,"
                               " and this node runs local ranks 0..1\n"));
}

TEST(Launch, TeedLinesReachTheFileAsTheyArrive) {
  TempDir dir;
  std::string go = (dir / "go").string();
  Subprocess p({{kDlaunch, "--log-dir", dir.path().string(), "--run-id", "t",
                 "-t", "1", "sh", "-c",
                 "echo first; while [ ! -e " + go + " ]; do sleep 0.02; done"},
                {},
                {},
                ""});
  ASSERT_TRUE(p.wait_for_output("[default0]:first", 60s)) << p.err();
  // The worker still runs: the line must already be in its log file.
  EXPECT_EQ(read_file(dir / "t/attempt_0/0/stdout.log"), "first\n");
  testing::write_file(go, "");
  EXPECT_EQ(p.wait(60s).exit_code, 0);
}

// A progress bar (tqdm redraws its line with '\r') moves on the console
// while its line runs, each redraw with the worker's prefix; the log file
// gets the bytes as written.
TEST(Launch, ProgressRedrawsReachTheConsoleBeforeTheLineEnds) {
  TempDir dir;
  std::string go = (dir / "go").string();
  Subprocess p({{kDlaunch, "--log-dir", dir.path().string(), "--run-id", "t",
                 "-t", "1", "sh", "-c",
                 "printf '\\r 10%%'; while [ ! -e " + go +
                     " ]; do sleep 0.02; done; printf '\\r100%%\\n'"},
                {},
                {},
                ""});
  ASSERT_TRUE(p.wait_for_output("[default0]: 10%\r", 60s)) << p.err();
  testing::write_file(go, "");
  EXPECT_EQ(p.wait(60s).exit_code, 0);
  EXPECT_THAT(p.out(), HasSubstr("[default0]: 10%\r[default0]:100%\n"));
  EXPECT_EQ(read_file(dir / "t/attempt_0/0/stdout.log"), "\r 10%\r100%\n");
}

// `dlaunch ... 2>&1 | tee log`: stdout and stderr are one pipe, which a
// slow reader fills; lines from both streams stay whole (two queues wrote
// into it, and one's partial write was finished after the other's line).
TEST(Launch, StdoutAndStderrIntoOnePipeKeepTheirLinesWhole) {
  const std::string worker =
      "i=0; while [ $i -lt 20000 ]; do echo out $i "
      "oooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooooo;"
      " echo err $i "
      "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"
      " >&2; i=$((i+1)); done";
  CommandResult r =
      testing::run_command({{"sh", "-c",
                             kDlaunch + " --nproc-per-node 2 sh -c '" + worker +
                                 "' 2>&1 | (sleep 0.3; cat)"},
                            {},
                            {},
                            ""},
                           120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream in(r.out);
  const std::regex whole(
      R"(\[default[01]\]:(out [0-9]+ o{70}|err [0-9]+ e{70}))");
  size_t lines = 0, broken = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    if (!line.starts_with("dlaunch: ") && !std::regex_match(line, whole)) {
      ADD_FAILURE_AT(__FILE__, __LINE__) << "cut line: " << line.substr(0, 200);
      if (++broken == 3) break;
    }
  }
  EXPECT_GE(lines, 80000u);
}

// A worker that ends well may leave a child writing the last of its output
// (`exec > >(tee log)`): the child finishes before the worker's group is
// killed (it was killed at the worker's exit, its lines lost).
TEST(Launch, ASucceedingWorkersTeeFinishesItsOutput) {
  TempDir dir;
  const std::string log = (dir / "tee.log").string();
  CommandResult r = dlaunch(
      {"bash", "-c",
       "exec > >(sleep 0.5; tee " + log + ") 2>&1; echo hello; echo world"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[default0]:hello\n[default0]:world\n");
  EXPECT_EQ(read_file(log), "hello\nworld\n");
  // A child that keeps the output open and never ends is given the drain
  // time, no more, and goes with the worker's group: nothing is left.
  const std::string mark = testing::unique_mark("t");
  const auto start = std::chrono::steady_clock::now();
  CommandResult held =
      testing::run_command({{kDlaunch, "sh", "-c", "sleep 300 & echo done"},
                            {{"DLT_MARK", mark}},
                            {},
                            ""},
                           60s);
  EXPECT_EQ(held.exit_code, 0) << held.err;
  EXPECT_EQ(held.out, "[default0]:done\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_TRUE(testing::none_marked(mark, 10s));
}

TEST(Launch, PropagatesTheRootCauseExitCode) {
  CommandResult r = sh(3, "[ $LOCAL_RANK = 1 ] && exit 7; sleep 300");
  EXPECT_EQ(r.exit_code, 7);
  // The sleepers were stopped, not waited for (300 s; sh() gives up at 60).
  EXPECT_FALSE(r.timed_out);
  EXPECT_THAT(r.err, HasSubstr("rank       : 1 (local rank 1)"));
  EXPECT_THAT(r.err, HasSubstr("exit code 7"));
  CommandResult s = sh(1, "kill -SEGV $$");
  EXPECT_EQ(s.exit_code, 128 + SIGSEGV);
  EXPECT_THAT(s.err, HasSubstr("signal SIGSEGV (11)"));
}

TEST(Launch, RestartsCountUpUntilTheWorkersSucceed) {
  TempDir dir;
  CommandResult r =
      sh(2,
         "echo attempt=$TORCHELASTIC_RESTART_COUNT port=$MASTER_PORT; "
         "[ $TORCHELASTIC_RESTART_COUNT -lt 2 ] && [ $LOCAL_RANK = 0 ] "
         "&& exit 3; sleep 0.2",
         {"--max-restarts", "3", "--log-dir", dir.path().string(), "--run-id",
          "r"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* a : {"attempt=0", "attempt=1", "attempt=2"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("[default0]:") + a));
  }
  EXPECT_THAT(r.out, Not(HasSubstr("attempt=3")));
  EXPECT_THAT(r.err, HasSubstr("restarting the worker group (restart 2 of 3)"));
  auto summary = nlohmann::json::parse(read_file(dir / "r/summary.json"));
  ASSERT_EQ(summary["attempts"].size(), 3u);
  EXPECT_EQ(summary["attempts"][0]["outcome"], "failed");
  EXPECT_EQ(summary["attempts"][0]["root_cause_local_rank"], 0);
  EXPECT_EQ(summary["attempts"][2]["outcome"], "succeeded");
  EXPECT_NE(summary["attempts"][0]["master_port"],
            summary["attempts"][1]["master_port"]);
}

// Regression: a pidfd reported readable before its worker exited made the
// agent SIGKILL a freshly restarted worker (about 1 run in 100 with 8
// workers that all fail at once). Many short restarts must all succeed.
TEST(Launch, RestartedWorkersAreNeverKilledByTheAgent) {
  for (int round = 0; round < 150; ++round) {
    CommandResult r = sh(8, "[ $TORCHELASTIC_RESTART_COUNT = 0 ] && exit 1; :",
                         {"--max-restarts", "1"});
    ASSERT_EQ(r.exit_code, 0) << "round " << round << ": " << r.err;
  }
}

TEST(Launch, RestartsRunOutAndTheLastFailureIsReported) {
  CommandResult r = sh(2, "exit $((10 + TORCHELASTIC_RESTART_COUNT))",
                       {"--max-restarts", "2"});
  EXPECT_EQ(r.exit_code, 12);
  EXPECT_THAT(r.err, HasSubstr("exit code 12"));
}

TEST(Launch, ForwardsSigtermToWorkersThatCleanUp) {
  TempDir dir;
  std::string d = dir.path().string();
  Subprocess p({{kDlaunch, "--nproc-per-node", "3", "sh", "-c",
                 "trap 'echo cleaned > " + d +
                     "/clean$LOCAL_RANK; exit 0' TERM; echo ready; "
                     "sleep 300 & wait"},
                {},
                {},
                ""});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(
        p.wait_for_output("[default" + std::to_string(i) + "]:ready", 60s))
        << p.out() << p.err();
  }
  p.signal(SIGTERM);
  // Done without the sleeps' 300 s.
  CommandResult r = p.wait(60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("received SIGTERM; forwarding it to 3 worker(s)"));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(read_file(dir / ("clean" + std::to_string(i))), "cleaned\n");
  }
}

TEST(Launch, SigintStopsWorkersIgnoringItAfterTheTermTimeout) {
  Subprocess p({{kDlaunch, "--nproc-per-node", "2", "--term-timeout", "0.3",
                 "sh", "-c", "trap '' INT; echo ready; sleep 30 & wait"},
                {},
                {},
                ""});
  ASSERT_TRUE(p.wait_for_output("[default1]:ready", 60s));
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 60s));
  p.signal(SIGINT);
  CommandResult r = p.wait(60s);
  EXPECT_EQ(r.exit_code, 128 + SIGINT);
  EXPECT_THAT(
      r.err,
      HasSubstr("still running 300 ms after being signalled; sending SIGKILL"));
}

TEST(Launch, Usr1IsForwardedAndTheJobContinues) {
  Subprocess p(
      {{kDlaunch, "--nproc-per-node", "2", "sh", "-c",
        "trap 'echo got-usr1; exit 0' USR1; echo ready; sleep 30 & wait"},
       {},
       {},
       ""});
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 60s));
  ASSERT_TRUE(p.wait_for_output("[default1]:ready", 60s));
  p.signal(SIGUSR1);
  CommandResult r = p.wait(60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:got-usr1"));
  EXPECT_THAT(r.out, HasSubstr("[default1]:got-usr1"));
}

// The program of process `pid` (/proc/PID/exe); "" when it is gone.
std::string exe_of(pid_t pid) {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe",
                                       ec)
      .string();
}

// The agent's watchdog among `agent`'s descendants: the one whose program
// is `exe`; 0 when none is.
pid_t watchdog_of(pid_t agent, const std::string& exe) {
  for (pid_t p : testing::descendants(agent)) {
    if (exe_of(p) == exe) return p;
  }
  return 0;
}

// A dlaunch run to be SIGKILLed: after the kill, every process its job made
// (found by a mark in their environment: double forks and all) and the
// run's temporary folder must be gone, as before. `watchdog` is what its
// watchdog runs. The job's processes would live 100-300 s: the 30 s bound
// tells a watchdog that ended them from none, on a loaded machine too (1 s
// did not).
class KilledAgent {
 public:
  KilledAgent(const std::string& dlaunch, std::vector<std::string> args) {
    // Random, not this test's pid: a pid comes back (pid_max 32768), and
    // with it the mark of an earlier test's run.
    const std::string id = testing::unique_mark("k");
    mark_ = "DLT_KILLED_AGENT=" + id;
    args.insert(args.begin(), dlaunch);
    // A killed agent cannot remove its run folder: keep it in tmp_.
    p_ = std::make_unique<Subprocess>(testing::CommandOptions{
        args,
        {{"TMPDIR", tmp_.path().string()}, {"DLT_KILLED_AGENT", id}},
        {},
        ""});
  }
  Subprocess& process() { return *p_; }

  // The job's processes: those with the mark but dlaunch and a fork of it.
  std::vector<pid_t> job_processes() const {
    std::vector<pid_t> out;
    for (pid_t pid : testing::processes_with_env(mark_)) {
      if (pid != p_->pid() && exe_of(pid) != exe_of(p_->pid())) {
        out.push_back(pid);
      }
    }
    return out;
  }
  // Waits until the job has `n` processes; false, listing them (pid,
  // parent, program), when it still has another count after 30 s.
  ::testing::AssertionResult has_job_processes(size_t n) const {
    std::vector<pid_t> found;
    if (testing::eventually(
            [&] { return (found = job_processes()).size() == n; }, 30s)) {
      return ::testing::AssertionSuccess();
    }
    auto failure = ::testing::AssertionFailure();
    failure << found.size() << " job processes, not " << n << ":";
    for (pid_t pid : found) {
      failure << "\n  " << pid << " "
              << read_file("/proc/" + std::to_string(pid) + "/stat");
    }
    return failure;
  }

  void kill_and_expect_nothing_left(const std::string& watchdog) {
    // (It execs its program after dlaunch has gone on.)
    EXPECT_TRUE(testing::eventually(
        [&] { return watchdog_of(p_->pid(), watchdog) != 0; }, 30s))
        << "no child of dlaunch runs " << watchdog;
    p_->signal(SIGKILL);
    p_->wait(30s);
    EXPECT_TRUE(testing::eventually(
        [&] { return testing::processes_with_env(mark_).empty(); }, 30s))
        << testing::processes_with_env(mark_).size()
        << " processes outlived the agent by 30 s";
    // The watchdog also removed the run's temporary folder.
    EXPECT_TRUE(testing::eventually(
        [&] {
          return std::filesystem::directory_iterator(tmp_.path()) ==
                 std::filesystem::directory_iterator();
        },
        30s))
        << "the temporary run folder outlived the agent by 30 s";
  }

 private:
  TempDir tmp_;
  std::string mark_;
  std::unique_ptr<Subprocess> p_;
};

TEST(Launch, SigkillOfTheAgentTakesEveryWorkerAndGrandchildWithIt) {
  KilledAgent a(kDlaunch, {"--nproc-per-node", "3", "sh", "-c",
                           "sleep 100 & sleep 100 & echo ready; wait"});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a.process().wait_for_output(
        "[default" + std::to_string(i) + "]:ready", 60s));
  }
  ASSERT_TRUE(a.has_job_processes(9));  // 3 shells + 6 sleeps
  // The watchdog is the small program beside dlaunch, not a fork of it.
  a.kill_and_expect_nothing_left(testing::bin("dlaunch-watchdog"));
}

// What the death signal does not cover: a worker that clears its own
// (PR_SET_PDEATHSIG) and drops the agent's tag from its environment, with
// a child in its group, and a child of a worker that left the group
// (setsid). The watchdog ends the first two by their process group, the
// last by the tag.
const std::string kEscapingWorker =
    "setsid sleep 300 & exec setpriv --pdeathsig clear env -u "
    "DLAUNCH_AGENT_TAG sh -c 'sleep 300 & echo ready; wait'";

TEST(Launch, SigkillTakesWorkersThatClearTheirDeathSignalOrLeaveTheirGroup) {
  KilledAgent a(kDlaunch,
                {"--nproc-per-node", "2", "sh", "-c", kEscapingWorker});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.process().wait_for_output(
        "[default" + std::to_string(i) + "]:ready", 60s));
  }
  ASSERT_TRUE(a.has_job_processes(6));
  a.kill_and_expect_nothing_left(testing::bin("dlaunch-watchdog"));
}

// A dlaunch copied alone (no dlaunch-watchdog beside it) forks itself as
// its watchdog: the same guarantee.
TEST(Launch, DlaunchWithoutItsWatchdogProgramForksOneWithTheSameGuarantee) {
  TempDir bin;
  const std::string copy = (bin / "dlaunch").string();
  std::filesystem::copy_file(kDlaunch, copy);
  KilledAgent a(copy, {"--nproc-per-node", "2", "sh", "-c", kEscapingWorker});
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.process().wait_for_output(
        "[default" + std::to_string(i) + "]:ready", 60s));
  }
  ASSERT_TRUE(a.has_job_processes(6));
  a.kill_and_expect_nothing_left(copy);
  // And a clean run ends it with dlaunch.
  CommandResult r = testing::run_command(
      {{copy, "--nproc-per-node", "2", "true"}, {}, {}, ""}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Killed while it spawns the group (at the first of 8 workers' output), and
// while it spawns the group again after a failure: nothing is left either
// way. (Where the kill lands varies from run to run; each must hold.)
TEST(Launch, SigkillWhileSpawningOrRestartingLeavesNothing) {
  const std::string first =
      "echo up; sleep 300 & setsid sleep 300 & exec sleep 300";
  const std::string again =
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then [ $LOCAL_RANK = 7 ] && "
      "exit 1; exec sleep 300; fi; " +
      first;
  for (const std::string& script : {first, again}) {
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(script + ", round " + std::to_string(round));
      KilledAgent a(kDlaunch, {"--nproc-per-node", "8", "--max-restarts", "1",
                               "sh", "-c", script});
      ASSERT_TRUE(a.process().wait_for_output(":up", 60s)) << a.process().err();
      a.kill_and_expect_nothing_left(testing::bin("dlaunch-watchdog"));
    }
  }
}

// Killed just as its run folder appears: strace holds the mkdir that made
// it for a second before it returns, and the test SIGKILLs dlaunch then.
// The watchdog was given the folder's name before the folder existed, so
// it removes it; had dlaunch started the watchdog after, nobody would.
TEST(Launch, SigkillAsTheRunFolderIsMadeLeavesNothing) {
  if (testing::run_command({{"strace", "-V"}, {}, {}, ""}).exit_code != 0) {
    GTEST_SKIP() << "strace is not installed (scripts/setup)";
  }
  TempDir dir;
  const std::filesystem::path tmp = dir / "tmp";
  const std::filesystem::path pid_file = dir / "pid";
  std::filesystem::create_directory(tmp);
  Subprocess p({{"strace", "-f", "-o", "/dev/null", "-e", "trace=mkdir,mkdirat",
                 "-e", "inject=mkdir,mkdirat:delay_exit=1000000", "sh", "-c",
                 "echo $$ > " + pid_file.string() + "; exec " + kDlaunch +
                     " --nproc-per-node 1 true"},
                {{"TMPDIR", tmp.string()}},
                {},
                ""});
  const auto made = [&] {
    return std::filesystem::directory_iterator(tmp) !=
           std::filesystem::directory_iterator();
  };
  ASSERT_TRUE(testing::eventually(made, 60s)) << "no run folder in " << tmp;
  const pid_t dlaunch_pid = std::stoi(read_file(pid_file));
  ASSERT_EQ(::kill(dlaunch_pid, SIGKILL), 0);
  EXPECT_TRUE(testing::eventually([&] { return !made(); }, 30s))
      << "the run folder outlived dlaunch by 30 s";
  p.wait(20s);
}

// dlaunch-watchdog built without the C library (agent/CMakeLists.txt) has
// no code that applies relocations: as a static PIE it must hold none, or
// it would run with pointers its load address never fixed.
TEST(Launch, TheWatchdogProgramWithoutTheCLibraryNeedsNoRelocation) {
  const std::string watchdog = testing::bin("dlaunch-watchdog");
  CommandResult syms = testing::run_command({{"nm", watchdog}, {}, {}, ""});
  if (syms.out.find(" dlaunch_watchdog_start") == std::string::npos) {
    GTEST_SKIP() << "dlaunch-watchdog is built with the C library here";
  }
  CommandResult r =
      testing::run_command({{"readelf", "-r", "-l", watchdog}, {}, {}, ""});
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_THAT(r.out, HasSubstr("There are no relocations in this file."));
  EXPECT_THAT(r.out, Not(HasSubstr("INTERP")));  // no loader either
}

TEST(Launch, ReportsTheWorkersErrorFileMessage) {
  TempDir dir;
  CommandResult r =
      sh(2,
         "if [ $LOCAL_RANK = 1 ]; then printf '{\"message\": "
         "{\"message\": \"ValueError: shard 1 is corrupt\", "
         "\"extraInfo\": {}}}' > $TORCHELASTIC_ERROR_FILE; exit 4; fi; "
         "sleep 30",
         {"--log-dir", dir.path().string(), "--run-id", "e"});
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_THAT(r.err, HasSubstr("error      : ValueError: shard 1 is corrupt"));
  EXPECT_THAT(r.err,
              HasSubstr("summary    : " + (dir / "e/summary.json").string()));
  auto summary = nlohmann::json::parse(read_file(dir / "e/summary.json"));
  EXPECT_EQ(summary["root_cause"]["error_message"],
            "ValueError: shard 1 is corrupt");
  EXPECT_EQ(summary["root_cause"]["local_rank"], 1);
  EXPECT_EQ(summary["attempts"][0]["workers"][0]["stopped_by_agent"], true);
}

// A worker's error file that is a FIFO no one writes held the agent in
// open() for good; it is passed over now, as any file that is not a
// regular one, and the job ends with the worker's status.
TEST(Launch, AnErrorFileThatIsAFifoDoesNotHoldTheAgent) {
  CommandResult r = sh(1, "mkfifo $TORCHELASTIC_ERROR_FILE; exit 4");
  EXPECT_FALSE(r.timed_out) << "the agent waited on the FIFO";
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("exit       : exit code 4"));
}

// A relative --log-dir still gives workers an absolute error file: one
// that changes folder leaves its message for the report.
TEST(Launch, AWorkerThatChangesFolderStillWritesItsErrorFile) {
  TempDir dir;
  CommandResult r = testing::run_command(
      {{kDlaunch, "--log-dir", "logs", "--run-id", "e", "sh", "-c",
        "cd / && printf '{\"message\": {\"message\": \"ValueError: "
        "moved\", \"extraInfo\": {}}}' > $TORCHELASTIC_ERROR_FILE; exit 4"},
       {},
       {},
       dir.path().string()},
      60s);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error      : ValueError: moved"));
  EXPECT_THAT(r.err, HasSubstr("summary    : " +
                               (dir / "logs/e/summary.json").string()));
}

TEST(Launch, AMissingProgramFailsAtOnceWith127) {
  CommandResult r = dlaunch({"--max-restarts", "5", "no-such-program-xyz"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_THAT(r.err, HasSubstr("'no-such-program-xyz': command not found"));
  CommandResult py = dlaunch({"/nonexistent/train.py"});
  EXPECT_EQ(py.exit_code, 127);
  EXPECT_THAT(py.err, HasSubstr("No such file or directory"));
}

TEST(Launch, AFileTheKernelCannotExecuteFailsTheSpawnCleanly) {
  // Executable bit but no #! line: execve fails (ENOEXEC) in the vforked
  // child, which must leave without touching the agent's memory.
  TempDir dir;
  testing::write_file(dir / "noshebang", "echo hi\n", 0755);
  CommandResult r = dlaunch({"--nproc-per-node", "3", "--max-restarts", "1",
                             (dir / "noshebang").string()});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.err, HasSubstr("Exec format error"));
  EXPECT_THAT(r.err, HasSubstr("could not start"));
  EXPECT_THAT(r.err, HasSubstr("restarting the worker group (restart 1 of 1)"));
}

TEST(Launch, PipedStdinReachesWorkers) {
  testing::TempDir dir;
  testing::write_file(dir / "in", "hello\n");
  CommandResult r = testing::run_command(
      {{"sh", "-c",
        kDlaunch + " --nproc-per-node 1 cat < " + (dir / "in").string()},
       {},
       {},
       ""});
  EXPECT_EQ(r.out, "[default0]:hello\n");
}

TEST(Launch, WorkersReadingATerminalGetEofInsteadOfStopping) {
  // Own process groups are background groups: a tty read would SIGTTIN them.
  if (!std::filesystem::exists("/usr/bin/script"))
    GTEST_SKIP() << "no script(1)";
  CommandResult r = testing::run_command(
      {{"/usr/bin/script", "-qec",
        kDlaunch + " --nproc-per-node 2 sh -c 'read x; echo got=$?'",
        "/dev/null"},
       {},
       {},
       ""},
      20s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:got=1"));
  EXPECT_THAT(r.out, HasSubstr("[default1]:got=1"));
}

TEST(Launch, AMasterAddressNotOnThisHostFailsTheRendezvousClearly) {
  // 203.0.113.1 (TEST-NET-3) is nobody's address: MASTER_PORT cannot be
  // bound there, so no worker may start.
  CommandResult r = dlaunch({"--master-addr", "203.0.113.1", "true"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rendezvous failed: cannot bind a free port on "
                               "'203.0.113.1': cannot assign requested "
                               "address"));
  EXPECT_THAT(r.err, HasSubstr("check --master-addr"));
}

// Deciding whether a host (or the rendezvous endpoint) is this machine
// looks its name up: with a resolver that never answers (150 s of its own
// tries), dlaunch gives up at --connect-timeout, naming the host and the
// fix, for a plan, a launch over hosts and a c10d endpoint alike.
TEST(Launch, ANameTheResolverNeverAnswersFailsAtTheConnectTimeout) {
  TempDir dir;
  testing::SilentNameserver dns((dir.path() / "resolv.conf").string());
  if (!dns.ok()) GTEST_SKIP() << dns.why();
  const std::string host = "dlaunch-test.invalid";
  for (std::vector<std::string> args : {
           std::vector<std::string>{"--hosts", host, "--dry-run", "true"},
           {"--hosts", host + ",127.0.0.2", "true"},
           {"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            host + ":29400", "true"},
       }) {
    args.insert(args.begin(), {kDlaunch, "--connect-timeout", "1"});
    testing::CommandOptions o;
    o.argv = dns.wrap(args);
    o.env = {{"RES_OPTIONS", testing::SilentNameserver::kResOptions}};
    CommandResult r = testing::run_command(o, 60s);
    EXPECT_FALSE(r.timed_out) << "the resolver's 150 s, not the 1 s";
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err,
                HasSubstr("cannot tell whether host '" + host +
                          "' is this machine: its name lookup got no answer "
                          "from the resolver within 1 s (--connect-timeout)"))
        << args[3] << " " << args[4];
  }
}

TEST(Launch, AKilledLaunchTakesTheGpuCountHelperWithIt) {
  TempDir dir;
  const auto helper = dir.path() / "helper";
  const auto pid_file = dir.path() / "pid";
  {
    std::ofstream f(helper);
    f << "#!/bin/sh\necho $$ > " << pid_file.string() << ".tmp && mv "
      << pid_file.string() << ".tmp " << pid_file.string()
      << "\nexec sleep 300\n";
  }
  std::filesystem::permissions(helper, std::filesystem::perms::owner_all);
  Subprocess p({{kDlaunch, "--nproc-per-node", "gpu", "true"},
                {{"DLAUNCH_CUDA_DEVICES", helper.string()}},
                {},
                ""});
  pid_t counting = 0;
  testing::eventually(
      [&] {
        std::ifstream f(pid_file);
        return static_cast<bool>(f >> counting);
      },
      60s, 10ms);
  ASSERT_GT(counting, 0) << "the helper never started";
  p.signal(SIGKILL);
  p.wait(30s);
  // The helper would sleep 300 s.
  EXPECT_TRUE(testing::eventually(
      [&] { return !testing::process_alive(counting); }, 30s))
      << "the GPU-count helper outlived dlaunch by 30 s";
}

TEST(Launch, BadFlagsGetOneLineAndExit2) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--nproc-per-node", "many", "true"},
        {"--bogus-flag", "true"},
        {"-t", "9", "true"},
        {}}) {
    CommandResult r = dlaunch(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_THAT(r.err, HasSubstr("dlaunch: "));
  }
  CommandResult h = dlaunch({"--help"});
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_THAT(h.out, HasSubstr("EXIT STATUS"));
}

// --export, --env-file and --chdir describe every host, this one too when
// it runs the job alone (they were once ignored without --hosts).
TEST(Launch, ExportEnvFileAndChdirHoldOnOneNode) {
  TempDir dir;
  std::filesystem::create_directory(dir / "work");
  std::ofstream(dir / "env") << "# job settings\nFROM_FILE=f1\nBOTH=file\n";
  CommandResult r =
      sh(2, "echo \"$FROM_FILE $BOTH $HEADS $(pwd)\"",
         {"-x", "BOTH=flag", "-x", "HEADS", "--env-file",
          (dir / "env").string(), "--chdir", (dir / "work").string()},
         {{"HEADS", "h1"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* rank : {"[default0]:", "[default1]:"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string(rank) + "f1 flag h1 " +
                                 (dir / "work").string() + "\n"));
  }
  // PWD names that folder, as after a shell's cd (it named the launch
  // folder; sh mends its own, so the worker is printenv itself).
  CommandResult p = dlaunch({"--nproc-per-node", "1", "--chdir",
                             (dir / "work").string(), "printenv", "PWD"});
  EXPECT_EQ(p.out, "[default0]:" + (dir / "work").string() + "\n") << p.err;
  // Through a link, the path given, as a shell's cd keeps it.
  std::filesystem::create_directory_symlink(dir / "work", dir / "link");
  p = dlaunch({"--nproc-per-node", "1", "--chdir", (dir / "link").string(),
               "printenv", "PWD"});
  EXPECT_EQ(p.out, "[default0]:" + (dir / "link").string() + "\n") << p.err;
  // Their bad values are errors here too, before any worker starts.
  for (std::vector<std::string> flags :
       {std::vector<std::string>{"--chdir", (dir / "none").string()},
        {"--chdir", (dir / "env").string()},
        {"--env-file", (dir / "none").string()},
        {"--env-file", dir.path().string()}}) {
    CommandResult b = sh(1, "echo started", flags);
    EXPECT_EQ(b.exit_code, 2) << b.err;
    EXPECT_EQ(lines_of(b.err).size(), 1u) << b.err;
    EXPECT_THAT(b.err, HasSubstr(flags[0]));
    EXPECT_THAT(b.out, Not(HasSubstr("started")));
  }
}

// A relative --chdir is the launch folder's: a .py program is looked for
// there (it was looked for in the launch folder, and refused), and the
// job.yaml of --log-dir names that folder, so that the job reruns from it
// (it named DIR/work/work, reached from the new folder).
TEST(Launch, ARelativeChdirHoldsForThePythonCheckAndJobYaml) {
  TempDir dir;
  std::filesystem::create_directory(dir / "work");
  testing::write_file(dir / "work" / "here.py", "print('RAN')\n");
  testing::CommandOptions o;
  o.argv = {kDlaunch, "--chdir",   "work", "--log-dir",
            "logs",   "--rdzv-id", "j1",   "here.py"};
  o.cwd = dir.path().string();
  CommandResult r = testing::run_command(o, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:RAN"));
  const std::filesystem::path yaml = dir / "work" / "logs" / "j1" / "job.yaml";
  ASSERT_TRUE(std::filesystem::exists(yaml));
  EXPECT_THAT(
      testing::read_file(yaml),
      HasSubstr("chdir: " + std::filesystem::canonical(dir / "work").string() +
                "\n"));
  testing::CommandOptions again;
  again.argv = {kDlaunch, "--config", yaml.string()};
  again.cwd = "/";
  CommandResult a = testing::run_command(again, 60s);
  EXPECT_EQ(a.exit_code, 0) << a.err;
  EXPECT_THAT(a.out, HasSubstr("[default0]:RAN"));
  // A script missing there is refused before anything starts, where this
  // machine runs workers (no host named, this machine alone, or the head
  // among the hosts; without it the hosts' pre-flight looks: --dry-run of
  // hosts elsewhere is no error); a --chdir that does not exist is named
  // as such.
  for (std::vector<std::string> argv :
       {std::vector<std::string>{kDlaunch, "--chdir", "work", "missing.py"},
        {kDlaunch, "--hosts", "localhost:1", "--chdir", "work", "missing.py"},
        {kDlaunch, "--launcher", "local", "--hosts", "localhost:1,127.0.0.2:1",
         "--local-addr", "127.0.0.1", "--chdir", "work", "missing.py"}}) {
    o.argv = argv;
    CommandResult m = testing::run_command(o, 60s);
    EXPECT_EQ(m.exit_code, 127) << m.err;
    EXPECT_THAT(m.err, HasSubstr("'work/missing.py': No such file"));
  }
  o.argv = {kDlaunch, "--hosts", "n1.invalid,n2.invalid", "--dry-run",
            "missing.py"};
  EXPECT_EQ(testing::run_command(o, 60s).exit_code, 0);
  o.argv = {kDlaunch, "--chdir", "nowhere", "here.py"};
  CommandResult n = testing::run_command(o, 60s);
  EXPECT_EQ(n.exit_code, 2) << n.err;
  EXPECT_THAT(n.err, HasSubstr("--chdir: cannot enter nowhere"));
  // From a folder removed under it, a relative --chdir leads nowhere: said
  // so (it aborted on an uncaught filesystem_error).
  o.argv = {"sh", "-c",
            "mkdir gone && cd gone && rmdir ../gone && exec " +
                std::string(kDlaunch) + " --chdir work --no-python true"};
  CommandResult g = testing::run_command(o, 60s);
  EXPECT_EQ(g.exit_code, 2) << g.err;
  EXPECT_THAT(g.err, HasSubstr("--chdir: cannot enter work"));
}

// A run id used again with the same --log-dir (a rerun; c10d's default id
// is "none" on every run): the later run's logs go to RUN_ID.1, and the
// earlier run's stay whole. The later run once wrote its attempt_0 and
// summary over the earlier's and left its other attempts beside them.
TEST(Launch, ARunIdUsedAgainLogsBesideTheEarlierRun) {
  TempDir dir;
  const std::string logs = (dir / "logs").string();
  CommandResult first = sh(1, "echo one; exit 3",
                           {"--log-dir", logs, "--rdzv-id", "job7",
                            "--max-restarts", "1", "--redirects", "3"});
  EXPECT_EQ(first.exit_code, 3) << first.err;
  CommandResult second =
      sh(1, "echo two",
         {"--log-dir", logs, "--rdzv-id", "job7", "--redirects", "3"});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.err,
              HasSubstr("dlaunch: note: " + logs +
                        "/job7 holds another run's logs (an earlier one, or "
                        "another node's on a shared folder); this run's go "
                        "to " +
                        logs + "/job7.1"));
  const std::filesystem::path a = dir / "logs" / "job7";
  const std::filesystem::path b = dir / "logs" / "job7.1";
  EXPECT_EQ(read_file(a / "attempt_0" / "0" / "stdout.log"), "one\n");
  EXPECT_EQ(read_file(a / "attempt_1" / "0" / "stdout.log"), "one\n");
  EXPECT_THAT(read_file(a / "summary.json"), HasSubstr("\"exit_code\": 3"));
  EXPECT_EQ(read_file(b / "attempt_0" / "0" / "stdout.log"), "two\n");
  EXPECT_FALSE(std::filesystem::exists(b / "attempt_1"));
  EXPECT_THAT(read_file(b / "summary.json"), HasSubstr("\"exit_code\": 0"));
  EXPECT_TRUE(std::filesystem::exists(b / "job.yaml"));
  // No room for RUN_ID.1 (a name one past the 255-byte limit): the run is
  // refused rather than written into the earlier run's folder.
  const std::string id(254, 'x');
  ASSERT_EQ(sh(1, "true", {"--log-dir", logs, "--rdzv-id", id}).exit_code, 0);
  CommandResult full =
      sh(1, "echo STARTED", {"--log-dir", logs, "--rdzv-id", id});
  EXPECT_EQ(full.exit_code, 1) << full.err;
  EXPECT_THAT(full.err,
              HasSubstr(".1: File name too long; give a shorter --rdzv-id or "
                        "another --log-dir (" +
                        logs + "/" + id +
                        " holds another run's logs, which this run must not "
                        "write over)"));
  EXPECT_THAT(full.out, Not(HasSubstr("STARTED")));
}

// Started with its own TORCHELASTIC_ERROR_FILE (as torchrun's @record
// main is, by TorchX and the like), a failed run leaves its root cause
// there: the failing worker's error file with "errorCode" set, else a
// message naming the failure; a run that succeeds leaves nothing.
TEST(Launch, AFailedRunLeavesItsRootCauseInTheLaunchersErrorFile) {
  TempDir dir;
  const std::string file = (dir / "parent.json").string();
  CommandResult r =
      sh(2,
         "if [ $LOCAL_RANK = 1 ]; then printf '%s' '{\"message\": "
         "{\"message\": \"boom\", \"extraInfo\": {\"py_callstack\": "
         "\"tb\", \"timestamp\": \"1\"}}}' > $TORCHELASTIC_ERROR_FILE; "
         "exit 3; fi; sleep 30",
         {}, {{"TORCHELASTIC_ERROR_FILE", file}});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  nlohmann::json j = nlohmann::json::parse(read_file(file), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << read_file(file);
  EXPECT_EQ(j["message"]["message"], "boom");
  EXPECT_EQ(j["message"]["extraInfo"]["py_callstack"], "tb");
  EXPECT_EQ(j["message"]["errorCode"], 3);  // torch's: -N for signal N
  // No worker error file: the failure, named.
  r = sh(1, "exit 4", {}, {{"TORCHELASTIC_ERROR_FILE", file}});
  EXPECT_EQ(r.exit_code, 4);
  j = nlohmann::json::parse(read_file(file), nullptr, false);
  EXPECT_THAT(j["message"]["message"].get<std::string>(),
              ::testing::MatchesRegex(
                  "dlaunch: local rank 0 \\(pid [0-9]+\\) failed with exit "
                  "code 4"));
  // A program that does not exist: its error.
  r = dlaunch({"no-such-program-xyz"}, {{"TORCHELASTIC_ERROR_FILE", file}});
  EXPECT_EQ(r.exit_code, 127);
  j = nlohmann::json::parse(read_file(file), nullptr, false);
  EXPECT_THAT(j["message"]["message"].get<std::string>(),
              HasSubstr("no-such-program-xyz"));
  // An error before any agent runs: dlaunch's own message.
  r = dlaunch({"--chdir", (dir / "none").string(), "true"},
              {{"TORCHELASTIC_ERROR_FILE", file}});
  EXPECT_EQ(r.exit_code, 2);
  j = nlohmann::json::parse(read_file(file), nullptr, false);
  EXPECT_THAT(
      j["message"]["message"].get<std::string>(),
      HasSubstr("dlaunch: --chdir: cannot enter " + (dir / "none").string()));
  // The head writes it, not the hosts' agents (the variable travels to
  // them, as TORCH* does): one writer, here an unwritable path, one warning.
  r = dlaunch({"--launcher", "local", "--hosts", "localhost,127.0.0.1",
               "--local-addr", "127.0.0.1", "sh", "-c", "exit 5"},
              {{"TORCHELASTIC_ERROR_FILE", (dir / "no" / "x.json").string()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("\ndlaunch: warning: cannot write "
                               "TORCHELASTIC_ERROR_FILE"));
  EXPECT_THAT(r.err,
              Not(HasSubstr("127.0.0.1 dlaunch: warning: cannot write")));
  // Success writes nothing.
  std::filesystem::remove(file);
  EXPECT_EQ(sh(1, "true", {}, {{"TORCHELASTIC_ERROR_FILE", file}}).exit_code,
            0);
  EXPECT_FALSE(std::filesystem::exists(file));
}

// Counts the agent's open fds from inside each attempt's worker.
TEST(Launch, RestartsLeakNoFileDescriptors) {
  // The last rank measures once the agent's count has settled (every
  // worker started; read alike 5 times over 250 ms: a loaded machine may
  // hold the agent for tens of ms between a worker's exec and its closing
  // the worker's pipe ends); rank 0 runs until it has measured (and is
  // stopped when rank 1 fails).
  TempDir dir;
  const std::string mark = (dir / "measured").string();
  CommandResult r =
      sh(2,
         "if [ $LOCAL_RANK = 0 ]; then i=0; while [ ! -e " + mark +
             "$TORCHELASTIC_RESTART_COUNT ] && [ $i -lt 6000 ]; do sleep "
             "0.01; i=$((i+1)); done; exit 0; fi; "
             "b=$(ls /proc/$PPID/fd | wc -l); same=0; i=0; "
             "while [ $same -lt 5 ] && [ $i -lt 500 ]; do a=$b; sleep 0.05; "
             "b=$(ls /proc/$PPID/fd | wc -l); i=$((i+1)); "
             "if [ \"$a\" = \"$b\" ]; then same=$((same+1)); else same=0; "
             "fi; done; "
             "echo fds=$b own=$(ls /proc/self/fd | wc -l) "
             "attempt=$TORCHELASTIC_RESTART_COUNT; touch " +
             mark +
             "$TORCHELASTIC_RESTART_COUNT; "
             "[ $TORCHELASTIC_RESTART_COUNT -lt 3 ] && exit 1; exit 0",
         {"--max-restarts", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> agent_fds, own_fds;
  std::regex re(R"(\[default1\]:fds=(\d+) own=(\d+) attempt=\d)");
  int n = 0;
  for (const std::string& l : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_match(l, m, re)) continue;
    agent_fds.insert(m[1]);
    own_fds.insert(m[2]);
    ++n;
  }
  EXPECT_EQ(n, 4);
  EXPECT_EQ(agent_fds.size(), 1u) << r.out;
  EXPECT_EQ(own_fds.size(), 1u) << r.out;
}

// CPU time (user+system clock ticks) of a process.
long cpu_ticks(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

TEST(Launch, TheAgentUsesNoCpuWhileWorkersRun) {
  // The workers hold still on a gate until the measurement is over, however
  // late the test gets to it: none may end (and keep the agent busy) inside
  // the measured second.
  TempDir dir;
  testing::Gate gate((dir / "go").string());
  Subprocess p({{kDlaunch, "--nproc-per-node", "2", "sh", "-c",
                 "echo ready; read x < " + gate.path()},
                {},
                {},
                ""});
  ASSERT_TRUE(p.wait_for_output("[default0]:ready", 60s));
  ASSERT_TRUE(p.wait_for_output("[default1]:ready", 60s));
  long before = cpu_ticks(p.pid());
  std::this_thread::sleep_for(1s);  // the measured interval, not a wait
  long after = cpu_ticks(p.pid());
  gate.open_once();
  gate.open_once();
  // Polling at torchrun's 0.1 s would cost ticks; an idle epoll costs none.
  EXPECT_LE(after - before, 1);
  EXPECT_EQ(p.wait(60s).exit_code, 0);
}

}  // namespace
}  // namespace dlaunch
