// `dlaunch` against an unlucky environment: a console that stops reading or
// goes away, a log disk that fills up, workers whose children escape their
// process group. Real processes, real pipes, a real (private) tmpfs.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/shm_names.h"
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

// testing::eventually, checking every 10 ms.
bool eventually(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout) {
  return testing::eventually(cond, timeout, 10ms);
}

// A pipe whose ends close with the test.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  int reader() const { return fds[0]; }
  int writer() const { return fds[1]; }
  void close_reader() {
    ::close(fds[0]);
    fds[0] = -1;
  }
  size_t unread() const {
    int n = 0;
    ::ioctl(fds[0], FIONREAD, &n);
    return static_cast<size_t>(n);
  }
  // No room for another write: whoever writes next blocks.
  bool full() const {
    pollfd p{fds[1], POLLOUT, 0};
    return ::poll(&p, 1, 0) == 0;
  }
};

// The pid a process wrote to `file` (0 until it has).
pid_t pid_in(const std::filesystem::path& file) {
  std::ifstream in(file);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

TEST(Robustness, AStalledConsoleDelaysNeitherSignalsNorTheExit) {
  TempDir dir;
  Pipe console;  // read by nobody
  const std::string marker = (dir / "got-term-").string();
  Subprocess p({{kDlaunch, "--nproc-per-node", "2", "--log-dir",
                 dir.path().string(), "--run-id", "s", "-t", "1", "sh", "-c",
                 // The trap first: a worker's output in its log then
                 // proves the trap is set (set after `yes` started, a
                 // slow shell could get SIGTERM before it and die).
                 "trap 'touch " + marker +
                     "$LOCAL_RANK; exit 0' TERM; "
                     "yes line-$LOCAL_RANK-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx & "
                     "wait"},
                {},
                {},
                "",
                console.writer()});
  // Both workers are writing (so both have their trap set) and the
  // console is full.
  const auto log0 = dir / "s/attempt_0/0/stdout.log";
  const auto log1 = dir / "s/attempt_0/1/stdout.log";
  ASSERT_TRUE(eventually(
      [&] {
        return console.full() && !read_file(log0).empty() &&
               !read_file(log1).empty();
      },
      20s))
      << console.unread();
  p.signal(SIGTERM);
  // Forwarded to both workers while nobody reads the console.
  EXPECT_TRUE(eventually(
      [&] {
        return std::filesystem::exists(marker + "0") &&
               std::filesystem::exists(marker + "1");
      },
      20s))
      << "SIGTERM was not forwarded while the console was stalled";
  // And dlaunch ends although the console never resumes.
  CommandResult r = p.wait(60s);
  EXPECT_FALSE(r.timed_out) << "dlaunch did not exit with a stalled console";
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_THAT(r.err, HasSubstr("received SIGTERM; forwarding it to 2"));
  // What the console never got is in the log files, with a note saying so.
  std::string logs = read_file(log0) + read_file(log1);
  EXPECT_THAT(logs, HasSubstr("line-0-x"));
  EXPECT_THAT(logs, HasSubstr("line-1-x"));
  EXPECT_THAT(logs, HasSubstr("never reached the console"));
  // And stderr (not stalled) says so.
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "dlaunch: [0-9]+ bytes of output never reached the "
                         "console: it accepted nothing for [0-9.]+ m?s after "
                         "the job ended; the log files have them all"));
}

// Without log files, output the console never took is lost: said on
// stderr (it was lost silently: `dlaunch ... | (sleep 6; wc -l)`).
TEST(Robustness, OutputAStalledConsoleNeverTookIsCountedOnStderr) {
  Pipe console;  // read by nobody
  Subprocess p({{kDlaunch, "--nproc-per-node", "1", "sh", "-c", "seq 1 30000"},
                {},
                {},
                "",
                console.writer()});
  CommandResult r = p.wait(60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "dlaunch: [0-9]+ bytes of output never reached the "
                         "console: .*; [0-9]+ of them are in no log file"));
}

TEST(Robustness, AVanishedConsoleStopsOutputNotTheJob) {
  const std::string id = "vanish-" + std::to_string(::getpid());
  Pipe console;
  console.close_reader();  // `dlaunch ... 2>&1 | true`
  Subprocess p({{kDlaunch, "--nproc-per-node", "2", "--rdzv-id", id, "true"},
                {},
                {"TMPDIR", "OMP_NUM_THREADS"},  // the note, in /dev/shm
                "",
                console.writer(),
                console.writer()});
  CommandResult r = p.wait(30s);
  EXPECT_EQ(r.signal, 0) << "killed by " << r.signal;
  EXPECT_EQ(r.exit_code, 0);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_THAT(e.path().filename().string(), Not(HasSubstr("dlaunch-" + id)))
        << "left behind";
  }
}

TEST(Robustness, AVanishedConsoleStillGetsLogsReportAndSummaryWritten) {
  TempDir dir;
  Pipe console;
  console.close_reader();
  Subprocess p({{kDlaunch, "--nproc-per-node", "2", "--log-dir",
                 dir.path().string(), "--run-id", "v", "-t", "3", "sh", "-c",
                 "echo out-$LOCAL_RANK; [ $LOCAL_RANK = 1 ] && exit 3; "
                 "exit 0"},
                {},
                {},
                "",
                console.writer(),
                console.writer()});
  CommandResult r = p.wait(30s);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(read_file(dir / "v/attempt_0/1/stdout.log"), "out-1\n");
  auto summary = nlohmann::json::parse(read_file(dir / "v/summary.json"));
  EXPECT_EQ(summary["exit_code"], 3);
}

TEST(Robustness, ChildrenThatLeaveTheirGroupEndWithTheJob) {
  TempDir dir;
  const auto file = dir / "stray";
  CommandResult r = testing::run_command(
      {{kDlaunch, "sh", "-c",
        "setsid sh -c 'echo $$ > " + file.string() + ".tmp; mv " +
            file.string() + ".tmp " + file.string() +
            "; exec sleep 300' & "
            "while [ ! -s " +
            file.string() + " ]; do sleep 0.01; done; exit 0"},
       {},
       {},
       ""},
      30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  pid_t stray = pid_in(file);
  ASSERT_GT(stray, 0);
  EXPECT_TRUE(eventually([&] { return !testing::process_alive(stray); }, 30s))
      << "the worker's setsid child outlived the job";
  // Only a survivor: the pid of one that is gone may be another's now.
  if (testing::process_alive(stray)) ::kill(stray, SIGKILL);
}

// Runs a worker that leaves a stray hiding its environment (`hide`:
// stray-hiding-env's HIDE_MS) and expects the stray to end with the job.
// With `before`, dlaunch's process already has a child (`sleep 300 & exec
// dlaunch`): strays are then known by their tag only.
void expect_stray_ends_with_the_job(const std::string& hide, bool before) {
  TempDir dir;
  const auto file = dir / "stray";
  const auto child = dir / "child";
  std::string job = kDlaunch + " " + testing::bin("stray-hiding-env") + " " +
                    file.string() + " " + hide + " " + std::string(8192, 'x');
  if (before) {
    job = "sleep 300 >/dev/null 2>&1 & echo $! > " + child.string() +
          "; exec " + job;
  }
  struct KillChild {  // the child from before exec outlives dlaunch
    std::filesystem::path file;
    ~KillChild() {
      if (pid_t p = pid_in(file); p > 0 && testing::process_alive(p)) {
        ::kill(p, SIGKILL);
      }
    }
  } kill_child{child};
  CommandResult r = testing::run_command({{"sh", "-c", job}, {}, {}, ""}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string text = read_file(file);
  if (text.starts_with("skip")) GTEST_SKIP() << text;
  pid_t stray = pid_in(file);
  ASSERT_GT(stray, 0) << text;
  EXPECT_TRUE(eventually([&] { return !testing::process_alive(stray); }, 30s))
      << "the worker's stray, its environment unreadable as the job ended, "
         "outlived the job";
  if (testing::process_alive(stray)) ::kill(stray, SIGKILL);
}

// A stray whose environment reads empty just when the job ends (as one
// caught in execve does: the `exec sleep` above, as its parent exits) ends
// with the job too where strays are known by their tag: the agent looks
// again while an adopted child's environment cannot be read. It hides its
// environment for 100 ms.
TEST(Robustness, AStrayCaughtInExecEndsWithTheJob) {
  expect_stray_ends_with_the_job("100", true);
}

// Elsewhere the agent takes every child it adopted for its workers': a
// stray whose tag cannot be seen at all ends with the job too (one that
// hides its environment for 10 minutes, as another user's non-dumpable
// daemon's reads; one that cleared its environment, as setproctitle does:
// Ray, gunicorn).
TEST(Robustness, AStrayWhoseEnvironmentNeverReadsEndsWithTheJob) {
  expect_stray_ends_with_the_job("600000", false);
}

TEST(Robustness, AStrayThatClearedItsEnvironmentEndsWithTheJob) {
  expect_stray_ends_with_the_job("overwrite", false);
}

// A child the process had before it became dlaunch (`monitor & exec
// dlaunch ...`) is no stray: it outlives the job.
TEST(Robustness, AChildFromBeforeExecIsNoStray) {
  TempDir dir;
  const auto file = dir / "child";
  CommandResult r = testing::run_command(
      {{"sh", "-c",
        "sleep 300 >/dev/null 2>&1 & echo $! > " + file.string() + "; exec " +
            kDlaunch + " sh -c 'setsid sleep 300 >/dev/null 2>&1 & exit 0'"},
       {},
       {},
       ""},
      30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  pid_t child = pid_in(file);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(testing::process_alive(child))
      << "dlaunch killed a child its process had before exec";
  if (testing::process_alive(child)) ::kill(child, SIGKILL);
}

// /dev/shm's entries whose names start with `prefix`.
std::set<std::string> shm_entries(const std::string& prefix) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename();
    if (name.starts_with(prefix)) out.insert(name);
  }
  return out;
}

// Ranks killed while they set up shared memory (here inside the first
// segment's ftruncate, by SIGXFSZ: the name made, never unlinked) leave
// nothing in /dev/shm: their agent removes what its attempt's workers left,
// named after the attempt (a 2 MiB segment stayed for good per rank).
TEST(Robustness, RanksKilledSettingUpSharedMemoryLeaveNothingInDevShm) {
  const std::string run_id = "shmtest" + std::to_string(::getpid());
  const int port = testing::free_port();
  const std::string prefix =
      "dlaunch-" +
      comm::attempt_shm_prefix(run_id, "0", "127.0.0.1", std::to_string(port));
  CommandResult r = testing::run_command(
      {{kDlaunch, "--run-id", run_id, "--master-addr", "127.0.0.1",
        "--master-port", std::to_string(port), "--nproc-per-node", "2",
        testing::bin("comm_test_worker"), "big-allreduce"},
       {{"COMM_TEST_FSIZE_LIMIT", "4096"}, {"COMM_TEST_FSIZE_KILLS", "1"}},
       {},
       ""},
      60s);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("SIGXFSZ"));  // named, then left
  EXPECT_EQ(shm_entries(prefix), std::set<std::string>{});
}

TEST(Robustness, ChildrenThatLeaveTheirGroupEndWithAKilledAgent) {
  TempDir dir;
  const auto file = dir / "stray";
  Subprocess p({{kDlaunch, "sh", "-c",
                 "setsid sh -c 'echo $$ > " + file.string() + ".tmp; mv " +
                     file.string() + ".tmp " + file.string() +
                     "; exec sleep 300' & sleep 300"},
                {{"TMPDIR", dir.path().string()}},
                {},
                ""});
  ASSERT_TRUE(eventually([&] { return pid_in(file) > 0; }, 60s));
  pid_t stray = pid_in(file);
  p.signal(SIGKILL);
  p.wait(30s);
  EXPECT_TRUE(eventually([&] { return !testing::process_alive(stray); }, 30s))
      << "the worker's setsid child outlived the SIGKILLed agent";
  // Only a survivor: the pid of one that is gone may be another's now.
  if (testing::process_alive(stray)) ::kill(stray, SIGKILL);
}

// The same with the agent SIGKILLed: its watchdog looks again while some
// process's environment cannot be read.
TEST(Robustness, AStrayCaughtInExecEndsWithAKilledAgent) {
  TempDir dir;
  const auto file = dir / "stray";
  Subprocess p({{kDlaunch, testing::bin("stray-hiding-env"), file.string(),
                 "100", std::string(8192, 'x'), "stay"},
                {{"TMPDIR", dir.path().string()}},
                {},
                ""});
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(file); }, 60s));
  const std::string text = read_file(file);
  if (text.starts_with("skip")) {
    p.signal(SIGKILL);
    p.wait(30s);
    GTEST_SKIP() << text;
  }
  pid_t stray = pid_in(file);
  ASSERT_GT(stray, 0) << text;
  p.signal(SIGKILL);
  p.wait(30s);
  EXPECT_TRUE(eventually([&] { return !testing::process_alive(stray); }, 30s))
      << "the worker's stray, its environment unreadable as the agent was "
         "killed, outlived it";
  if (testing::process_alive(stray)) ::kill(stray, SIGKILL);
}

TEST(Robustness, AFullLogDiskIsReportedNotHidden) {
  if (testing::run_command({{"unshare", "-m", "true"}, {}, {}, ""}, 10s)
          .exit_code != 0) {
    GTEST_SKIP() << "cannot make a private mount namespace (unshare -m)";
  }
  TempDir dir;
  const std::string d = dir.path().string();
  // A 256 KiB tmpfs that only this test's namespace sees; the worker
  // writes 1 MB (teed: the agent writes the log) and fails.
  CommandResult r = testing::run_command(
      {{"unshare", "-m", "sh", "-c",
        "mount -t tmpfs -o size=256k dlaunch-test " + d + " || exit 99; " +
            kDlaunch + " --log-dir " + d +
            " --run-id full -t 3 sh -c 'head -c 1000000 /dev/zero | "
            "tr \"\\0\" x; exit 5' >/dev/null; echo exit=$?; ls " +
            d + "/full"},
       {},
       {},
       ""},
      60s);
  ASSERT_NE(r.exit_code, 99) << r.err;
  EXPECT_THAT(r.out, HasSubstr("exit=5"));
  const std::string log = d + "/full/attempt_0/0/stdout.log";
  const std::string once =
      "dlaunch: cannot write " + log + ": No space left on device";
  EXPECT_THAT(r.err, HasSubstr(once));
  EXPECT_EQ(r.err.find(once), r.err.rfind(once)) << "reported twice";
  EXPECT_THAT(r.err, HasSubstr("log lost   : incomplete, a write failed (" +
                               log + ": No space left on device)"));
  EXPECT_THAT(r.err, HasSubstr("cannot write " + d +
                               "/full/summary.json: No space left on device"));
  // Neither a cut-off summary nor its temporary file is left.
  EXPECT_THAT(r.out, Not(HasSubstr("summary.json")));
}

}  // namespace
}  // namespace dlaunch
