// Unit tests of what the head hands its hosts: the RemoteJob text (round
// trips with any bytes, read from a pipe exactly to its end), and each
// backend's commands as text.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "launcher/agent_launcher.h"
#include "launcher/cli.h"
#include "launcher/command_runner.h"
#include "launcher/host_losses.h"
#include "launcher/hostfile.h"
#include "launcher/job_print.h"
#include "launcher/multi_host.h"
#include "launcher/remote_job.h"
#include "launcher/ship.h"
#include "launcher/slurm.h"
#include "launcher/staging.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::launcher {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

RemoteJob sample() {
  RemoteJob j;
  j.args = {"--nproc-per-node", "2", "prog", "a b", "'q\"", "$HOME", "",
            "line\nbreak"};
  j.env = {{"A", "x y"},
           {"B", "it's \"quoted\" $X `y` \\z"},
           {"EMPTY", ""},
           {"DLAUNCH_RDZV_TOKEN", "secret"}};
  j.chdir = "/w d";
  j.host = "node02";
  j.job_tag = "dlaunch-job-0123456789abcdef";
  j.whole_job = "program: prog\nhosts: [a, b]\nenv: {A: 'x y'}\n";
  return j;
}

TEST(RemoteJobTest, RoundTripsAnyBytes) {
  RemoteJob j = sample();
  std::string text = encode_remote_job(j);
  EXPECT_EQ(decode_remote_jobs(text), std::vector<RemoteJob>{j});
  RemoteJob k = j;
  k.host = "node03";
  EXPECT_EQ(decode_remote_jobs(text + encode_remote_job(k)),
            (std::vector<RemoteJob>{j, k}));
  // Many hosts' jobs hold their shared whole job once (it grew with the
  // square of the hosts).
  RemoteJob other = k;
  other.host = "node04";
  other.whole_job = "program: other\n";
  const std::vector<RemoteJob> jobs = {j, k, other};
  const std::string many = encode_remote_jobs(jobs);
  EXPECT_EQ(decode_remote_jobs(many), jobs);
  EXPECT_EQ(many.find(j.whole_job), many.rfind(j.whole_job));
}

TEST(RemoteJobTest, BadTextIsAClearError) {
  std::string good = encode_remote_job(sample());
  struct Case {
    std::string text, words;
  };
  const std::vector<Case> cases = {
      {"hello", "not a dlaunch job"},
      {"dlaunch-job 2\nend 0\n\n", "not a dlaunch job of this version"},
      {good.substr(0, good.size() - 3), "ends in the middle"},
      {"dlaunch-job 1\nfoo 1\nx\nend 0\n\n", "kind 'foo' is unknown"},
      {"dlaunch-job 1\narg x\n", "bad length 'x'"},
      {"dlaunch-job 1\narg\n", "is not 'KIND LENGTH'"},
      {"dlaunch-job 1\narg 1\nxy", "not followed by a newline"},
      {"dlaunch-job 1\nenv 3\nabc\nend 0\n\n", "not NAME=VALUE"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      decode_remote_jobs(c.text);
      ADD_FAILURE() << "no error";
    } catch (const RemoteJobError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
}

TEST(RemoteJobTest, ReadsALargeJobFromAPipeAndNotPastItsEnd) {
  RemoteJob j = sample();
  j.env["BIG"] = std::string(200 * 1024, 'v');
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::string text = encode_remote_job(j) + "AFTER";
  std::thread writer([&] {
    size_t off = 0;
    while (off < text.size()) {
      ssize_t n = ::write(fds[1], text.data() + off, text.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  });
  EXPECT_EQ(read_remote_job(fds[0], std::chrono::seconds(30)), j);
  writer.join();
  char rest[16] = {};
  EXPECT_EQ(::read(fds[0], rest, sizeof rest), 5);
  EXPECT_EQ(std::string(rest), "AFTER");
  ::close(fds[1]);
  ::close(fds[0]);
}

TEST(RemoteJobTest, AStreamEndingEarlyOrTooSlowIsAnError) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "dlaunch-job 1\n", 14), 14);
  try {
    read_remote_job(fds[0], std::chrono::milliseconds(50));
    ADD_FAILURE() << "no error";
  } catch (const RemoteJobError& e) {
    EXPECT_THAT(e.what(), HasSubstr("did not arrive on stdin within 50 ms"));
  }
  ::close(fds[1]);
  try {
    read_remote_job(fds[0], std::chrono::seconds(5));
    ADD_FAILURE() << "no error";
  } catch (const RemoteJobError& e) {
    EXPECT_THAT(e.what(), HasSubstr("stdin ended after"));
  }
  ::close(fds[0]);
}

LaunchPlan plan() {
  LaunchPlan p;
  for (const char* h : {"n1", "n2"}) {
    RemoteJob j = sample();
    j.host = h;
    p.jobs.push_back(j);
  }
  p.remote_dlaunch = "/opt/dl/dlaunch";
  p.program = "train.py";
  p.job_tag = "dlaunch-job-0123456789abcdef";
  p.staging_dir = "/tmp/stage";
  p.options.ssh_port = 2222;
  p.options.ssh_args = {"-i", "my key"};
  p.options.connect_timeout = std::chrono::milliseconds(2500);
  p.options.pdsh_fanout = 8;
  return p;
}

TEST(BackendsTest, EveryNameHasABackend) {
  for (std::string_view n : agent_launcher_names()) {
    EXPECT_NE(make_agent_launcher(n), nullptr) << n;
  }
  EXPECT_EQ(make_agent_launcher("rsh"), nullptr);
}

TEST(BackendsTest, SshIsNonInteractiveWithTheJobOnStdin) {
  auto ssh = make_agent_launcher("ssh");
  LaunchPlan p = plan();
  auto start = ssh->start_commands(p);
  ASSERT_EQ(start.size(), 2u);
  EXPECT_THAT(
      start[1].argv,
      ElementsAre("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-T",
                  "-p", "2222", "-i", "my key", "n2",
                  "exec /opt/dl/dlaunch --remote-agent --job-tag "
                  "dlaunch-job-0123456789abcdef"));
  EXPECT_EQ(start[1].hosts, std::vector<std::string>{"n2"});
  EXPECT_EQ(decode_remote_jobs(start[1].stdin_data),
            std::vector<RemoteJob>{p.jobs[1]});
  // Nothing of the job on the command line.
  for (const std::string& a : start[1].argv) {
    EXPECT_EQ(a.find("secret"), std::string::npos);
  }
  EXPECT_EQ(ssh->check_commands(p)[0].argv.back(),
            "exec /opt/dl/dlaunch --remote-check train.py --chdir '/w d'");
  EXPECT_EQ(ssh->stop_commands(p)[0].argv.back(),
            "exec /opt/dl/dlaunch --remote-stop dlaunch-job-0123456789abcdef");
}

TEST(BackendsTest, PdshRunsOnceOverAllHostsWithAJobFile) {
  auto pdsh = make_agent_launcher("pdsh");
  LaunchPlan p = plan();
  p.head_env["PDSH_RCMD_TYPE"] = "exec";
  auto start = pdsh->start_commands(p);
  ASSERT_EQ(start.size(), 1u);
  const std::string file = "/tmp/dlaunch-job-0123456789abcdef.job";
  EXPECT_THAT(
      start[0].argv,
      ElementsAre("pdsh", "-S", "-b", "-f", "8", "-w", "n1,n2",
                  "/opt/dl/dlaunch", "--remote-agent", "--job-tag",
                  "dlaunch-job-0123456789abcdef", "--job-file",
                  "/tmp/dlaunch-job-0123456789abcdef-%h.job", "--host", "%h"));
  EXPECT_TRUE(start[0].host_prefixed_lines);
  EXPECT_TRUE(start[0].stdin_data.empty());
  // The exec module runs here: the check places the file directly.
  auto check = pdsh->check_commands(p);
  ASSERT_EQ(check.size(), 1u);
  EXPECT_EQ(decode_remote_jobs(check[0].local_files.at(
                "/tmp/dlaunch-job-0123456789abcdef-n2.job")),
            std::vector<RemoteJob>{p.jobs[1]});
  // Over ssh, pdcp places it first.
  p.head_env.erase("PDSH_RCMD_TYPE");
  check = pdsh->check_commands(p);
  ASSERT_EQ(check.size(), 2u);
  EXPECT_EQ(check[0].argv[0], "pdcp");
  EXPECT_EQ(check[0].argv.back(), file);
  EXPECT_EQ(pdsh->start_commands(p)[0].argv.back(), file);
  // Its remote shell splits words again: each goes quoted (the check's
  // --chdir '/w d' as well).
  p.remote_dlaunch = "/opt/my dl/dlaunch";
  EXPECT_THAT(pdsh->start_commands(p)[0].argv,
              ::testing::Contains("'/opt/my dl/dlaunch'"));
  EXPECT_THAT(pdsh->check_commands(p)[1].argv,
              ::testing::IsSupersetOf(
                  {"'/opt/my dl/dlaunch'", "--chdir", "'/w d'", "train.py"}));
  p.head_env["PDSH_RCMD_TYPE"] = "exec";
  EXPECT_THAT(pdsh->start_commands(p)[0].argv,
              ::testing::Contains("/opt/my dl/dlaunch"));
}

// plan() with dlaunch shipped to n2.
LaunchPlan shipping_plan() {
  LaunchPlan p = plan();
  p.ship_cache = cache_name("00112233aabbccdd");
  p.shipped["n2"] = cached_path(p.ship_cache);
  p.ship_from = "/head/bin/dlaunch";
  p.ship_cuda_devices_from = "/head/bin/dlaunch-cuda-devices";
  p.ship_watchdog_from = "/head/bin/dlaunch-watchdog";
  p.ship_checksum = "00112233aabbccdd";
  return p;
}

TEST(BackendsTest, SshShipsThroughStdinIntoTheCacheAndUsesIt) {
  auto ssh = make_agent_launcher("ssh");
  LaunchPlan p = shipping_plan();
  EXPECT_EQ(p.shipped["n2"], "${XDG_CACHE_HOME:-$HOME/.cache}/dlaunch/" +
                                 p.ship_cache + "/dlaunch");
  auto ship = ssh->ship_commands(p);
  ASSERT_EQ(ship.size(), 3u);
  EXPECT_EQ(ship[0].hosts, std::vector<std::string>{"n2"});
  EXPECT_EQ(ship[0].argv[ship[0].argv.size() - 2], "n2");
  EXPECT_EQ(
      ship[0].argv.back(),
      "exec sh -c " + shell_command({ship_script(p.ship_cache, "dlaunch")}));
  EXPECT_EQ(ship[0].stdin_file, "/head/bin/dlaunch");
  EXPECT_THAT(ship[1].argv.back(),
              HasSubstr("mv -f \"$t\" \"$d/" + p.ship_cache +
                        "\"/dlaunch-cuda-devices"));
  EXPECT_EQ(ship[1].stdin_file, "/head/bin/dlaunch-cuda-devices");
  EXPECT_THAT(
      ship[2].argv.back(),
      HasSubstr("mv -f \"$t\" \"$d/" + p.ship_cache + "\"/dlaunch-watchdog"));
  EXPECT_EQ(ship[2].stdin_file, "/head/bin/dlaunch-watchdog");
  // n2 runs its cached copy, which checks itself; n1 keeps its own dlaunch.
  auto check = ssh->check_commands(p);
  EXPECT_EQ(check[0].argv.back(),
            "exec /opt/dl/dlaunch --remote-check train.py --chdir '/w d'");
  const std::string cached =
      "exec " + shell_command(cached_dlaunch_argv(p.ship_cache));
  EXPECT_EQ(check[1].argv.back(), cached +
                                      " --remote-check train.py --chdir '/w d' "
                                      "--checksum 00112233aabbccdd");
  EXPECT_THAT(ssh->start_commands(p)[1].argv.back(),
              HasSubstr(cached + " --remote-agent"));
  EXPECT_THAT(ssh->stop_commands(p)[1].argv.back(),
              HasSubstr(cached + " --remote-stop"));
}

TEST(BackendsTest, PdshShipsOnlyWhereItsHostsAreThisMachine) {
  auto pdsh = make_agent_launcher("pdsh");
  LaunchPlan p = shipping_plan();
  // Over a network its remote commands get no stdin to copy through.
  EXPECT_TRUE(pdsh->ship_commands(p).empty());
  p.head_env["PDSH_RCMD_TYPE"] = "exec";
  auto ship = pdsh->ship_commands(p);
  ASSERT_EQ(ship.size(), 3u);
  EXPECT_EQ(ship[0].argv[0], "sh");
  EXPECT_EQ(ship[0].stdin_file, "/head/bin/dlaunch");
  // One command for every host: the exec module's hosts share this
  // machine's cache.
  auto start = pdsh->start_commands(p)[0].argv;
  ASSERT_GT(start.size(), 11u);
  std::vector<std::string> want = cached_dlaunch_argv(p.ship_cache);
  want.push_back("--remote-agent");
  EXPECT_EQ(std::vector<std::string>(start.begin() + 7, start.begin() + 12),
            want);
  auto check = pdsh->check_commands(p)[0].argv;
  EXPECT_EQ(std::count(check.begin(), check.end(), "sh"), 1);
  EXPECT_EQ(check.back(), "00112233aabbccdd");
}

// The cache's shell scripts, run for real in a temporary XDG_CACHE_HOME.
TEST(ShipTest, TheCacheHoldsPrivateWholeCopiesAndRefusesSharedFolders) {
  testing::TempDir dir;
  const std::string name = cache_name("feedfacefeedface");
  const std::filesystem::path folder = dir / "dlaunch" / name;
  testing::write_file(dir / "src", "#!/bin/sh\necho cached \"$@\"\n", 0755);
  auto in_cache = [&](std::vector<std::string> argv) {
    testing::CommandOptions o;
    o.argv = std::move(argv);
    o.env = {{"XDG_CACHE_HOME", dir.path().string()}};
    return testing::run_command(o);
  };
  auto store = [&](const std::string& file) {
    return in_cache({"sh", "-c", "exec sh -c \"$0\" < \"$1\"",
                     ship_script(name, file), (dir / "src").string()});
  };
  auto run_cached = [&] {
    std::vector<std::string> argv = cached_dlaunch_argv(name);
    argv.push_back("--x");
    return in_cache(argv);
  };
  // Missing: the shell's 127, which the pre-flight takes for "ship it".
  EXPECT_EQ(run_cached().exit_code, 127);
  testing::CommandResult r = store("dlaunch");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_cached();
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "cached --x\n");
  struct ::stat st;
  ASSERT_EQ(::stat(folder.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((folder / "dlaunch").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // Written to a temporary name and renamed: nothing else is left.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(folder),
                          std::filesystem::directory_iterator()),
            1);
  // A folder others can write is refused before anything in it runs.
  for (const std::filesystem::path& shared : {dir / "dlaunch", folder}) {
    ::chmod(shared.c_str(), 0770);
    r = run_cached();
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_EQ(r.out, "");
    EXPECT_THAT(r.err, HasSubstr("the cache folder " + shared.string() +
                                 " is not private"));
    EXPECT_THAT(r.err, HasSubstr("chmod 700 " + shared.string()));
    EXPECT_EQ(store("dlaunch").exit_code, 3);
    ::chmod(shared.c_str(), 0700);
  }
  // So is a link in its place.
  std::filesystem::rename(folder, dir / "elsewhere");
  std::filesystem::create_directory_symlink(dir / "elsewhere", folder);
  EXPECT_EQ(run_cached().exit_code, 3);
}

TEST(ShipTest, OnlyAStaticProgramShips) {
  // /bin/sh, like a sanitizer build, needs its shared libraries.
  EXPECT_THAT(why_not_shippable("/bin/sh"),
              AllOf(HasSubstr("dynamically linked"),
                    HasSubstr("cmake --preset release")));
  testing::TempDir dir;
  testing::write_file(dir / "script", "#!/bin/sh\n", 0755);
  EXPECT_THAT(why_not_shippable(dir / "script"),
              HasSubstr("not a 64-bit ELF program"));
  EXPECT_THAT(why_not_shippable(dir / "absent"),
              HasSubstr("not a 64-bit ELF program"));
}

TEST(ShipTest, ChecksumsDifferWithTheBytesAndNameTheCache) {
  testing::TempDir dir;
  testing::write_file(dir / "a", "dlaunch");
  testing::write_file(dir / "b", "dlauncH");
  EXPECT_EQ(file_checksum(dir / "a").size(), 16u);
  EXPECT_EQ(file_checksum(dir / "a"), file_checksum(dir / "a"));
  EXPECT_NE(file_checksum(dir / "a"), file_checksum(dir / "b"));
  EXPECT_THROW(file_checksum(dir / "absent"), std::runtime_error);
  // The cache folder's name is the version and the checksum.
  // (VERSION-SUM, one path component).
  const std::string name = cache_name("0123456789abcdef");
  EXPECT_TRUE(name.ends_with("-0123456789abcdef")) << name;
  EXPECT_EQ(name.find('/'), std::string::npos);
  EXPECT_NE(name, cache_name("0123456789abcdee"));
}

// A shipped file reaches each copy command as its stdin, the file itself:
// the head never holds the tens of MB in memory, once per host.
TEST(ShipTest, AFileOnStdinIsTheFileItselfForEveryCommand) {
  testing::TempDir dir;
  const std::string bytes(300 * 1024, 'x');
  testing::write_file(dir / "payload", bytes);
  std::vector<AgentCommand> cmds(3);
  for (size_t i = 0; i < cmds.size(); ++i) {
    cmds[i].argv = {"sh", "-c", "readlink /proc/self/fd/0 && wc -c"};
    cmds[i].hosts = {"host" + std::to_string(i)};
    cmds[i].stdin_file = dir / "payload";
  }
  // One that cannot be read fails alone, saying why.
  AgentCommand missing = cmds[0];
  missing.stdin_file = dir / "absent";
  cmds.push_back(missing);
  CommandRunner run(cmds, CommandOutput::kCapture);
  ASSERT_TRUE(run.wait(std::chrono::seconds(30)));
  std::vector<CommandResult> results = run.results();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(results[i].exited);
    EXPECT_EQ(results[i].exit_code, 0) << results[i].err;
    EXPECT_EQ(results[i].out, (dir / "payload").string() + "\n" +
                                  std::to_string(bytes.size()) + "\n");
  }
  EXPECT_FALSE(results[3].started);
  EXPECT_THAT(results[3].out,
              AllOf(HasSubstr("cannot read"), HasSubstr("absent")));
}

// The runner never reads the environment on its thread: the head's own
// agent setenv()s on the main thread while the runner starts the other
// hosts' agents, and glibc's setenv frees the array that a reader on
// another thread walks (a SIGSEGV, now and then, of a head under load).
// The commands get the environment as it was when the runner was made:
// the first command's local file is a FIFO, so the runner's thread waits
// in its open() until this thread has set DLT_RUNNER_AFTER and opens the
// FIFO to read it. Then this thread adds variables while 63 more start.
TEST(CommandRunnerTest, TakesTheEnvironmentBeforeItsThreadStarts) {
  testing::TempDir dir;
  const std::filesystem::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::setenv("DLT_RUNNER_BEFORE", "before", 1);
  std::vector<AgentCommand> cmds(64);
  for (size_t i = 0; i < cmds.size(); ++i) {
    cmds[i].argv = {"sh", "-c",
                    "echo \"$DLT_RUNNER_BEFORE/$DLT_RUNNER_AFTER\""};
    cmds[i].hosts = {"host" + std::to_string(i)};
  }
  cmds[0].local_files[fifo] = "x";
  std::vector<std::string> names;
  {
    CommandRunner run(cmds, CommandOutput::kCapture);
    ::setenv("DLT_RUNNER_AFTER", "after", 1);
    EXPECT_EQ(testing::read_file(fifo), "x");  // lets the runner go on
    for (int i = 0; i < 5000 && !run.wait(std::chrono::milliseconds(0)); ++i) {
      names.push_back("DLT_RUNNER_" + std::to_string(i));
      ::setenv(names.back().c_str(), "x", 1);
    }
    ASSERT_TRUE(run.wait(std::chrono::seconds(60)));
    for (const CommandResult& r : run.results()) {
      EXPECT_TRUE(r.exited);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, "before/\n");
    }
  }
  for (const std::string& n : names) ::unsetenv(n.c_str());
  ::unsetenv("DLT_RUNNER_BEFORE");
  ::unsetenv("DLT_RUNNER_AFTER");
}

// Every command runs in the head's environment (one list, shared).
TEST(CommandRunnerTest, EveryCommandRunsInTheHeadsEnvironment) {
  ::setenv("DLT_RUNNER_BASE", "base", 1);
  std::vector<AgentCommand> cmds(3);
  for (size_t i = 0; i < cmds.size(); ++i) {
    cmds[i].argv = {"sh", "-c", "echo \"$DLT_RUNNER_BASE\""};
    cmds[i].hosts = {"host" + std::to_string(i)};
  }
  CommandRunner run(cmds, CommandOutput::kCapture);
  ::unsetenv("DLT_RUNNER_BASE");
  ASSERT_TRUE(run.wait(std::chrono::seconds(60)));
  std::vector<std::string> outs;
  for (const CommandResult& r : run.results()) outs.push_back(r.out);
  EXPECT_THAT(outs, ElementsAre("base\n", "base\n", "base\n"));
}

// pdsh's lines: "HOST: text" under a name cut at its first dot (pdsh does
// so when it serves several hosts; never an address), and each host's end
// ("exited with exit code N", "killed by signal N"), which fail the
// command while pdsh still runs. Names were once matched whole only, and
// a host killed by a signal went unseen.
TEST(CommandRunnerTest, PdshLinesNameTheirHostsShortenedOrNot) {
  AgentCommand c;
  c.hosts = {"node1.example.com", "node10", "10.0.0.1"};
  c.host_prefixed_lines = true;
  c.argv = {"sh", "-c",
            "echo 'node1: hi'; "
            "echo 'pdsh@h: node10: sh exited with exit code 0' >&2; "
            "echo 'pdsh@h: node1: sh killed by signal 9' >&2; "
            "echo 'pdsh@h: 10: sh exited with exit code 4' >&2; "
            "echo 'pdsh@h: 10.0.0.1: sh exited with exit code 3' >&2; "
            "exec sleep 60"};
  CommandRunner run({c}, CommandOutput::kShow);
  EXPECT_EQ(run.wait_failure_or_end(std::chrono::seconds(30)), 0);
  // A name none of ours matches is kept as pdsh wrote it.
  EXPECT_TRUE(testing::eventually(
      [&] { return run.results()[0].failed_hosts.size() == 3; },
      std::chrono::seconds(30)));
  EXPECT_THAT(run.results()[0].failed_hosts,
              ElementsAre(std::pair<std::string, int>{"node1.example.com", 137},
                          std::pair<std::string, int>{"10", 4},
                          std::pair<std::string, int>{"10.0.0.1", 3}));
  EXPECT_FALSE(run.results()[0].exited);
  run.signal_all(SIGKILL);
}

// Whether the head is needed and which host's agent it runs in-process
// follow one answer per host: a name that names this machine at one ask
// and not at the next (two DNS lookups may disagree) once sent a
// one-host job to the head's path (the old head check) and then found this
// machine there (launch_hosts' own lookup).
TEST(HostPlanTest, EachHostIsAskedOnceAndBothDecisionsFollowThatAnswer) {
  LaunchOptions o;
  o.remote.launcher = "ssh";
  std::map<std::string, int> asked;
  // Elsewhere at the first ask, this machine at any later one.
  auto flipping = [&](const std::string& h) { return ++asked[h] > 1; };
  o.hosts = {Host{"node1"}};
  HostPlan plan = plan_hosts(o, flipping);
  EXPECT_TRUE(plan.needs_head);
  EXPECT_FALSE(plan.in_process.has_value());
  EXPECT_EQ(asked, (std::map<std::string, int>{{"node1", 1}}));

  // Asked in order until one is this machine; the rest are not looked up.
  asked.clear();
  o.hosts = {Host{"a"}, Host{"me"}, Host{"b"}};
  plan = plan_hosts(o, [&](const std::string& h) {
    ++asked[h];
    return h == "me";
  });
  EXPECT_TRUE(plan.needs_head);
  EXPECT_EQ(plan.in_process, std::optional<size_t>(1));
  EXPECT_EQ(asked, (std::map<std::string, int>{{"a", 1}, {"me", 1}}));

  // This machine alone: no head.
  o.hosts = {Host{"me"}};
  plan = plan_hosts(o, [](const std::string& h) { return h == "me"; });
  EXPECT_FALSE(plan.needs_head);
  EXPECT_EQ(plan.in_process, std::optional<size_t>(0));

  // slurm starts every host's agent itself: nothing is looked up.
  asked.clear();
  o.remote.launcher = "slurm";
  plan = plan_hosts(o, flipping);
  EXPECT_TRUE(plan.needs_head);
  EXPECT_FALSE(plan.in_process.has_value());
  EXPECT_TRUE(asked.empty());

  o.hosts.clear();
  EXPECT_FALSE(plan_hosts(o, flipping).needs_head);
}

// The head's staging folders: private, recorded, removed at its end; the
// folders of heads that are gone (or whose pid was reused) are removed by
// the next head, nothing else is.
TEST(StagingTest, TheNextHeadRemovesOnlyTheFoldersOfGoneHeads) {
  namespace fs = std::filesystem;
  testing::TempDir dir;
  const std::optional<unsigned long long> start =
      process_start_time(::getpid());
  ASSERT_TRUE(start.has_value());
  // A pid that ran and is gone: a shell's, reaped by run_command().
  testing::CommandOptions sh;
  sh.argv = {"sh", "-c", "echo $$"};
  const std::string gone = testing::run_command(sh).out;
  ASSERT_FALSE(gone.empty());
  const std::string me = std::to_string(::getpid());
  auto make = [&](const std::string& name, const std::string& record) {
    fs::path d = dir / name;
    fs::create_directory(d);
    if (!record.empty()) testing::write_file(d / "head", record);
    testing::write_file(d / "job", "secret");
    return d;
  };
  const fs::path live =
      make("dlaunch-job-01.d", me + " " + std::to_string(*start));
  const fs::path dead =
      make("dlaunch-job-02.d", gone.substr(0, gone.size() - 1) + " 1\n");
  const fs::path reused =
      make("dlaunch-job-03.d", me + " " + std::to_string(*start + 1));
  const fs::path unrecorded = make("dlaunch-job-04.d", "");
  const fs::path not_ours = make("dlaunch-job-xyz.d", me + " 1");
  // A link named like a staging folder is never followed nor removed.
  const fs::path target = make("elsewhere", me + " 1");
  fs::create_directory_symlink(target, dir / "dlaunch-job-05.d");

  EXPECT_EQ(remove_stale_staging(dir.path()), 2u);
  EXPECT_TRUE(fs::exists(live / "job"));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(reused));
  EXPECT_TRUE(fs::exists(unrecorded / "job"));
  EXPECT_TRUE(fs::exists(not_ours / "job"));
  EXPECT_TRUE(fs::exists(target / "job"));
  EXPECT_TRUE(fs::is_symlink(dir / "dlaunch-job-05.d"));

  // A head's own: 0700, recording this process; gone at its end; making
  // one sweeps the stale ones first.
  make("dlaunch-job-06.d", me + " " + std::to_string(*start + 2));
  fs::path made;
  {
    StagingDir staging(dir.path(), "dlaunch-job-0a0b");
    made = staging.path();
    EXPECT_EQ(made, dir / "dlaunch-job-0a0b.d");
    struct ::stat st;
    ASSERT_EQ(::stat(made.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(testing::read_file(made / "head"),
              me + " " + std::to_string(*start) + "\n");
    EXPECT_FALSE(fs::exists(dir / "dlaunch-job-06.d"));
    EXPECT_EQ(remove_stale_staging(dir.path()), 0u);
    EXPECT_TRUE(fs::exists(made));
  }
  EXPECT_FALSE(fs::exists(made));
}

// Sets the modification time of `path` to `age` ago.
void age_by(const std::filesystem::path& path, std::chrono::seconds age) {
  const timespec times[2] = {{0, UTIME_OMIT},
                             {::time(nullptr) - age.count(), 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

// Folders without a record (a dlaunch before it wrote none): one over an
// hour old goes unless a process of this user names its tag; a fresh one
// (a head between its mkdir and its record) stays.
TEST(StagingTest, ARecordlessFolderGoesOnlyWhenOldAndNoProcessNamesItsTag) {
  namespace fs = std::filesystem;
  testing::TempDir dir;
  auto make = [&](const std::string& name, std::chrono::seconds age) {
    fs::path d = dir / name;
    fs::create_directory(d);
    testing::write_file(d / "job", "secret");
    age_by(d, age);
    return d;
  };
  using std::chrono::hours;
  using std::chrono::minutes;
  const fs::path fresh = make("dlaunch-job-0c1.d", minutes(50));
  const fs::path old = make("dlaunch-job-0c2.d", hours(2));
  const fs::path old_empty = dir / "dlaunch-job-0c3.d";
  fs::create_directory(old_empty);
  age_by(old_empty, hours(30));
  // An old job whose workers still run: the tag in their environment, or
  // in an agent's command line (--job-tag).
  const fs::path running = make("dlaunch-job-0c4.d", hours(2));
  const fs::path named = make("dlaunch-job-0c5.d", hours(2));
  testing::Subprocess worker({{"sh", "-c", "echo ready; exec sleep 60"},
                              {{"DLAUNCH_JOB_TAG", "dlaunch-job-0c4"}},
                              {},
                              ""});
  testing::Subprocess agent(
      {{"bash", "-c",
        "echo ready; exec -a 'dlaunch --job-tag dlaunch-job-0c5' sleep 60"},
       {},
       {},
       ""});
  ASSERT_TRUE(worker.wait_for_output("ready", std::chrono::seconds(30)));
  ASSERT_TRUE(agent.wait_for_output("ready", std::chrono::seconds(30)));
  // "ready" comes before the exec; mid-exec a process's cmdline and
  // environ read empty, so wait until both run their final program.
  auto runs = [](const testing::Subprocess& p, const std::string& argv0) {
    return testing::eventually(
        [&] {
          return testing::read_proc_file("/proc/" + std::to_string(p.pid()) +
                                         "/cmdline")
              .starts_with(argv0 + '\0');
        },
        std::chrono::seconds(30));
  };
  ASSERT_TRUE(runs(worker, "sleep"));
  ASSERT_TRUE(runs(agent, "dlaunch --job-tag dlaunch-job-0c5"));

  EXPECT_EQ(remove_stale_staging(dir.path()), 2u);
  EXPECT_TRUE(fs::exists(fresh / "job"));
  EXPECT_FALSE(fs::exists(old));
  EXPECT_FALSE(fs::exists(old_empty));
  EXPECT_TRUE(fs::exists(running / "job"));
  EXPECT_TRUE(fs::exists(named / "job"));
  worker.signal(SIGKILL);
  agent.signal(SIGKILL);
  worker.wait(std::chrono::seconds(10));
  agent.wait(std::chrono::seconds(10));
  EXPECT_EQ(remove_stale_staging(dir.path()), 2u);
  EXPECT_FALSE(fs::exists(running));
  EXPECT_FALSE(fs::exists(named));
  EXPECT_TRUE(fs::exists(fresh / "job"));
}

// Heads that start while others sweep: each one's folder, made before its
// record is written, survives every other head's sweep; the old
// record-less folder goes.
TEST(StagingTest, HeadsStartingTogetherKeepTheirFolders) {
  namespace fs = std::filesystem;
  testing::TempDir dir;
  const fs::path old = dir / "dlaunch-job-0d0.d";
  fs::create_directory(old);
  age_by(old, std::chrono::hours(2));
  constexpr int kHeads = 4, kRounds = 150;
  std::atomic<int> lost{0};
  std::vector<std::thread> heads;
  for (int h = 0; h < kHeads; ++h) {
    heads.emplace_back([&, h] {
      for (int i = 0; i < kRounds; ++i) {
        char tag[32];
        std::snprintf(tag, sizeof tag, "dlaunch-job-%02x%04x", h, i);
        StagingDir staging(dir.path(), tag);
        // Another head's sweep runs between our mkdir and record, or now.
        remove_stale_staging(dir.path());
        if (!fs::exists(staging.path() / "head")) ++lost;
      }
    });
  }
  for (std::thread& t : heads) t.join();
  EXPECT_EQ(lost.load(), 0);
  EXPECT_FALSE(fs::exists(old));
}

// A teardown whose stop commands do not end within the bound names the
// hosts and how to stop the job there by hand (it once said nothing).
TEST(TeardownTest, AStopThatDoesNotEndNamesItsHostsAndTheFix) {
  AgentCommand stuck, quick;
  stuck.argv = {"sleep", "60"};
  stuck.hosts = {"n2", "n3"};
  quick.argv = {"true"};
  quick.hosts = {"n1"};
  const std::string late =
      run_stop({stuck}, std::chrono::milliseconds(200), "dlaunch-job-0e0");
  // The bound as the agents' messages write one (format_duration): the
  // head's other teardown message too, which once rounded it down.
  EXPECT_THAT(late, HasSubstr("dlaunch: the stop of this job on n2, n3 did "
                              "not end within 200 ms; its processes there may "
                              "remain: run 'dlaunch --remote-stop "
                              "dlaunch-job-0e0' on those hosts"));
  EXPECT_EQ(run_stop({quick}, std::chrono::seconds(60), "dlaunch-job-0e1"), "");
}

TEST(BackendsTest, SlurmRunsOneSrunTaskPerNodeWithEveryJobOnStdin) {
  auto slurm = make_agent_launcher("slurm");
  LaunchPlan p = plan();
  EXPECT_FALSE(slurm->head_agent_in_process());
  auto start = slurm->start_commands(p);
  ASSERT_EQ(start.size(), 1u);
  EXPECT_THAT(start[0].argv,
              ElementsAre("srun", "--input=all", "--nodes=2", "--ntasks=2",
                          "--ntasks-per-node=1", "--nodelist=n1,n2",
                          "--overlap", "--label", "--kill-on-bad-exit=0",
                          "/opt/dl/dlaunch", "--remote-agent", "--job-tag",
                          "dlaunch-job-0123456789abcdef", "--slurm-task"));
  // Task N is hosts[N]; every node's job on the one stdin, none in argv.
  EXPECT_EQ(start[0].hosts, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_TRUE(start[0].task_labelled_lines);
  EXPECT_TRUE(start[0].own_process_group);
  EXPECT_EQ(decode_remote_jobs(start[0].stdin_data), p.jobs);
  for (const std::string& a : start[0].argv) {
    EXPECT_EQ(a.find("secret"), std::string::npos);
  }
  auto check = slurm->check_commands(p);
  ASSERT_EQ(check.size(), 1u);
  EXPECT_THAT(check[0].argv,
              ::testing::IsSupersetOf({"--overlap", "--label", "--remote-check",
                                       "train.py", "--chdir", "/w d"}));
  auto stop = slurm->stop_commands(p);
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_EQ(stop[0].argv.back(), "dlaunch-job-0123456789abcdef");
  EXPECT_THAT(stop[0].argv, ::testing::Contains("--overlap"));
}

TEST(BackendsTest, SrunLabelsNameTheTask) {
  int task = -1;
  EXPECT_EQ(task_label("0: [default0]:hi", task), "[default0]:hi");
  EXPECT_EQ(task, 0);
  EXPECT_EQ(task_label(" 12: x: y", task), "x: y");
  EXPECT_EQ(task, 12);
  EXPECT_EQ(task_label("srun: error: n1: task 0", task),
            "srun: error: n1: task 0");
  EXPECT_EQ(task, -1);
  EXPECT_EQ(task_label("no label", task), "no label");
  EXPECT_EQ(task, -1);
}

agent::EnvMap allocation() {
  return {{"SLURM_JOB_ID", "42"},
          {"SLURM_JOB_NODELIST", "gpu[08-10],login"},
          {"SLURM_JOB_NUM_NODES", "4"},
          {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
}

// One variable of a Slurm environment changed, and the words its error
// must hold.
struct SlurmCase {
  std::string name, value, words;
};

// For each case, `read` of `base` with the case's variable changed throws
// a HostsError holding its words.
template <typename Read>
void expect_clear_errors(const agent::EnvMap& base,
                         const std::vector<SlurmCase>& cases, Read read) {
  for (const SlurmCase& c : cases) {
    SCOPED_TRACE(c.name + "=" + c.value);
    agent::EnvMap env = base;
    env[c.name] = c.value;
    try {
      read(env);
      ADD_FAILURE() << "no error";
    } catch (const HostsError& e) {
      EXPECT_THAT(e.what(), HasSubstr(c.words));
    }
  }
}

TEST(SlurmTest, TheAllocationComesFromSlurmsVariables) {
  SlurmAllocation a = read_slurm_allocation(allocation());
  EXPECT_EQ(a.job_id, "42");
  EXPECT_THAT(a.nodes, ElementsAre("gpu08", "gpu09", "gpu10", "login"));
  EXPECT_THAT(a.tasks_per_node, ElementsAre(2, 2, 2, 1));
  // Older names, and no task counts.
  a = read_slurm_allocation(
      {{"SLURM_JOBID", "7"}, {"SLURM_NODELIST", "n1"}, {"SLURM_NNODES", "1"}});
  EXPECT_EQ(a.job_id, "7");
  EXPECT_THAT(a.nodes, ElementsAre("n1"));
  EXPECT_TRUE(a.tasks_per_node.empty());
}

TEST(SlurmTest, ABadOrMissingAllocationIsAClearError) {
  expect_clear_errors(
      allocation(),
      {
          {"SLURM_JOB_ID", "",
           "SLURM_JOB_ID is not set; run dlaunch under salloc"},
          {"SLURM_JOB_NODELIST", "", "SLURM_JOB_NODELIST is not set"},
          {"SLURM_JOB_NODELIST", "gpu[3-1]", "SLURM_JOB_NODELIST='gpu[3-1]': "},
          {"SLURM_JOB_NUM_NODES", "5", "SLURM_JOB_NUM_NODES=5 but"},
          {"SLURM_TASKS_PER_NODE", "2(x3", "is not Slurm's N or N(xK) list"},
          {"SLURM_TASKS_PER_NODE", "2(x2)", "counts 2 node(s) but"},
      },
      [](const agent::EnvMap& env) { read_slurm_allocation(env); });
}

TEST(SlurmTest, GivenHostsMustBeInTheAllocationAndKeepItsOrder) {
  SlurmAllocation a = read_slurm_allocation(allocation());
  std::vector<Host> all = slurm_hosts(a, {});
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0], (Host{.name = "gpu08", .slots = 2}));
  EXPECT_EQ(all[3], (Host{.name = "login", .slots = 1}));
  // Some of them, in Slurm's order (srun's task order), own slots kept.
  std::vector<Host> some = slurm_hosts(
      a, {Host{.name = "login"}, Host{.name = "gpu09", .slots = 8}});
  EXPECT_EQ(some, (std::vector<Host>{Host{.name = "gpu09", .slots = 8},
                                     Host{.name = "login", .slots = 1}}));
  try {
    slurm_hosts(a, {Host{.name = "gpu11"}});
    ADD_FAILURE() << "no error";
  } catch (const HostsError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("host 'gpu11' is not in Slurm job 42's allocation "
                          "(gpu08,gpu09,gpu10,login)"));
  }
}

// What srun sets in the environment of task 1 (node 1) of step 42.3,
// started with -N2 --ntasks-per-node=1 in an allocation of four nodes.
agent::EnvMap srun_task() {
  return {{"SLURM_JOB_ID", "42"},
          {"SLURM_JOB_NODELIST", "gpu[08-10],login"},
          {"SLURM_JOB_NUM_NODES", "4"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_STEP_NODELIST", "gpu[09-10]"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NNODES", "2"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_NODEID", "1"},
          {"SLURM_PROCID", "1"},
          {"SLURM_LOCALID", "0"},
          {"DLAUNCH_RDZV_TOKEN", std::string(64, 'a')}};
}

TEST(SlurmTaskTest, AnSrunTaskKnowsItsStepAndNode) {
  std::optional<SlurmTask> t = read_slurm_task(srun_task());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->job_id, "42");
  EXPECT_EQ(t->step_id, "3");
  // The step's nodes, not the allocation's.
  EXPECT_THAT(t->nodes, ElementsAre("gpu09", "gpu10"));
  EXPECT_EQ(t->node_id, 1);
  EXPECT_EQ(t->reserved_port, 0);
  // A batch script or an salloc shell is no task of a step.
  agent::EnvMap batch = srun_task();
  batch.erase("SLURM_STEP_ID");
  EXPECT_FALSE(read_slurm_task(batch));
  EXPECT_FALSE(read_slurm_task({}));
}

TEST(SlurmTaskTest, MoreThanOneTaskPerNodeOrBadVariablesAreClearErrors) {
  expect_clear_errors(
      srun_task(),
      {
          {"SLURM_STEP_NUM_TASKS", "4",
           "Slurm step 42.3 runs 4 tasks on 2 node(s), and dlaunch, which "
           "starts "
           "its node's workers itself, must run once per node; start it with "
           "srun --ntasks-per-node=1"},
          {"SLURM_LOCALID", "1", "start it with srun --ntasks-per-node=1"},
          {"SLURM_NODEID", "2", "SLURM_NODEID='2' is not a node of"},
          {"SLURM_STEP_NUM_NODES", "3",
           "SLURM_STEP_NUM_NODES='3' disagrees with"},
          {"SLURM_STEP_NODELIST", "gpu[10-09]", "is not a hostlist"},
          {"SLURM_STEP_RESV_PORTS", "x-y", "is not a port range"},
          {"SLURM_JOB_ID", "", "SLURM_JOB_ID is not set"},
      },
      [](const agent::EnvMap& env) { read_slurm_task(env); });
}

TEST(SlurmTaskTest, EveryNodeDerivesTheSameStorePort) {
  agent::EnvMap env = srun_task();
  SlurmTask t = *read_slurm_task(env);
  const int port = slurm_store_port(t, env);
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 30000);
  env["SLURM_NODEID"] = "0";
  env["SLURM_PROCID"] = "0";
  EXPECT_EQ(slurm_store_port(*read_slurm_task(env), env), port);
  // Another step of the job gets another port (FNV-1a of "42.4").
  env["SLURM_STEP_ID"] = "4";
  EXPECT_NE(slurm_store_port(*read_slurm_task(env), env), port);
  // srun --resv-ports, and MASTER_PORT above it.
  env["SLURM_STEP_RESV_PORTS"] = "12000-12003";
  EXPECT_EQ(slurm_store_port(*read_slurm_task(env), env), 12000);
  env["MASTER_PORT"] = "29500";
  EXPECT_EQ(slurm_store_port(*read_slurm_task(env), env), 29500);
  env["MASTER_PORT"] = "99999";
  EXPECT_THROW(slurm_store_port(*read_slurm_task(env), env), HostsError);
}

LaunchOptions options_of(const ParseResult& r) {
  if (auto* e = std::get_if<UsageError>(&r)) {
    ADD_FAILURE() << "rejected: " << e->message;
    return {};
  }
  return std::get<LaunchOptions>(r);
}

// A multi-host head hosts the agents' store and numbers them: --nnodes
// MIN:MAX needs no --rdzv-backend c10d or --rdzv-endpoint (both were asked
// for, and a port of 0 refused, though the head picks its own), a fixed
// --nnodes must match the hosts, and what the head would drop is refused.
TEST(HostPlanTest, TheHeadsHostsBoundNnodes) {
  const agent::EnvMap env = {{"PATH", "/usr/bin:/bin"}};
  auto parse = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--hosts", "n[1-3]"});
    args.push_back("prog");
    return parse_command_line(args, env);
  };
  const LaunchOptions& elastic = options_of(parse({"--nnodes", "2:3"}));
  EXPECT_EQ(elastic.rdzv.min_nodes, 2);
  EXPECT_EQ(elastic.rdzv.max_nodes, 3);
  EXPECT_THAT(dry_run_plan(options_of(parse({"--nnodes", "2:3", "--dry-run"}))),
              HasSubstr("rendezvous: c10d, store hosted here on a free port; "
                        "from 2 to 3 of the 3 hosts' agents join"));
  EXPECT_THAT(dry_run_plan(options_of(
                  parse({"--rdzv-endpoint", "n1:29400", "--nnodes", "3"}))),
              HasSubstr("rendezvous: c10d, store hosted here on port 29400; "
                        "every host's agent joins"));
  options_of(parse({"--rdzv-backend", "c10d", "--rdzv-endpoint", "n1:0",
                    "--nnodes", "1:3"}));
  auto refused = [&](std::vector<std::string> args) {
    ParseResult r = parse(std::move(args));
    auto* e = std::get_if<UsageError>(&r);
    return e ? e->message : std::string("accepted");
  };
  EXPECT_EQ(refused({"--nnodes", "2"}),
            "dlaunch: --nnodes 2: the job has 3 hosts (one agent each); drop "
            "--nnodes or name 2 hosts");
  // A given 1 is a count too (it once planned 3 nodes), from a job file
  // or PET_NNODES alike. A printed job names a count only where one was
  // given, so it reruns on fewer hosts.
  EXPECT_EQ(refused({"--nnodes", "1"}),
            "dlaunch: --nnodes 1: the job has 3 hosts (one agent each); drop "
            "--nnodes or name 1 host");
  EXPECT_EQ(
      std::get<UsageError>(parse_command_line({"--hosts", "n[1-3]", "prog"},
                                              {{"PET_NNODES", "1"}}))
          .message,
      "dlaunch: --nnodes 1: the job has 3 hosts (one agent each); drop "
      "--nnodes or name 1 host");
  EXPECT_THAT(job_yaml(options_of(parse({})), true), Not(HasSubstr("nnodes")));
  EXPECT_THAT(job_yaml(options_of(parse({"--nnodes", "3"})), true),
              HasSubstr("nnodes: 3\n"));
  EXPECT_EQ(refused({"--nnodes", "1:4"}),
            "dlaunch: --nnodes 1:4: the job has 3 hosts (one agent each), "
            "fewer than MAX 4; use MIN:MAX with MIN <= MAX <= 3 or name more "
            "hosts");
  EXPECT_THAT(refused({"--master-addr", "10.1.1.1"}),
              HasSubstr("--master-addr: with a multi-host head (--hosts, "
                        "--hostfile, --launcher slurm) MASTER_ADDR is group "
                        "rank 0's address; drop --master-addr"));
  EXPECT_THAT(refused({"--standalone"}),
              HasSubstr("--standalone runs one node, and a multi-host head"));
  EXPECT_THAT(refused({"--rdzv-backend", "etcd", "--rdzv-endpoint", "e1:2379"}),
              HasSubstr("--rdzv-backend etcd: a multi-host head (--hosts, "
                        "--hostfile, --launcher slurm) meets its agents in a "
                        "store of its own"));
  EXPECT_THAT(refused({"--node-rank", "1"}),
              HasSubstr("--node-rank: a multi-host head (--hosts, "
                        "--hostfile, --launcher slurm) numbers its hosts' "
                        "agents itself; drop --node-rank"));
  EXPECT_THAT(
      refused({"--rdzv-endpoint", "n1:29400", "--master-port", "29400"}),
      HasSubstr("--master-port 29400 is the agents' store port"));
  // GPU indices of a host without slots need this machine's count.
  const agent::EnvMap no_gpu = {{"PATH", "/usr/bin:/bin"},
                                {"DLAUNCH_CUDA_DEVICES", "/bin/false"}};
  ParseResult unknown =
      parse_command_line({"--hosts", "n[1-3]", "--nproc-per-node", "gpu",
                          "--exclude", "n2:0", "prog"},
                         no_gpu);
  ASSERT_TRUE(std::holds_alternative<UsageError>(unknown));
  EXPECT_THAT(std::get<UsageError>(unknown).message,
              HasSubstr("--exclude: n2:0: n2 has no slots given"));
  // auto and cpu may count CPUs here, never a host's GPUs.
  for (const char* spec : {"auto", "cpu"}) {
    EXPECT_THAT(refused({"--nproc-per-node", spec, "--include", "n2:1"}),
                HasSubstr("--include: n2:1: n2 has no slots given"));
  }
}

// A printed job of the allocation's nodes leaves them to the next
// allocation (it failed there: "host 'gpu08' is not in Slurm job 43's
// allocation"); named hosts stay.
TEST(SlurmTest, APrintedJobRerunsInAnotherAllocation) {
  const std::string all =
      job_yaml(options_of(parse_command_line({"--launcher", "slurm", "prog"},
                                             allocation())),
               true);
  EXPECT_THAT(all, Not(HasSubstr("hosts")));
  EXPECT_THAT(all, HasSubstr("launcher: slurm"));
  EXPECT_THAT(job_yaml(options_of(parse_command_line(
                           {"--launcher", "slurm", "--hosts", "gpu09", "prog"},
                           allocation())),
                       true),
              HasSubstr("hosts: [gpu09:2]"));
}

TEST(SlurmTaskTest, ATaskWithoutARendezvousOfItsOwnJoinsItsStep) {
  agent::EnvMap env = srun_task();
  env["MASTER_PORT"] = "23456";
  ParseResult r = parse_command_line({"--nproc-per-node", "2", "prog"}, env);
  const LaunchOptions& o = options_of(r);
  // The step's node count is the job's: its job.yaml names it (a rerun
  // planned one node).
  EXPECT_THAT(job_yaml(o, true), HasSubstr("nnodes: 2\n"));
  EXPECT_EQ(o.rdzv.backend, "static");
  EXPECT_EQ(o.rdzv.min_nodes, 2);
  EXPECT_EQ(o.rdzv.max_nodes, 2);
  EXPECT_EQ(o.rdzv.node_rank, 1);
  EXPECT_EQ(o.rdzv.endpoint_host, "gpu09");
  EXPECT_EQ(o.rdzv.endpoint_port, 23456);
  EXPECT_EQ(o.rdzv.is_host, std::optional<bool>(false));
  EXPECT_EQ(o.rdzv.local_addr, "gpu10");
  EXPECT_EQ(o.agent.run_id, "42.3");
  EXPECT_EQ(o.agent.master_port, 0);  // the workers' own, picked free
  EXPECT_EQ(o.agent.master_addr, "gpu09");
  // The first node's agent hosts the store.
  env["SLURM_NODEID"] = "0";
  EXPECT_EQ(options_of(parse_command_line({"prog"}, env)).rdzv.is_host,
            std::optional<bool>(true));
  // c10d when asked; a given --rdzv-id stays.
  const LaunchOptions& c = options_of(parse_command_line(
      {"--rdzv-backend", "c10d", "--rdzv-id", "mine", "prog"}, env));
  EXPECT_EQ(c.rdzv.backend, "c10d");
  EXPECT_EQ(c.rdzv.node_rank, -1);
  EXPECT_EQ(c.rdzv.endpoint_host, "gpu09");
  EXPECT_EQ(c.agent.run_id, "mine");
}

TEST(SlurmTaskTest, AGivenRendezvousOrOneNodeIsLeftAlone) {
  agent::EnvMap env = srun_task();
  const LaunchOptions& manual =
      options_of(parse_command_line({"--nnodes", "2", "--rdzv-backend", "c10d",
                                     "--rdzv-endpoint", "n0:29400", "prog"},
                                    env));
  EXPECT_EQ(manual.rdzv.endpoint_host, "n0");
  EXPECT_FALSE(manual.rdzv.is_host.has_value());
  EXPECT_EQ(manual.agent.run_id, "");
  env["PET_NNODES"] = "1";
  EXPECT_EQ(options_of(parse_command_line({"prog"}, env)).rdzv.max_nodes, 1);
  // A one-node step runs as one node always does.
  env = srun_task();
  env["SLURM_STEP_NODELIST"] = "gpu09";
  env["SLURM_STEP_NUM_NODES"] = env["SLURM_NNODES"] = "1";
  env["SLURM_STEP_NUM_TASKS"] = env["SLURM_NTASKS"] = "1";
  env["SLURM_NODEID"] = "0";
  const LaunchOptions& one = options_of(parse_command_line({"prog"}, env));
  EXPECT_EQ(one.standalone,
            options_of(parse_command_line({"prog"}, {})).standalone);
  EXPECT_EQ(one.rdzv.endpoint_host, "");
}

TEST(SlurmTaskTest, ATaskWithoutATokenOrWithTwoPerNodeIsRefused) {
  agent::EnvMap env = srun_task();
  env.erase("DLAUNCH_RDZV_TOKEN");
  ParseResult r = parse_command_line({"prog"}, env);
  ASSERT_TRUE(std::holds_alternative<UsageError>(r));
  EXPECT_EQ(std::get<UsageError>(r).exit_code, 2);
  EXPECT_THAT(std::get<UsageError>(r).message,
              HasSubstr("as a task of Slurm step 42.3 on 2 nodes, dlaunch "
                        "meets the other nodes in a store on gpu09 that the "
                        "network can reach, and the job has no token to guard "
                        "it; give every task the same secret: export "
                        "DLAUNCH_RDZV_TOKEN=$(openssl rand -hex 32) before "
                        "srun"));
  // A plan needs no token.
  EXPECT_TRUE(std::holds_alternative<LaunchOptions>(
      parse_command_line({"--dry-run", "prog"}, env)));
  env = srun_task();
  env["SLURM_NTASKS"] = env["SLURM_STEP_NUM_TASKS"] = "4";
  r = parse_command_line({"prog"}, env);
  ASSERT_TRUE(std::holds_alternative<UsageError>(r));
  EXPECT_THAT(std::get<UsageError>(r).message,
              HasSubstr("--ntasks-per-node=1"));
}

TEST(BackendsTest, ShellCommandQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_command({"a", "b c", "it's", "", "$X"}),
            "a 'b c' 'it'\\''s' '' '$X'");
}

// A command killed by a signal ends with a shell's status, 128+N (it was
// N: a host's agent SIGKILLed read as "exit 9").
TEST(CommandRunnerTest, ACommandKilledByASignalEndsWith128PlusIt) {
  std::vector<AgentCommand> cmds(2);
  cmds[0].argv = {"sh", "-c", "kill -9 $$"};
  cmds[1].argv = {"sh", "-c", "exit 9"};
  CommandRunner run(cmds, CommandOutput::kCapture);
  ASSERT_TRUE(run.wait(std::chrono::seconds(30)));
  EXPECT_EQ(run.results()[0].exit_code, 137);
  EXPECT_EQ(run.results()[1].exit_code, 9);
}

// HostLosses over real commands, one per "host": `scripts[i]` runs for
// host hosts[i]; what it tells is collected in order.
struct Losses {
  std::vector<AgentCommand> cmds;
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> told;
  bool store_up = true;

  explicit Losses(const std::vector<std::string>& scripts) {
    for (size_t i = 0; i < scripts.size(); ++i) {
      AgentCommand c;
      c.argv = {"sh", "-c", scripts[i]};
      c.hosts = {std::string(1, static_cast<char>('a' + i))};
      cmds.push_back(c);
    }
  }
  HostLosses::Tell tell() {
    return [this](const std::string& k, const std::string& v) {
      std::lock_guard<std::mutex> lock(mu);
      told.emplace_back(k, v);
      return store_up;
    };
  }
  std::vector<std::pair<std::string, std::string>> seen() {
    std::lock_guard<std::mutex> lock(mu);
    return told;
  }
};

using Told = std::vector<std::pair<std::string, std::string>>;

// Hosts lost while enough are left are told as the count that can still
// join; a host whose agent succeeded is no loss.
TEST(HostLossesTest, TellsHowManyHostsAreLeftWhileEnoughAre) {
  Losses l({"exit 3", "sleep 0.5; exit 0", "sleep 1"});
  CommandRunner run(l.cmds, CommandOutput::kCapture);
  HostLosses losses(run, 3, 2, l.tell());
  ASSERT_TRUE(run.wait(std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  losses.stop();
  EXPECT_EQ(l.seen(), (Told{{"hosts_left", "2"}}));
  EXPECT_EQ(losses.lost(),
            (std::vector<std::pair<std::string, int>>{{"a", 3}}));
  EXPECT_FALSE(losses.aborted());
}

// Fewer hosts left than the minimum: told once, naming them in the order
// they ended, with the first one's status; then it watches no more.
TEST(HostLossesTest, TooFewLeftAbortsNamingTheLostHosts) {
  Losses l({"exit 3", "sleep 0.4; exit 4", "exec sleep 30"});
  CommandRunner run(l.cmds, CommandOutput::kCapture);
  HostLosses losses(run, 3, 2, l.tell());
  for (int i = 0; i < 100 && !losses.aborted(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(losses.aborted());
  const std::string why =
      "the agents on a, b ended, the first with exit 3 (their lines above "
      "say why), leaving 1 of 3 hosts where the job needs 2";
  EXPECT_EQ(l.seen(), (Told{{"hosts_left", "2"}, {"aborted", why}}));
  EXPECT_EQ(losses.abort()->text, why);
  EXPECT_EQ(losses.abort()->code, 3);
  run.signal_all(SIGKILL);
}

// The head's own agent counts like a host's; an abort the store did not
// take is not one.
TEST(HostLossesTest, TheHeadsOwnAgentCountsAndAnUntoldAbortIsNone) {
  Losses l({"exec sleep 30", "sleep 0.5; exit 2"});
  l.store_up = false;
  CommandRunner run(l.cmds, CommandOutput::kCapture);
  HostLosses losses(run, 3, 2, l.tell());
  losses.lose("head", 5);
  for (int i = 0; i < 100 && l.seen().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string why =
      "the agents on head, b ended, the first with exit 5 (their lines "
      "above say why), leaving 1 of 3 hosts where the job needs 2";
  EXPECT_EQ(l.seen(), (Told{{"hosts_left", "2"}, {"aborted", why}}));
  EXPECT_FALSE(losses.aborted());
  EXPECT_EQ(losses.lost(),
            (std::vector<std::pair<std::string, int>>{{"head", 5}, {"b", 2}}));
  run.signal_all(SIGKILL);
}

}  // namespace
}  // namespace dlaunch::launcher
