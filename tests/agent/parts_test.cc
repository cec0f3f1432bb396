// The agent's pure pieces: -r/-t values, line splitting, the env contract,
// ${...} substitution, program lookup, reports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/cpu_cores.h"
#include "agent/line_buffer.h"
#include "agent/options.h"
#include "agent/program.h"
#include "agent/rendezvous/static_rendezvous.h"
#include "agent/report.h"
#include "agent/watchdog.h"
#include "agent/worker_env.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::agent {
namespace {

using ::testing::HasSubstr;

TEST(ParseStreams, AcceptsTorchrunsValues) {
  EXPECT_EQ(parse_streams("0").for_rank(5), Streams::kNone);
  EXPECT_EQ(parse_streams("3").for_rank(5), Streams::kBoth);
  StreamsSpec m = parse_streams("0:3,1:0,4:2");
  EXPECT_EQ(m.for_rank(0), Streams::kBoth);
  EXPECT_EQ(m.for_rank(1), Streams::kNone);
  EXPECT_EQ(m.for_rank(4), Streams::kErr);
  EXPECT_EQ(m.for_rank(2), Streams::kNone);  // unnamed ranks: none
  EXPECT_TRUE(covers_stdout(Streams::kOut) && !covers_stderr(Streams::kOut));
}

TEST(ParseStreams, RejectsBadValuesNamingTheValidForms) {
  for (const char* bad :
       {"", "4", "x", "-1", "0:", ":1", "0:3,1", "0:9", "a:1"}) {
    try {
      parse_streams(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("valid forms")) << bad;
    }
  }
}

TEST(LineBuffer, EmitsOnlyWholePrefixedLines) {
  LineBuffer lb("[w0]:");
  std::string out;
  lb.feed("hel", out);
  EXPECT_EQ(out, "");
  lb.feed("lo\nwor", out);
  EXPECT_EQ(out, "[w0]:hello\n");
  out.clear();
  lb.feed("ld\n\nx", out);
  EXPECT_EQ(out, "[w0]:world\n[w0]:\n");
  out.clear();
  lb.flush(out);
  EXPECT_EQ(out, "[w0]:x\n");
  out.clear();
  lb.flush(out);
  EXPECT_EQ(out, "");
}

TEST(LineBuffer, PassesOnOverlongLines) {
  LineBuffer lb("p:");
  std::string out;
  lb.feed(std::string(LineBuffer::kMaxLine, 'a'), out);
  EXPECT_EQ(out.size(), LineBuffer::kMaxLine + 3);
  EXPECT_EQ(out.back(), '\n');
}

// What one feed() of `bytes` passes on.
std::string fed(LineBuffer& lb, std::string_view bytes) {
  std::string out;
  lb.feed(bytes, out);
  return out;
}

// tqdm's way: each update starts with '\r'; the bar moves before its line
// ends, each redraw prefixed, nothing shown twice.
TEST(LineBuffer, ShowsRedrawsAsTheyCome) {
  LineBuffer lb("[w0]:");
  EXPECT_EQ(fed(lb, "\r  0%|"), "[w0]:  0%|\r");
  EXPECT_EQ(fed(lb, "\r 50%|#"), "[w0]: 50%|#\r");
  // More of the same redraw waits for the next one: a line grown a byte
  // a time was sent whole at every byte, its square in all.
  EXPECT_EQ(fed(lb, "#"), "");
  EXPECT_EQ(fed(lb, "\r 60%|##"), "[w0]: 50%|##\r[w0]: 60%|##\r");
  EXPECT_EQ(fed(lb, "\r100%|###|\nnext"), "[w0]:100%|###|\n");
  EXPECT_EQ(fed(lb, " line"), "");  // plain text again: waits for its '\n'
  std::string out;
  lb.flush(out);
  EXPECT_EQ(out, "[w0]:next line\n");
}

// print(..., end="\r"): the '\r' may end a redraw or start "\r\n".
TEST(LineBuffer, TellsARedrawFromACrLfSplitBetweenReads) {
  LineBuffer lb("p:");
  EXPECT_EQ(fed(lb, "1/3\r"), "p:1/3\r");
  EXPECT_EQ(fed(lb, "2/3\r"), "p:2/3\r");
  // A "\r\n" line after all: sent again whole, prefix and all, so the
  // '\n' never travels alone.
  EXPECT_EQ(fed(lb, "\n"), "p:2/3\r\n");
  const std::string out = fed(lb, "a\r\nb\rc\r\n");
  EXPECT_EQ(out, "p:a\r\np:b\rp:c\r\n");
  EXPECT_EQ(lb.unit_end(out, 0), 4u);   // "p:a\r\n": its '\n'
  EXPECT_EQ(lb.unit_end(out, 5), 8u);   // "p:b\r"
  EXPECT_EQ(lb.unit_end(out, 9), 13u);  // "p:c\r\n"
  EXPECT_EQ(lb.unit_end(out, 14), std::string::npos);
}

// A progress line drawn a character at a time costs its length, not its
// square.
TEST(LineBuffer, ALineGrownByteByByteIsSentOnce) {
  LineBuffer lb("p:");
  std::string out;
  lb.feed("\rEpoch 1 ", out);
  for (int i = 0; i < 3000; ++i) lb.feed(".", out);
  lb.feed("\n", out);
  EXPECT_LT(out.size(), 2 * 3000u);
  EXPECT_TRUE(out.ends_with("p:Epoch 1 " + std::string(3000, '.') + "\n"));
}

// pdsh and srun label whole lines: there '\r' is text.
TEST(LineBuffer, WithoutRedrawsCarriageReturnsAreText) {
  LineBuffer lb("", false);
  std::string out;
  lb.feed("h: 1%\r2%", out);
  EXPECT_EQ(out, "");
  lb.feed("\r3%\n", out);
  EXPECT_EQ(out, "h: 1%\r2%\r3%\n");
  EXPECT_EQ(lb.unit_end(out, 0), out.size() - 1);
}

TEST(WorkerEnv, OverridesContractKeysAndKeepsTheRest) {
  EnvMap base{{"RANK", "99"}, {"FOO", "bar"}};
  WorkerIdentity id{1, 5, 8, 4, 1, 2, 5, 8};
  JobInfo job{"trainer", "10.0.0.1", 1234, 2, 3, "run"};
  auto env = worker_environment(base, id, job, "/tmp/e.json");
  auto has = [&](const std::string& kv) {
    return std::find(env.begin(), env.end(), kv) != env.end();
  };
  EXPECT_TRUE(has("RANK=5"));
  EXPECT_TRUE(has("FOO=bar"));
  EXPECT_TRUE(has("GROUP_RANK=1"));
  EXPECT_TRUE(has("GROUP_WORLD_SIZE=2"));
  EXPECT_TRUE(has("MASTER_ADDR=10.0.0.1"));
  EXPECT_TRUE(has("MASTER_PORT=1234"));
  EXPECT_TRUE(has("TORCHELASTIC_RESTART_COUNT=2"));
  EXPECT_TRUE(has("OMP_NUM_THREADS=1"));
  id.local_world_size = 1;
  env = worker_environment(base, id, job, "/tmp/e.json");
  EXPECT_FALSE(has("OMP_NUM_THREADS=1"));  // one worker: left alone
}

// The agent's and its helpers' test hooks stay with them: a worker that
// runs dlaunch (a nested run) would act on them (the etcd helper's would
// SIGKILL its agent at the exit barrier). comm's are the workers' own.
TEST(WorkerEnv, LeavesOutTheAgentsTestHooks) {
  EnvMap base{{"DLAUNCH_RDZV_ETCD_TEST_DIE_BEFORE_END", "1"},
              {"DLAUNCH_AGENT_TEST_X", "1"},
              {"DLAUNCH_TEST_DATA", "/data"},
              {"DLAUNCH_COMM_TEST_HOSTS", "a,b"},
              {"DLAUNCH_COMM_TEST_CMA_REFUSED", "1"},
              {"DLAUNCH_RDZV_ETCD", "/opt/helper"},
              {"MY_TEST_VAR", "x"}};
  auto env = worker_environment(base, WorkerIdentity{}, JobInfo{}, "/tmp/e");
  auto has = [&](const std::string& name) {
    return std::any_of(env.begin(), env.end(), [&](const std::string& kv) {
      return kv.starts_with(name + "=");
    });
  };
  EXPECT_FALSE(has("DLAUNCH_RDZV_ETCD_TEST_DIE_BEFORE_END"));
  // A user's own variables pass, whatever their names.
  EXPECT_TRUE(has("DLAUNCH_AGENT_TEST_X"));
  EXPECT_TRUE(has("DLAUNCH_TEST_DATA"));
  EXPECT_TRUE(has("DLAUNCH_COMM_TEST_HOSTS"));
  EXPECT_TRUE(has("DLAUNCH_COMM_TEST_CMA_REFUSED"));
  EXPECT_TRUE(has("DLAUNCH_RDZV_ETCD"));
  EXPECT_TRUE(has("MY_TEST_VAR"));
}

// --cpu-bind core hands out cores: hardware threads of one core together,
// in the order of their lowest CPU; a CPU of unknown place is a core alone.
TEST(CpuCores, GroupsHardwareThreadsByPackageAndCore) {
  using Cores = std::vector<std::vector<int>>;
  EXPECT_EQ(group_cores({{1, 0, 1}, {0, 0, 0}}), (Cores{{0}, {1}}));
  // Two packages reusing core ids, threads numbered as Linux does on x86.
  EXPECT_EQ(group_cores({{0, 0, 0},
                         {1, 0, 1},
                         {2, 1, 0},
                         {3, 1, 1},
                         {4, 0, 0},
                         {5, 0, 1},
                         {6, 1, 0},
                         {7, 1, 1}}),
            (Cores{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(group_cores({{3, -1, -1}, {2, -1, 5}, {1, 0, 7}}),
            (Cores{{1}, {2}, {3}}));
  EXPECT_EQ(group_cores({}), Cores{});
  // This machine: every CPU this process may use, each in one core.
  size_t cpus = 0;
  for (const auto& core : allowed_cores()) cpus += core.size();
  cpu_set_t set;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(cpus, static_cast<size_t>(CPU_COUNT(&set)));
}

// --gpu-binding per-rank: each worker sees its own GPU as device 0.
TEST(WorkerEnv, GpuPerRankBindsEachWorkerToOneGpu) {
  WorkerIdentity id{2, 2, 4, 4, 0, 1, 2, 4};
  JobInfo job{"default", "127.0.0.1", 1234, 0, 0, "run"};
  auto has = [](const std::vector<std::string>& env, const std::string& kv) {
    return std::find(env.begin(), env.end(), kv) != env.end();
  };
  auto none = worker_environment({{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}}, id, job,
                                 "/tmp/e.json");
  EXPECT_TRUE(has(none, "CUDA_VISIBLE_DEVICES=4,5,6,7"));  // left alone
  for (const auto& kv : none)
    EXPECT_NE(kv.rfind("DLAUNCH_CUDA_DEVICE=", 0), 0u);

  job.gpu_per_rank = true;
  auto own = worker_environment({}, id, job, "/tmp/e.json");
  EXPECT_TRUE(has(own, "CUDA_VISIBLE_DEVICES=2"));
  EXPECT_TRUE(has(own, "DLAUNCH_CUDA_DEVICE=0"));
  auto listed = worker_environment({{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}}, id,
                                   job, "/tmp/e.json");
  EXPECT_TRUE(has(listed, "CUDA_VISIBLE_DEVICES=6"));
  EXPECT_TRUE(has(listed, "DLAUNCH_CUDA_DEVICE=0"));
  auto uuids = worker_environment(
      {{"CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c"}}, id, job, "/tmp/e.json");
  EXPECT_TRUE(has(uuids, "CUDA_VISIBLE_DEVICES=GPU-c"));
  try {
    worker_environment({{"CUDA_VISIBLE_DEVICES", "4,5"}}, id, job, "/tmp/e");
    ADD_FAILURE() << "local rank 2 got a GPU from a list of two";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("local rank 2 has no GPU in "
                                         "CUDA_VISIBLE_DEVICES=4,5"),
              std::string::npos);
  }
  EXPECT_EQ(visible_device_list({{"CUDA_VISIBLE_DEVICES", ""}}).size(), 0u);
}

TEST(Substitute, ReplacesKnownNamesOnly) {
  EXPECT_EQ(substitute("a${x}b${y}c${", {{"x", "1"}}), "a1b${y}c${");
  EXPECT_EQ(line_prefix("", "default", 3, 7), "[default3]:");
  EXPECT_EQ(line_prefix("${rank}: ", "r", 3, 7), "7: ");
}

TEST(ResolveProgram, FindsProgramsInPathAndExplainsMisses) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(resolve_program("/bin/sh", ""), "/bin/sh");
  EXPECT_THROW(resolve_program("no-such-prog-xyz", "/bin"), ProgramError);
  try {
    resolve_program("/nonexistent/prog", "");
    ADD_FAILURE();
  } catch (const ProgramError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'/nonexistent/prog': No such file"));
  }
  try {
    resolve_program("/tmp", "");
    ADD_FAILURE();
  } catch (const ProgramError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is a directory"));
  }
}

TEST(Report, ReadsTorchErrorFilesInBothShapes) {
  dlaunch::testing::TempDir dir;
  dlaunch::testing::write_file(
      dir / "a.json",
      R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "..."}}})");
  dlaunch::testing::write_file(dir / "b.json", R"({"message": "plain"})");
  dlaunch::testing::write_file(dir / "c.json", "not json");
  EXPECT_EQ(read_error_file(dir / "a.json"), "RuntimeError: boom");
  EXPECT_EQ(read_error_file(dir / "b.json"), "plain");
  EXPECT_EQ(read_error_file(dir / "c.json"), "not json");
  EXPECT_EQ(read_error_file(dir / "missing.json"), "");
}

// A worker's error file is read without waiting and within a bound: a
// FIFO there held the agent in open(), a link to /dev/zero read forever,
// and 5 MB of text went whole into the failure report.
TEST(Report, ErrorFilesThatAreNoFilesOrHugeAreReadWithinBounds) {
  dlaunch::testing::TempDir dir;
  const std::filesystem::path fifo = dir / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_error_file(fifo), "") << "a FIFO nobody writes";
  const std::filesystem::path zero = dir / "zero.json";
  std::filesystem::create_symlink("/dev/zero", zero);
  EXPECT_EQ(read_error_file(zero), "");
  const std::filesystem::path big = dir / "big.json";
  dlaunch::testing::write_file(big, std::string(5 << 20, 'x'));
  const std::string shown = read_error_file(big);
  EXPECT_EQ(shown, std::string(kMaxErrorTextShown, 'x') +
                       "... (the first 4096 of over 1048576 bytes of " +
                       big.string() + ")");
  bool more = false;
  EXPECT_EQ(read_error_bytes(big, &more).size(), kMaxErrorFileBytes);
  EXPECT_TRUE(more);
  // The cut never splits a UTF-8 character: the summary's JSON threw on
  // one ("invalid UTF-8 byte"), losing the report and the exit status.
  {
    std::string text = "x";
    for (int i = 0; i < 3000; ++i) text += "\xc3\xa9";  // e-acute
    dlaunch::testing::write_file(big, text);
  }
  const std::string cut = read_error_file(big);
  ASSERT_EQ(cut.substr(4095, 20), "... (the first 4095 ")
      << "cut at 4095, before a character";
  EXPECT_NO_THROW(nlohmann::json(cut).dump());
  // Text under the file bound but over what is shown: its size is said.
  dlaunch::testing::write_file(big, std::string(5000, 'y'));
  EXPECT_THAT(read_error_file(big),
              HasSubstr("... (the first 4096 of 5000 bytes of "));
}

TEST(Report, SummaryHasEveryAttemptAndTheRootCause) {
  RunResult r;
  r.run_id = "abc";
  r.host = "h";
  r.exit_code = 7;
  AttemptRecord a;
  a.outcome = "failed";
  WorkerRecord w;
  w.local_rank = 1;
  w.rank = 1;
  w.pid = 42;
  w.status = ExitStatus{7, 0};
  a.workers = {WorkerRecord{}, w};
  a.root_cause = 1;
  r.attempts = {a, a};
  auto j = summary_json(r);
  EXPECT_EQ(j["attempts"].size(), 2u);
  EXPECT_EQ(j["root_cause"]["pid"], 42);
  EXPECT_EQ(j["root_cause"]["exit_code"], 7);
  EXPECT_EQ(j["attempts"][1]["root_cause_local_rank"], 1);
  std::string text = failure_report(r);
  EXPECT_THAT(text, HasSubstr("pid        : 42"));
  EXPECT_THAT(text, HasSubstr("exit code 7"));
  EXPECT_EQ(format_time(WallTime(std::chrono::milliseconds(1500))),
            "1970-01-01T00:00:01.500Z");
}

TEST(StaticRendezvous, OneNodeRoundsWithAFreshPortUnlessOneWasGiven) {
  int picked = 30000;
  rendezvous::StaticRendezvous picking("127.0.0.1", 0,
                                       [&](const std::string& host) {
                                         EXPECT_EQ(host, "127.0.0.1");
                                         return picked++;
                                       });
  using rendezvous::RoundReason;
  auto r0 = picking.next_round(4, RoundReason::kStart, std::chrono::seconds(1));
  auto r1 =
      picking.next_round(4, RoundReason::kFailure, std::chrono::seconds(1));
  EXPECT_EQ(r0.restart_count, 0);
  EXPECT_EQ(r1.restart_count, 1);  // a failure spends a restart
  EXPECT_EQ(r0.round, 0);
  EXPECT_EQ(r1.round, 1);
  EXPECT_EQ(r0.group_rank, 0);
  EXPECT_EQ(r0.group_world_size, 1);
  EXPECT_EQ(r0.world_size, 4);
  EXPECT_EQ(r0.master_port, 30000);
  EXPECT_EQ(r1.master_port, 30001);
  rendezvous::StaticRendezvous fixed("10.0.0.1", 29500, [](const std::string&) {
    ADD_FAILURE() << "a fixed port must not be replaced";
    return 0;
  });
  EXPECT_EQ(fixed.next_round(2, RoundReason::kStart, std::chrono::seconds(1))
                .master_port,
            29500);
  EXPECT_EQ(fixed.next_round(2, RoundReason::kStart, std::chrono::seconds(1))
                .master_addr,
            "10.0.0.1");
}

// ~Watchdog skips its bounded wait only when the watchdog is known not to
// be a fork of dlaunch: a /proc/self/exe that cannot be read leaves that
// unknown, so it waits (it once skipped it).
TEST(WatchdogBinary, AnUnreadableSelfExeCountsAsPossiblyDlaunch) {
  testing::TempDir proc;
  namespace fs = std::filesystem;
  fs::create_directories(proc / "42");
  fs::create_directories(proc / "self");
  fs::create_symlink("/opt/dl/dlaunch", proc / "42" / "exe");
  // No self/exe: unknown.
  EXPECT_TRUE(may_run_dlaunch(42, proc.path()));
  // self/exe not a link (readlink's EINVAL): unknown too.
  testing::write_file(proc / "self" / "exe", "");
  EXPECT_TRUE(may_run_dlaunch(42, proc.path()));
  fs::remove(proc / "self" / "exe");
  fs::create_symlink("/opt/dl/dlaunch", proc / "self" / "exe");
  EXPECT_TRUE(may_run_dlaunch(42, proc.path()));
  fs::remove(proc / "self" / "exe");
  fs::create_symlink("/opt/dl/dlaunch-watchdog", proc / "self" / "exe");
  EXPECT_FALSE(may_run_dlaunch(42, proc.path()));
  // Exited: nothing held, whatever self/exe says.
  EXPECT_FALSE(may_run_dlaunch(43, proc.path()));
  fs::remove(proc / "self" / "exe");
  EXPECT_FALSE(may_run_dlaunch(43, proc.path()));
  // The real /proc: this process runs its own binary.
  EXPECT_TRUE(may_run_dlaunch(::getpid()));
}

TEST(ExitStatusTest, DescribesAndMapsToShellCodes) {
  EXPECT_EQ((ExitStatus{0, SIGKILL}).describe(), "signal SIGKILL (9)");
  EXPECT_EQ((ExitStatus{0, SIGKILL}).shell_code(), 137);
  EXPECT_EQ((ExitStatus{4, 0}).shell_code(), 4);
  EXPECT_EQ(ExitStatus::from_wait_status(3 << 8).code, 3);
}

}  // namespace
}  // namespace dlaunch::agent
