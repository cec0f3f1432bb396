// Multi-host launch from one command over real processes: the head
// (`dlaunch --hosts ...`) starts one agent per "host" (loopback addresses
// 127.0.0.2-4) through --launcher local, or pdsh's exec module, and every
// agent joins the head's store. Each job's processes carry a marker
// variable (-x) that the test finds them by in /proc; waits are bounded
// and on observed state.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "launcher/remote_job.h"
#include "launcher/ship.h"
#include "tests/testing/sshd.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::CommandResult;
using ::testing::HasSubstr;
using testing::marked;
using testing::none_marked;
using ::testing::Not;
using testing::Subprocess;
using testing::TempDir;
using testing::unique_mark;
using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN_DIR "/dlaunch";

testing::CommandOptions cmd(std::vector<std::string> argv,
                            std::map<std::string, std::string> env = {},
                            std::string cwd = "") {
  testing::CommandOptions o;
  o.argv = std::move(argv);
  o.env = std::move(env);
  o.cwd = std::move(cwd);
  return o;
}

bool have(const std::string& program) {
  return testing::run_command(cmd({"sh", "-c", "command -v " + program}))
             .exit_code == 0;
}

// The live processes of job `tag`: agents (`--job-tag TAG` in their
// command line) and workers (DLAUNCH_JOB_TAG=TAG in their environment).
std::vector<pid_t> tagged(const std::string& tag) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string text;
    for (const char* f : {"cmdline", "environ"}) {
      text += testing::read_proc_file(e.path() / f) + '\0';
    }
    if (text.find(std::string("--job-tag") + '\0' + tag + '\0') !=
            std::string::npos ||
        text.find("DLAUNCH_JOB_TAG=" + tag + '\0') != std::string::npos) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

std::vector<std::string> head(const std::string& launcher,
                              const std::string& hosts, const std::string& mark,
                              std::vector<std::string> rest) {
  std::vector<std::string> argv = {
      kDlaunch,       "--launcher", launcher, "--hosts",         hosts,
      "--local-addr", "127.0.0.1",  "-x",     "DLT_MARK=" + mark};
  argv.insert(argv.end(), rest.begin(), rest.end());
  return argv;
}

// The head's TORCHELASTIC_ERROR_FILE at `path`, parsed (discarded when it
// is not JSON).
nlohmann::json error_file(const std::string& path) {
  return nlohmann::json::parse(testing::read_file(path), nullptr, false);
}

// Each test once per launcher: local; pdsh with its exec module; pdsh over
// ssh (pdcp places one job file for all hosts); ssh. The ssh ones go through
// an sshd of the test's own on the three loopback "hosts".
class MultiHost : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam().starts_with("pdsh") && !have("pdsh")) {
      GTEST_SKIP() << "pdsh is not installed (scripts/setup installs it)";
    }
    if (GetParam() == "ssh" || GetParam() == "pdsh-ssh") {
      sshd_ = std::make_unique<testing::TestSshd>(
          std::vector<std::string>{"127.0.0.2", "127.0.0.3", "127.0.0.4"});
      if (!sshd_->available()) GTEST_SKIP() << sshd_->why_not();
    }
  }

  // head() for this test's launcher.
  std::vector<std::string> head(const std::string& hosts,
                                const std::string& mark,
                                std::vector<std::string> rest) const {
    if (GetParam() == "ssh") {
      rest.insert(rest.begin(), {"--ssh-port", std::to_string(sshd_->port()),
                                 "--ssh-args", sshd_->ssh_args()});
    }
    return dlaunch::head(GetParam() == "pdsh-ssh" ? "pdsh" : GetParam(), hosts,
                         mark, std::move(rest));
  }

  // The head's environment for this test's launcher.
  std::map<std::string, std::string> env() const {
    if (GetParam() == "pdsh") return {{"PDSH_RCMD_TYPE", "exec"}};
    if (GetParam() == "pdsh-ssh") {
      return {{"PDSH_RCMD_TYPE", "ssh"},
              {"PDSH_SSH_ARGS_APPEND", "-p " + std::to_string(sshd_->port()) +
                                           " " + sshd_->ssh_args()}};
    }
    return {};
  }

  // Runs a script at `path` (made here; it prints "RAN $RANK") on two
  // hosts, named on the command line as `given`, from folder `cwd` ("": the
  // test's), and expects both ranks' lines.
  void run_script_on_two_hosts(const fs::path& path, const std::string& given,
                               const std::string& cwd) const {
    const std::string mark = unique_mark("m");
    testing::write_file(path, "#!/bin/sh\necho RAN $RANK\n");
    fs::permissions(path, fs::perms::owner_all);
    testing::CommandOptions o =
        cmd(head("127.0.0.2,127.0.0.3", mark, {given}), env());
    o.cwd = cwd;
    CommandResult r = testing::run_command(o, 90s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("]:RAN 0\n"));
    EXPECT_THAT(r.out, HasSubstr("]:RAN 1\n"));
    EXPECT_TRUE(none_marked(mark, 30s));
  }

  std::unique_ptr<testing::TestSshd> sshd_;
};

TEST_P(MultiHost, EveryHostRunsAnAgentInOneWorld) {
  const std::string mark = unique_mark("m");
  CommandResult r = testing::run_command(
      cmd(head("127.0.0.[2-4]:2", mark,
               {"sh", "-c",
                "echo ENV rank=$RANK ws=$WORLD_SIZE gr=$GROUP_RANK "
                "lws=$LOCAL_WORLD_SIZE master=$MASTER_ADDR "
                "tok=${#DLAUNCH_RDZV_TOKEN} tag=$DLAUNCH_JOB_TAG"}),
          env()),
      90s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::regex re(
      "(127\\.0\\.0\\.[2-4]) \\[default([01])\\]:ENV rank=(\\d) ws=6 gr=(\\d) "
      "lws=2 master=127\\.0\\.0\\.[2-4] tok=64 tag=(dlaunch-job-\\w+)");
  std::set<int> ranks;
  std::set<std::string> hosts, tags;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), re);
       it != std::sregex_iterator(); ++it) {
    ranks.insert(std::stoi((*it)[3]));
    hosts.insert((*it)[1]);
    tags.insert((*it)[5]);
    // RANK = GROUP_RANK * 2 + LOCAL_RANK.
    EXPECT_EQ(std::stoi((*it)[3]),
              std::stoi((*it)[4]) * 2 + std::stoi((*it)[2]));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3, 4, 5})) << r.out;
  EXPECT_EQ(hosts.size(), 3u);
  ASSERT_EQ(tags.size(), 1u);
  // pdsh's job files are gone: one per host (exec module), one for all
  // (over ssh, removed by the agents as the job succeeded).
  for (const char* h : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    EXPECT_FALSE(fs::exists("/tmp/" + *tags.begin() + "-" + h + ".job"));
  }
  EXPECT_FALSE(fs::exists("/tmp/" + *tags.begin() + ".job"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A relative program is found from the head's folder (every host's
// default --chdir) by the pre-flight too, not from where the remote shell
// starts (ssh: the user's home; the check said "program-missing").
TEST_P(MultiHost, ARelativeProgramIsFoundFromTheHeadsFolder) {
  TempDir dir;
  run_script_on_two_hosts(dir / "prog.sh", "./prog.sh", dir.path().string());
}

// A relative --chdir is the head's folder's on every host, as mpirun's
// -wdir, and PWD names it: over ssh it was resolved from the login folder
// (the user's home), where it does not exist.
TEST_P(MultiHost, ARelativeChdirIsTheHeadsFolderOnEveryHost) {
  TempDir dir;
  fs::create_directory(dir / "sub");
  const std::string mark = unique_mark("m");
  testing::write_file(dir / "sub" / "prog.sh",
                      "#!/bin/sh\necho RAN $RANK in $(pwd -P)\n", 0755);
  testing::CommandOptions o =
      cmd(head("127.0.0.2,127.0.0.3", mark,
               {"--chdir", "sub", "sh", "-c", "./prog.sh; printenv PWD"}),
          env());
  o.cwd = dir.path().string();
  CommandResult r = testing::run_command(o, 90s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string sub = fs::canonical(dir / "sub").string();
  EXPECT_THAT(r.out, HasSubstr("]:RAN 0 in " + sub + "\n"));
  EXPECT_THAT(r.out, HasSubstr("]:RAN 1 in " + sub + "\n"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.2 [default0]:" + sub + "\n"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.3 [default0]:" + sub + "\n"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A progress bar (tqdm redraws with '\r') on a remote host moves on the
// head's console before its line ends: the agent there shows redraws as
// they come and the head passes them on with their host.
TEST_P(MultiHost, AProgressRedrawReachesTheHeadBeforeItsLineEnds) {
  if (GetParam().starts_with("pdsh")) {
    GTEST_SKIP() << "pdsh passes on whole lines only";
  }
  TempDir dir;
  const std::string mark = unique_mark("m");
  const std::string go = (dir / "go").string();
  Subprocess p(cmd(head("127.0.0.2", mark,
                        {"sh", "-c",
                         "printf '\\r 10%%'; while [ ! -e " + go +
                             " ]; do sleep 0.02; done; printf '\\r100%%\\n'"}),
                   env()));
  ASSERT_TRUE(p.wait_for_output("127.0.0.2 [default0]: 10%\r", 60s))
      << p.out() << p.err();
  testing::write_file(go, "");
  CommandResult r = p.wait(60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(p.out(), HasSubstr("127.0.0.2 [default0]:100%\n"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A program whose path has a space reaches every host whole (pdsh over
// ssh once passed the check's words unquoted to the remote shell).
TEST_P(MultiHost, AProgramPathWithASpaceReachesEveryHost) {
  TempDir dir;
  fs::create_directories(dir / "my dir");
  const fs::path prog = dir / "my dir" / "prog.sh";
  run_script_on_two_hosts(prog, prog.string(), "");
}

TEST_P(MultiHost, EnvironmentValuesArriveIntactAndLarge) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  const std::string tricky = "it's \"quoted\" $HOME `x` \\n end";
  testing::write_file(dir / "env", "# comment\n\nE1=a b  c\nE2=" + tricky +
                                       "\nexport E3=x=y\n");
  // 200 KB in four variables (Linux caps one string at 128 KiB).
  const std::string big(50 * 1024, 'b');
  CommandResult r = testing::run_command(
      cmd(head("127.0.0.2,127.0.0.3", mark,
               {"-x",
                "A=sp ace",
                "-x",
                "Q=" + tricky,
                "-x",
                "BIG1",
                "-x",
                "BIG2",
                "-x",
                "BIG3",
                "-x",
                "BIG4",
                "-x",
                "NCCL_FROM_HEAD_NOT",
                "--env-file",
                (dir / "env").string(),
                "--chdir",
                dir.path().string(),
                "sh",
                "-c",
                "printf '%s|%s|%s|%s|%s|%s|%s|%s\\n' \"$RANK\" \"$A\" "
                "\"$Q\" \"$E1\" \"$E2\" \"$E3\" "
                "\"$((${#BIG1}+${#BIG2}+${#BIG3}+${#BIG4}))\" "
                "\"$NCCL_DLT_FORWARDED:$(pwd)\""}),
          [&] {
            auto e = env();
            for (const char* n : {"BIG1", "BIG2", "BIG3", "BIG4"}) e[n] = big;
            e["NCCL_DLT_FORWARDED"] = "yes";
            return e;
          }()),
      90s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* rank : {"0", "1"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string("]:") + rank + "|sp ace|" +
                                 tricky + "|a b  c|" + tricky + "|x=y|" +
                                 std::to_string(4 * big.size()) +
                                 "|yes:" + dir.path().string() + "\n"))
        << r.out;
  }
}

TEST_P(MultiHost, SigintToTheHeadLeavesNothingOnAnyHost) {
  const std::string mark = unique_mark("m");
  Subprocess job(cmd(head("127.0.0.[2-3]", mark,
                          {"--nproc-per-node", "2", "sh", "-c",
                           "echo up-$RANK; exec sleep 300"}),
                     env()));
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(job.wait_for_output("up-" + std::to_string(rank), 60s))
        << job.out() << job.err();
  }
  // A worker's environ reads empty while it execs sleep (the read's mm is
  // gone): count until all four are seen.
  EXPECT_TRUE(
      testing::eventually([&] { return marked(mark).size() >= 4u; }, 30s))
      << marked(mark).size();
  job.signal(SIGINT);
  CommandResult r = job.wait(60s);
  EXPECT_FALSE(r.timed_out) << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(none_marked(mark, 30s)) << marked(mark).size() << " left";
}

// A SIGKILLed head cannot tear anything down: every agent must notice on
// its own (its connection to the head, its link to the head's store) and
// end its workers.
TEST_P(MultiHost, SigkillToTheHeadLeavesNothingOnAnyHost) {
  const std::string mark = unique_mark("m");
  Subprocess job(cmd(head("127.0.0.[2-3]", mark,
                          {"--nproc-per-node", "2", "sh", "-c",
                           "echo up-$RANK-$DLAUNCH_JOB_TAG.; exec sleep 300"}),
                     env()));
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(job.wait_for_output("up-" + std::to_string(rank), 60s))
        << job.out() << job.err();
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(job.out(), m,
                                std::regex("up-0-(dlaunch-job-\\w+)\\.")));
  const std::string tag = m[1];
  // Both agents (--job-tag in their command line) and the four workers;
  // a worker between its "up" and its exec reads as untagged (a process
  // mid-exec has an empty cmdline and environ), so wait for the count.
  EXPECT_TRUE(
      testing::eventually([&] { return tagged(tag).size() >= 6u; }, 30s))
      << tagged(tag).size();
  EXPECT_TRUE(
      testing::eventually([&] { return marked(mark).size() == 4u; }, 30s))
      << marked(mark).size();
  job.signal(SIGKILL);
  EXPECT_EQ(job.wait(30s).signal, SIGKILL);
  EXPECT_TRUE(none_marked(mark, 60s)) << marked(mark).size() << " left";
  EXPECT_TRUE(testing::eventually([&] { return tagged(tag).empty(); }, 30s))
      << tagged(tag).size() << " left";
  // No job file (the token is in it) outlives the agents.
  EXPECT_FALSE(fs::exists("/tmp/" + tag + ".job"));
}

// The head's faults (--fault and DLAUNCH_FAULTS) reach the agents it
// starts and fire on the host that runs their rank: each costs one
// restart, and the job then finishes.
TEST_P(MultiHost, FaultsFireOnTheHostsTheHeadStarted) {
  const std::string mark = unique_mark("m");
  auto head_env = env();
  head_env["DLAUNCH_FAULTS"] = "kill:rank=3";
  CommandResult r = testing::run_command(
      cmd(head("127.0.0.[2-3]", mark,
               {"--nproc-per-node", "2", "--max-restarts", "2", "--fault",
                "exit:rank=1:attempt=1:code=9", "sh", "-c",
                "echo up-$RANK-$TORCHELASTIC_RESTART_COUNT; "
                "if [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; then exec sleep "
                "300; fi"}),
          head_env),
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("fault injected: kill:rank=3"));
  EXPECT_THAT(r.err, HasSubstr("fault injected: exit:rank=1:code=9:attempt=1"));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(r.out, HasSubstr("up-" + std::to_string(rank) + "-2")) << r.out;
  }
  EXPECT_TRUE(none_marked(mark, 30s));
}

TEST_P(MultiHost, StoppingOneOfTwoJobsLeavesTheOther) {
  const std::string a = unique_mark("m"), b = unique_mark("m") + "b";
  auto start = [&](const std::string& mark) {
    return std::make_unique<Subprocess>(
        cmd(head("127.0.0.[2-3]", mark,
                 {"sh", "-c", "echo up-$RANK; exec sleep 300"}),
            env()));
  };
  auto ja = start(a);
  auto jb = start(b);
  for (auto* j : {ja.get(), jb.get()}) {
    ASSERT_TRUE(j->wait_for_output("up-0", 60s)) << j->err();
    ASSERT_TRUE(j->wait_for_output("up-1", 60s)) << j->err();
  }
  // One worker per host; counted once both have exec'd sleep (a worker's
  // environ reads empty while it execs).
  const size_t b_count = 2;
  ASSERT_TRUE(
      testing::eventually([&] { return marked(b).size() == b_count; }, 30s))
      << marked(b).size();
  ja->signal(SIGINT);
  EXPECT_FALSE(ja->wait(60s).timed_out);
  EXPECT_TRUE(none_marked(a, 30s));
  // Every process of the other job still runs.
  EXPECT_EQ(marked(b).size(), b_count);
  EXPECT_TRUE(testing::process_alive(jb->pid()));
  jb->signal(SIGINT);
  EXPECT_FALSE(jb->wait(60s).timed_out);
  EXPECT_TRUE(none_marked(b, 30s));
}

// The job's status and the head's error file are the root cause's, the
// host whose worker failed: the others' agents fail because it did, and
// the first of them to end gave the job its status (1) and no error file.
TEST_P(MultiHost, AFailedHostStopsTheJobEverywhere) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  const std::string file = (dir / "head.json").string();
  std::map<std::string, std::string> e = env();
  e["TORCHELASTIC_ERROR_FILE"] = file;
  // Group rank 1's worker fails at once; the others would sleep.
  CommandResult r = testing::run_command(
      cmd(head("127.0.0.[2-4]", mark,
               {"sh", "-c",
                "if [ $GROUP_RANK = 1 ]; then printf '%s' '{\"message\": "
                "{\"message\": \"boom\", \"extraInfo\": "
                "{\"py_callstack\": \"tb\", \"timestamp\": \"1\"}}}' > "
                "$TORCHELASTIC_ERROR_FILE; exit 7; fi; exec sleep 300"}),
          e),
      90s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  const nlohmann::json j = error_file(file);
  ASSERT_FALSE(j.is_discarded()) << testing::read_file(file);
  EXPECT_EQ(j["message"]["message"], "boom");
  EXPECT_EQ(j["message"]["errorCode"], 7);
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A GPU counter at DIR/gpus-once: 0 for the first host that asks, else 2.
std::string gpus_once(const TempDir& dir) {
  const fs::path p = dir / "gpus-once";
  testing::write_file(p,
                      "#!/bin/sh\nif mkdir " + (dir / "once").string() +
                          " 2>/dev/null; then echo 0; else echo 2; fi\n",
                      0755);
  return p.string();
}

// An elastic job (--nnodes 2:3) whose first host to count its GPUs finds
// none: the two others train to the end and the job succeeds, naming the
// lost host. The head runs no agent here. Their first round closes once
// both joined, not at the last call (600 s, past the test's bound); the
// job once stopped everywhere at the first failure, with its status.
TEST_P(MultiHost, AnElasticJobGoesOnWithoutAHostThatFailedBeforeJoining) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  CommandResult r = testing::run_command(
      cmd(head("127.0.0.[2-4]", mark,
               {"-x", "DLAUNCH_CUDA_DEVICES=" + gpus_once(dir), "--nnodes",
                "2:3", "--rdzv-conf", "last_call_timeout=600",
                "--nproc-per-node", "gpu", "sh", "-c",
                "sleep 1; echo DONE $RANK of $WORLD_SIZE"}),
          env()),
      90s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(r.out, HasSubstr("DONE " + std::to_string(rank) + " of 4\n"));
  }
  EXPECT_THAT(r.err, HasSubstr("no CUDA device is visible"));
  EXPECT_THAT(r.err,
              ::testing::ContainsRegex(
                  "dlaunch: the job finished without 127\\.0\\.0\\.[2-4] "
                  "\\(exit 2\\), whose agent ended \\(its lines above say "
                  "why\\): an elastic job \\(--nnodes 2:3\\) goes on while at "
                  "least 2 hosts are left\n"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// The head hosts the agents' store, which raises its open-file limit;
// workers on every host, the head's own among them, get the one dlaunch
// was started with (they got the raised one).
TEST_P(MultiHost, WorkersKeepTheUsersOpenFileLimit) {
  if (GetParam() != "local") GTEST_SKIP() << "the limit of this machine";
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_max < 2048) GTEST_SKIP() << "no room above 1024 to raise to";
  const std::string mark = unique_mark("m");
  std::vector<std::string> argv = head("127.0.0.1,127.0.0.2", mark,
                                       {"sh", "-c", "echo soft=$(ulimit -Sn)"});
  std::string line = "ulimit -Sn 1024 && exec";
  for (const std::string& a : argv) line += " '" + a + "'";
  CommandResult r = testing::run_command(cmd({"sh", "-c", line}, env()), 90s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("127.0.0.1 [default0]:soft=1024\n"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.2 [default0]:soft=1024\n"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// Every job.yaml of the files named `job.yaml` under `dir`.
std::vector<std::string> job_yamls(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename() == "job.yaml") out.push_back(e.path().string());
  }
  return out;
}

// Each host's job.yaml is the whole job, which reruns from it (it held
// the host's part: the head's store of that run, rdzv_conf is_host: false,
// no hosts). 127.0.0.1 is the head's own (in-process where the
// launcher allows).
TEST_P(MultiHost, EachHostsJobYamlIsTheWholeJob) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  CommandResult r =
      testing::run_command(cmd(head("127.0.0.1,127.0.0.2", mark,
                                    {"--log-dir", (dir / "logs").string(), "sh",
                                     "-c", "echo RAN $RANK"}),
                               env()),
                           90s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> files = job_yamls(dir / "logs");
  ASSERT_EQ(files.size(), 2u) << r.err;
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    const std::string text = testing::read_file(f);
    EXPECT_THAT(text, HasSubstr("hosts: [127.0.0.1, 127.0.0.2]\n"));
    EXPECT_THAT(text, HasSubstr("launcher: " +
                                std::string(GetParam() == "ssh"     ? "ssh"
                                            : GetParam() == "local" ? "local"
                                                                    : "pdsh")));
    EXPECT_THAT(text, Not(HasSubstr("is_host")));
    EXPECT_THAT(text, Not(HasSubstr("rdzv_endpoint")));
  }
  CommandResult again =
      testing::run_command(cmd({kDlaunch, "--config", files[0]}, env()), 90s);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("]:RAN 1\n"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

INSTANTIATE_TEST_SUITE_P(Launchers, MultiHost,
                         ::testing::Values("local", "pdsh", "pdsh-ssh", "ssh"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::erase(n, '-');
                           return n;
                         });

TEST(MultiHostHead, TheHeadInTheListRunsItsAgentInProcess) {
  const std::string mark = unique_mark("m");
  CommandResult r = testing::run_command(
      cmd(head("local", "localhost,127.0.0.3", mark,
               {"sh", "-c", "echo ENV rank=$RANK ppid=$PPID"})),
      60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Group ranks follow the order the agents joined in.
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "localhost \\[default0\\]:ENV rank=[01]"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "127.0.0.3 \\[default0\\]:ENV rank=[01]"));
}

// A SIGKILLed head cannot remove its staging folder ($TMPDIR/
// dlaunch-job-TAG.d): the next head of the user does, and leaves the
// folder of a head that still runs alone.
TEST(MultiHostHead, TheNextHeadRemovesAKilledHeadsStagingFolderNotALiveOnes) {
  TempDir tmp;
  const std::map<std::string, std::string> env = {
      {"TMPDIR", tmp.path().string()}};
  auto staging = [&] {
    std::set<fs::path> out;
    for (const auto& e : fs::directory_iterator(tmp.path())) {
      const std::string name = e.path().filename();
      if (name.starts_with("dlaunch-job-") && name.ends_with(".d")) {
        out.insert(e.path());
      }
    }
    return out;
  };
  auto start = [&](const std::string& mark) {
    auto job = std::make_unique<Subprocess>(
        cmd(head("local", "127.0.0.[2-3]", mark,
                 {"--nproc-per-node", "1", "sh", "-c",
                  "echo up-$RANK; exec sleep 300"}),
            env));
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(job->wait_for_output("up-" + std::to_string(rank), 60s))
          << job->out() << job->err();
    }
    return job;
  };
  const std::string killed_mark = unique_mark("m");
  std::unique_ptr<Subprocess> killed = start(killed_mark);
  const std::set<fs::path> killed_dir = staging();
  ASSERT_EQ(killed_dir.size(), 1u);
  killed->signal(SIGKILL);
  EXPECT_EQ(killed->wait(30s).signal, SIGKILL);
  EXPECT_TRUE(none_marked(killed_mark, 60s));
  EXPECT_EQ(staging(), killed_dir) << "nothing else removes it";

  // The next head: the killed head's folder goes, its own is made.
  const std::string live_mark = unique_mark("m");
  std::unique_ptr<Subprocess> live = start(live_mark);
  const std::set<fs::path> live_dir = staging();
  ASSERT_EQ(live_dir.size(), 1u);
  EXPECT_NE(live_dir, killed_dir);

  // One more head, run to its end: the live head's folder stays.
  CommandResult r = testing::run_command(
      cmd(head("local", "127.0.0.2", unique_mark("m"), {"true"}), env), 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(staging(), live_dir);

  live->signal(SIGINT);
  EXPECT_FALSE(live->wait(60s).timed_out);
  EXPECT_TRUE(staging().empty());
  EXPECT_TRUE(none_marked(live_mark, 30s));
}

// --chdir is every host's folder, the head's own included (its agent runs
// in-process); one missing on the head fails before any host starts.
TEST(MultiHostHead, ChdirHoldsForTheHeadsOwnWorkersToo) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  auto run = [&](const std::string& folder) {
    return testing::run_command(
        cmd({kDlaunch, "--launcher", "local", "--hosts", "127.0.0.1,127.0.0.2",
             "--local-addr", "127.0.0.1", "-x", "DLT_MARK=" + mark, "--chdir",
             folder, "sh", "-c", "echo PWD=$(pwd)"}),
        60s);
  };
  CommandResult r = run(dir.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* h : {"127.0.0.1", "127.0.0.2"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string(h) + " [default0]:PWD=" +
                                 dir.path().string() + "\n"));
  }
  r = run((dir / "missing").string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("--chdir: cannot enter " + (dir / "missing").string() +
                        " on this machine"));
  EXPECT_THAT(r.out, Not(HasSubstr("PWD=")));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A remote agent's --chdir that its host lacks fails as the head's own
// does (one settle_host()): the folder, the host and the fix, before any
// worker starts.
TEST(MultiHostHead, ARemoteAgentsMissingChdirNamesTheHostAndTheFix) {
  TempDir dir;
  launcher::RemoteJob job;
  job.host = "node07";
  job.job_tag = "dlaunch-job-chdir";
  job.chdir = (dir / "missing").string();
  job.args = {"--nproc-per-node=1", "--", "sh", "-c", "echo STARTED"};
  testing::write_file(dir / "job", launcher::encode_remote_job(job));
  CommandResult r = testing::run_command(
      cmd({kDlaunch, "--remote-agent", "--job-tag", job.job_tag, "--job-file",
           (dir / "job").string(), "--host", "node07"}),
      60s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "dlaunch: --chdir: cannot enter " + job.chdir +
                       " on node07: No such file or directory; give a "
                       "folder that exists on every host\n");
  EXPECT_THAT(r.out, Not(HasSubstr("STARTED")));
}

// A head whose current folder was removed cannot say where the hosts run
// (with no --chdir, or a relative one): a clear error, not a crash (an
// abort) or hosts quietly running in their home folders; --print-config
// prints the folder as given.
TEST(MultiHostHead, AnUnreadableCurrentFolderNeedsAnAbsoluteChdir) {
  TempDir dir;
  auto from_removed = [&](const std::string& flags) {
    return testing::run_command(
        cmd({"sh", "-c",
             "mkdir gone && cd gone && rmdir ../gone && exec " + kDlaunch +
                 " --launcher local --hosts 127.0.0.2,127.0.0.3 --local-addr "
                 "127.0.0.1 " +
                 flags + " true"},
            {}, dir.path().string()),
        60s);
  };
  for (const std::string flags : {"", "--chdir ../sub"}) {
    CommandResult r = from_removed(flags);
    EXPECT_EQ(r.exit_code, 2) << flags << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("dlaunch: cannot read the current folder"))
        << flags;
    EXPECT_THAT(r.err, HasSubstr("give an absolute --chdir")) << flags;
  }
  CommandResult p = from_removed("--chdir ../sub --print-config");
  EXPECT_EQ(p.exit_code, 0) << p.err;
  EXPECT_THAT(p.out, HasSubstr("chdir: ../sub\n"));
}

TEST(MultiHostHead, AHostfileWithSlotsAndExcludedGpusSetsWorkers) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  testing::write_file(dir / "hosts",
                      "# two hosts\n127.0.0.2 slots=3\n\n127.0.0.3:1\n");
  CommandResult r = testing::run_command(
      cmd({kDlaunch, "--launcher", "local", "--hostfile",
           (dir / "hosts").string(), "--exclude", "127.0.0.2:1", "--local-addr",
           "127.0.0.1", "-x", "DLT_MARK=" + mark, "sh", "-c",
           "echo ENV lws=$LOCAL_WORLD_SIZE cvd=$CUDA_VISIBLE_DEVICES"}),
      60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("127.0.0.2 [default0]:ENV lws=2 cvd=0,2"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.2 [default1]:ENV lws=2 cvd=0,2"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.3 [default0]:ENV lws=1 cvd=\n"));
}

// A fault's rank is checked against the job's real world: hosts with
// slots=1 and slots=3 run ranks 0..3, and the one-slot host's agent does
// not refuse rank 3 (its 2 nodes x 1 worker) before the round forms.
TEST(MultiHostHead, FaultRanksFitTheWorldOfHostsWithDifferentSlots) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  testing::write_file(dir / "hosts", "127.0.0.2 slots=1\n127.0.0.3 slots=3\n");
  CommandResult r = testing::run_command(
      cmd({kDlaunch, "--launcher", "local", "--hostfile",
           (dir / "hosts").string(), "--local-addr", "127.0.0.1", "-x",
           "DLT_MARK=" + mark, "--max-restarts", "1", "--fault", "kill:rank=3",
           "sh", "-c",
           "echo up-$RANK-$WORLD_SIZE-$TORCHELASTIC_RESTART_COUNT; "
           "if [ $TORCHELASTIC_RESTART_COUNT -lt 1 ]; then exec sleep 300; "
           "fi"}),
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("fault injected: kill:rank=3"));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(r.out, HasSubstr("up-" + std::to_string(rank) + "-4-1"))
        << r.out;
  }
  EXPECT_TRUE(none_marked(mark, 30s));
}

// --drill over several hosts: a fault fires on the host that runs its
// rank, and the head's one verdict table has it, from that host's agent.
TEST(MultiHostHead, ADrillAcrossHostsPrintsOneVerdict) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  testing::write_file(
      dir / "drill.yaml",
      "program: sh\nargs: [-c, 'if [ $TORCHELASTIC_RESTART_COUNT -lt 1 ]; "
      "then exec sleep 300; fi']\nnproc_per_node: 2\nmax_restarts: 1\n"
      "faults:\n  - kill:rank=3:after=0.2\n");
  CommandResult r = testing::run_command(
      cmd({kDlaunch, "--launcher", "local", "--hosts", "127.0.0.[2-3]",
           "--local-addr", "127.0.0.1", "-x", "DLT_MARK=" + mark, "--drill",
           (dir / "drill.yaml").string()}),
      120s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("dlaunch --drill: verdict"));
  EXPECT_THAT(r.out, ::testing::ContainsRegex(
                         "kill:rank=3:after=0.2 +[0-9.]+ s +[0-9.]+ s +[0-9.]+ "
                         "s +ok\n"));
  EXPECT_THAT(r.out, HasSubstr("job: exit 0 after 2 group start(s) (expected "
                               "exit 0): ok\ndrill: PASSED\n"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// --remote-stop TAG on a machine that is a host and the head's too stops
// the job's agents (here the shipped copy's shim, `sh -c SCRIPT dlaunch
// --remote-agent ...`) and workers, not the head's srun or pdsh, whose
// command line carries an agent's after its own options, nor another
// job's agent.
TEST(RemoteStop, StopsTheJobsAgentsAndWorkersNotTheHeadsLauncher) {
  TempDir dir;
  testing::Gate gate((dir / "gate").string());
  const std::string tag = "dlaunch-job-" + unique_mark("m");
  const std::string wait = "read x < " + gate.path() + "; :";
  auto start = [&](std::vector<std::string> args,
                   std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {"sh", "-c", wait};
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<Subprocess>(cmd(argv, env));
  };
  auto agent = start({"dlaunch", "--remote-agent", "--job-tag", tag});
  auto worker = start({"worker"}, {{"DLAUNCH_JOB_TAG", tag}});
  auto srun = start({"srun", "--nodes=2", "--overlap", kDlaunch,
                     "--remote-agent", "--job-tag", tag, "--slurm-task"});
  auto other = start({"dlaunch", "--remote-agent", "--job-tag", tag + "x"});
  // Each has its command line once it runs the shell.
  for (Subprocess* p : {agent.get(), worker.get(), srun.get(), other.get()}) {
    ASSERT_TRUE(testing::eventually(
        [&] {
          return testing::read_proc_file("/proc/" + std::to_string(p->pid()) +
                                         "/cmdline")
              .starts_with(std::string("sh\0-c\0", 6));
        },
        30s));
  }
  CommandResult r =
      testing::run_command(cmd({kDlaunch, "--remote-stop", tag}), 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("dlaunch-stop 2 process(es) stopped"));
  EXPECT_EQ(agent->wait(30s).signal, SIGTERM);
  EXPECT_EQ(worker->wait(30s).signal, SIGTERM);
  EXPECT_TRUE(testing::process_alive(srun->pid()));
  EXPECT_TRUE(testing::process_alive(other->pid()));
}

// The shipped copies of dlaunch that a job's output names (its workers
// print their agent's program, /proc/$PPID/exe).
std::set<std::string> shipped_copies(const std::string& out) {
  std::set<std::string> paths;
  std::regex re("agent=(/\\S+/dlaunch/[^/ ]+/dlaunch)\\b");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re);
       it != std::sregex_iterator(); ++it) {
    paths.insert((*it)[1]);
  }
  return paths;
}

// A copy's identity: untouched, it keeps its inode.
ino_t inode(const std::string& path) {
  struct ::stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// dlaunch ships itself (issue 10): over ssh to two "hosts" where
// --remote-dlaunch points at nothing. Each host's agent runs the head's
// copy from the user's cache (here a test's own XDG_CACHE_HOME, passed
// through ssh), which stays for the next job: that one finds it and
// copies nothing. A damaged copy there is replaced; a cache folder that
// others can write is refused, naming the fix.
TEST(MultiHostShip, HostsWithoutDlaunchRunTheHeadsCopyFromTheirCache) {
  testing::TestSshd sshd({"127.0.0.2", "127.0.0.3"});
  if (!sshd.available()) GTEST_SKIP() << sshd.why_not();
  TempDir cache("dlaunch-cache");
  auto run = [&](const std::string& mark) {
    return testing::run_command(
        cmd(head(
            "ssh", "127.0.0.2,127.0.0.3", mark,
            {"--ssh-port", std::to_string(sshd.port()), "--ssh-args",
             sshd.ssh_args() +
                 " -o SetEnv=XDG_CACHE_HOME=" + cache.path().string(),
             "--remote-dlaunch", "/nonexistent-dlaunch-dir/dlaunch", "sh", "-c",
             "echo ENV rank=$RANK agent=$(readlink /proc/$PPID/exe)"})),
        120s);
  };
  std::string mark = unique_mark("m");
  CommandResult r = run(mark);
  const std::string refused = launcher::why_not_shippable(kDlaunch);
  if (!refused.empty()) {
    // A sanitizer build refuses, naming the fix.
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("127.0.0.2  no usable dlaunch at "
                                 "/nonexistent-dlaunch-dir/dlaunch, and"));
    EXPECT_THAT(r.err, HasSubstr("cannot be shipped"));
    return;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* h : {"127.0.0.2", "127.0.0.3"}) {
    EXPECT_THAT(r.err,
                HasSubstr("dlaunch: " + std::string(h) +
                          " has no usable dlaunch at "
                          "/nonexistent-dlaunch-dir/dlaunch; shipped this one "
                          "to ${XDG_CACHE_HOME:-$HOME/.cache}/dlaunch/"));
  }
  // Both "hosts" share this machine's cache: one copy.
  std::set<std::string> copies = shipped_copies(r.out);
  ASSERT_EQ(copies.size(), 1u) << r.out;
  const std::string copy = *copies.begin();
  EXPECT_TRUE(copy.starts_with(cache.path().string() + "/dlaunch/")) << copy;
  EXPECT_TRUE(
      fs::exists(fs::path(copy).replace_filename("dlaunch-cuda-devices")));
  EXPECT_TRUE(fs::exists(fs::path(copy).replace_filename("dlaunch-watchdog")));
  EXPECT_EQ(launcher::file_checksum(copy), launcher::file_checksum(kDlaunch));
  EXPECT_TRUE(none_marked(mark, 30s));
  const ino_t first = inode(copy);

  // The next job runs the cached copy as it is.
  mark = unique_mark("m");
  r = run(mark);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("dlaunch: 127.0.0.2 has no usable dlaunch at "
                               "/nonexistent-dlaunch-dir/dlaunch; found this "
                               "one cached at "));
  EXPECT_THAT(r.err, Not(HasSubstr("shipped this one"))) << r.err;
  EXPECT_EQ(shipped_copies(r.out), copies) << r.out;
  EXPECT_EQ(inode(copy), first);
  EXPECT_TRUE(none_marked(mark, 30s));

  // A damaged copy (its checksum differs) is replaced.
  std::ofstream(copy, std::ios::app) << "damage";
  mark = unique_mark("m");
  r = run(mark);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("shipped this one to")) << r.err;
  // (Not its inode: of two racing copies, the second may reuse the
  // number the first one's rename freed.)
  EXPECT_EQ(launcher::file_checksum(copy), launcher::file_checksum(kDlaunch));
  EXPECT_TRUE(none_marked(mark, 30s));
  // Nothing but the three programs: no temporary copies left.
  EXPECT_EQ(std::distance(fs::directory_iterator(fs::path(copy).parent_path()),
                          fs::directory_iterator()),
            3);

  // A cache folder that others can write is an error naming the fix.
  const fs::path shared = cache.path() / "dlaunch";
  ::chmod(shared.c_str(), 0777);
  mark = unique_mark("m");
  r = run(mark);
  ::chmod(shared.c_str(), 0700);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("127.0.0.2  cannot run "));
  EXPECT_THAT(r.err, HasSubstr("the cache folder " + shared.string() +
                               " is not private"));
  EXPECT_THAT(r.err, HasSubstr("chmod 700 " + shared.string()));
  EXPECT_TRUE(none_marked(mark, 30s));
}

TEST(MultiHostShip, HostsWhosePathLacksDlaunchRunTheHeadsCopy) {
  std::map<std::string, std::string> env = {{"PATH", "/usr/bin:/bin"}};
  if (testing::run_command(cmd({"sh", "-c", "command -v dlaunch"}, env))
          .exit_code == 0) {
    GTEST_SKIP() << "dlaunch is installed in /usr/bin here";
  }
  // --launcher local, then pdsh's exec module (one command for all
  // hosts); twice each: a copy, then the cached one.
  for (const std::string backend : {"local", "pdsh"}) {
    SCOPED_TRACE(backend);
    if (backend == "pdsh" && !have("pdsh")) continue;
    if (backend == "pdsh") env["PDSH_RCMD_TYPE"] = "exec";
    TempDir cache("dlaunch-cache");
    env["XDG_CACHE_HOME"] = cache.path().string();
    for (const std::string said :
         {"shipped this one to", "found this one cached at"}) {
      const std::string mark = unique_mark("m");
      CommandResult r = testing::run_command(
          cmd(head(backend, "127.0.0.2,127.0.0.3", mark,
                   {"--remote-dlaunch", "dlaunch", "sh", "-c",
                    "echo ENV rank=$RANK agent=$(readlink /proc/$PPID/exe)"}),
              env),
          120s);
      if (!launcher::why_not_shippable(kDlaunch).empty()) {
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_THAT(r.err, HasSubstr("cannot be shipped"));
        break;
      }
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_THAT(r.err, HasSubstr("dlaunch: 127.0.0.3 has no usable dlaunch "
                                   "at dlaunch; " +
                                   said));
      std::set<std::string> copies = shipped_copies(r.out);
      ASSERT_EQ(copies.size(), 1u) << r.out;
      EXPECT_TRUE(copies.begin()->starts_with(cache.path().string()));
      EXPECT_TRUE(none_marked(mark, 30s));
    }
  }
}

TEST(MultiHostShip, AgentsEndWhenTheHeadIsKilledAndTheCacheStays) {
  if (!launcher::why_not_shippable(kDlaunch).empty()) {
    GTEST_SKIP() << "this build does not ship (tested above)";
  }
  testing::TestSshd sshd({"127.0.0.2", "127.0.0.3"});
  if (!sshd.available()) GTEST_SKIP() << sshd.why_not();
  TempDir cache("dlaunch-cache");
  const std::string mark = unique_mark("m");
  Subprocess job(cmd(head(
      "ssh", "127.0.0.2,127.0.0.3", mark,
      {"--ssh-port", std::to_string(sshd.port()), "--ssh-args",
       sshd.ssh_args() + " -o SetEnv=XDG_CACHE_HOME=" + cache.path().string(),
       "--remote-dlaunch", "/nonexistent/dlaunch", "sh", "-c",
       "echo up-$RANK agent=$(readlink /proc/$PPID/exe); "
       "exec sleep 300"})));
  for (const char* up : {"up-0", "up-1"}) {
    ASSERT_TRUE(job.wait_for_output(up, 60s)) << job.out() << job.err();
  }
  std::set<std::string> copies = shipped_copies(job.out());
  ASSERT_EQ(copies.size(), 1u) << job.out();
  // No teardown from the head: each agent sees its ssh connection end.
  job.signal(SIGKILL);
  EXPECT_FALSE(job.wait(30s).timed_out);
  EXPECT_TRUE(none_marked(mark, 30s));
  for (const std::string& c : copies) {
    EXPECT_EQ(launcher::file_checksum(c), launcher::file_checksum(kDlaunch));
  }
}

// A stand-in for dlaunch-cuda-devices that reports `n` GPUs.
std::string fake_gpu_counter(const TempDir& dir, int n) {
  const fs::path p = dir / ("gpus" + std::to_string(n));
  testing::write_file(p, "#!/bin/sh\necho " + std::to_string(n) + "\n", 0755);
  return p.string();
}

// A job on 127.0.0.2-3 (--launcher local) whose head would count
// `head_gpus` GPUs and whose hosts (-x) count `host_gpus`.
CommandResult run_counting_gpus(const TempDir& dir, int head_gpus,
                                int host_gpus, const std::string& nproc,
                                const std::string& script,
                                const std::string& mark = unique_mark("m")) {
  return testing::run_command(
      cmd(head(
              "local", "127.0.0.2,127.0.0.3", mark,
              {"-x", "DLAUNCH_CUDA_DEVICES=" + fake_gpu_counter(dir, host_gpus),
               "--nproc-per-node", nproc, "sh", "-c", script}),
          {{"DLAUNCH_CUDA_DEVICES", fake_gpu_counter(dir, head_gpus)}}),
      90s);
}

TEST(MultiHostHead, NprocAutoFallsBackToEachHostsCpus) {
  TempDir dir;
  // The head would say 9 GPUs; the hosts see none.
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  CommandResult r = run_counting_gpus(
      dir, 9, 0, "auto", "echo ENV lws=$LOCAL_WORLD_SIZE ws=$WORLD_SIZE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* h : {"127.0.0.2", "127.0.0.3"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string(h) +
                                 " [default0]:ENV lws=" + std::to_string(cpus) +
                                 " ws=" + std::to_string(2 * cpus)))
        << r.out;
  }
}

// The head among the hosts: a host whose agent fails before joining
// (no GPU for --nproc-per-node gpu) ends the job at once, with its status
// (the head's agent once waited out join_timeout, 600 s).
TEST(MultiHostHead, AHostFailingBeforeJoiningEndsTheJobAtOnce) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  CommandResult r = testing::run_command(
      cmd(head("local", "localhost,127.0.0.3", mark,
               {"-x", "DLAUNCH_CUDA_DEVICES=" + fake_gpu_counter(dir, 0),
                "--nproc-per-node", "gpu", "sh", "-c", "sleep 300"}),
          {{"DLAUNCH_CUDA_DEVICES", fake_gpu_counter(dir, 2)}}),
      60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("127.0.0.3 dlaunch: --nproc-per-node gpu: no "
                               "CUDA device is visible"));
  EXPECT_THAT(r.err, HasSubstr("the agent on 127.0.0.3 ended with exit 2 (its "
                               "lines above say why), leaving 1 of 2 hosts "
                               "where the job needs 2"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A job on this machine, which counts 2 GPUs, and the other `hosts`
// (--hosts, this machine first), which count theirs with `counter`; then
// `rest`, under the head's `env` on top of the GPU count.
CommandResult run_with_the_head(const TempDir& dir, const std::string& mark,
                                const std::string& hosts,
                                const std::string& counter,
                                std::vector<std::string> rest,
                                std::map<std::string, std::string> env = {}) {
  rest.insert(rest.begin(), {"-x", "DLAUNCH_CUDA_DEVICES=" + counter});
  env["DLAUNCH_CUDA_DEVICES"] = fake_gpu_counter(dir, 2);
  return testing::run_command(cmd(head("local", hosts, mark, rest), env), 90s);
}

// An elastic job (--nnodes 2:3, then `rest`) on this machine and
// 127.0.0.3-4, as run_with_the_head.
CommandResult run_elastic_with_the_head(const TempDir& dir,
                                        const std::string& mark,
                                        const std::string& counter,
                                        std::vector<std::string> rest) {
  rest.insert(rest.begin(), {"--nnodes", "2:3"});
  return run_with_the_head(dir, mark, "localhost,127.0.0.3,127.0.0.4", counter,
                           rest);
}

// The same with this machine among the hosts (its agent in-process): the
// job goes on with it and the host left, without a last call.
TEST(MultiHostHead, AnElasticJobGoesOnWithoutAHostThatFailedBeforeJoining) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  CommandResult r = run_elastic_with_the_head(
      dir, mark, gpus_once(dir),
      {"--rdzv-conf", "last_call_timeout=600", "--nproc-per-node", "gpu", "sh",
       "-c", "sleep 1; echo DONE $RANK of $WORLD_SIZE"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("localhost [default0]:DONE 0 of 4\n"));
  EXPECT_THAT(r.out, HasSubstr("DONE 3 of 4\n"));
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "dlaunch: the job finished without "
                         "127\\.0\\.0\\.[34] \\(exit 2\\), whose agent ended"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// This machine among the hosts, its workers fine: the host whose worker
// failed gives the job its status and the head's error file (this
// machine's agent, ended by that failure, had given 1 and its own words).
// This machine's workers are told apart by their count (2 GPUs; the host
// 3).
TEST(MultiHostHead, AnotherHostsRootCauseGivesTheJobItsStatusAndErrorFile) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  const std::string file = (dir / "head.json").string();
  CommandResult r = run_with_the_head(
      dir, mark, "localhost,127.0.0.3", fake_gpu_counter(dir, 3),
      {"--nproc-per-node", "gpu", "sh", "-c",
       "if [ $LOCAL_WORLD_SIZE = 3 ] && [ $LOCAL_RANK = 2 ]; then exit 5; fi; "
       "exec sleep 300"},
      {{"TORCHELASTIC_ERROR_FILE", file}});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  const nlohmann::json j = error_file(file);
  ASSERT_FALSE(j.is_discarded()) << testing::read_file(file);
  EXPECT_THAT(j["message"]["message"].get<std::string>(),
              ::testing::MatchesRegex("dlaunch: local rank 2 \\(pid [0-9]+\\) "
                                      "failed with exit code 5"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// This machine's worker fails first (exit 7); its agent tells the others
// only after its group stopped, which its other worker (ignoring SIGTERM)
// holds for --term-timeout. Meanwhile the host's worker fails on its own
// (exit 3): the job's status and error file stay this machine's (the
// host's later failure once gave them, the head's own not weighed).
// This machine's workers are told apart by their count (2 GPUs; the host
// 3).
TEST(MultiHostHead, ThisMachinesEarlierRootCauseOutranksAHostsLaterOne) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  const std::string file = (dir / "head.json").string();
  const std::string gate = (dir / "failed").string();  // "$1" below
  CommandResult r = run_with_the_head(
      dir, mark, "localhost,127.0.0.3", fake_gpu_counter(dir, 3),
      {"--nproc-per-node", "gpu", "--term-timeout", "5", "sh", "-c",
       // (Rank 0 fails once rank 1 ignores SIGTERM: a SIGTERM before its
       // trap ended the group at once under CI's load.)
       "if [ $LOCAL_WORLD_SIZE = 2 ]; then"
       "  if [ $LOCAL_RANK = 1 ]; then"
       "    trap '' TERM; touch \"$1.trap\"; exec sleep 300; fi;"
       "  while [ ! -e \"$1.trap\" ]; do sleep 0.05; done;"
       "  touch \"$1\"; exit 7; "
       "fi; "
       "while [ ! -e \"$1\" ]; do sleep 0.05; done; sleep 0.5; exit 3",
       "sh", gate},
      {{"TORCHELASTIC_ERROR_FILE", file}});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  const nlohmann::json j = error_file(file);
  ASSERT_FALSE(j.is_discarded()) << testing::read_file(file);
  EXPECT_THAT(j["message"]["message"].get<std::string>(),
              ::testing::MatchesRegex("dlaunch: local rank 0 \\(pid [0-9]+\\) "
                                      "failed with exit code 7"));
  // The host's worker did fail on its own, before it heard.
  EXPECT_THAT(r.err,
              ::testing::ContainsRegex("127\\.0\\.0\\.3 +exit +: exit code 3"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// An elastic job whose group fails with no restart left fails everywhere:
// its status is the root cause's, though this machine's agent (whose
// worker failed) ended first and 2 of 3 hosts would be enough. This
// machine's workers are told apart by their count (2 GPUs; the hosts 3).
TEST(MultiHostHead, AnElasticGroupThatFailsEverywhereEndsWithItsStatus) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  CommandResult r = run_elastic_with_the_head(
      dir, mark, fake_gpu_counter(dir, 3),
      {"--nproc-per-node", "gpu", "sh", "-c",
       "if [ $LOCAL_WORLD_SIZE = 2 ]; then exit 3; fi; exec sleep 300"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("the job finished without")));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// An elastic job succeeds only when a round's members all succeeded: a
// host that exits 0 after its exit barrier timed out (2 s) while this
// machine's workers still run does not make their later failure (exit 7)
// a success (the job once exited 0 "without localhost"). This machine's
// workers are told apart by their count (2 GPUs; the host 3).
TEST(MultiHostHead, AnElasticJobWhoseLastRoundFailedFails) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  CommandResult r = run_with_the_head(
      dir, mark, "localhost,127.0.0.3", fake_gpu_counter(dir, 3),
      {"--nnodes", "1:2", "--exit-barrier-timeout", "2", "--nproc-per-node",
       "gpu", "sh", "-c",
       "if [ $LOCAL_WORLD_SIZE = 2 ]; then sleep 4; exit 7; fi"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("the job finished without")));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// A job on this machine and 127.0.0.3-4 (--nproc-per-node gpu, workers
// that sleep) whose hosts count their GPUs with `counter`: it must end
// within the test's minute with exit 2 and an error matching `why`.
void expect_lost_hosts_end_the_job(const std::string& launcher,
                                   const std::string& counter,
                                   const std::vector<std::string>& flags,
                                   const std::string& why) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  std::vector<std::string> rest = {"-x", "DLAUNCH_CUDA_DEVICES=" + counter};
  rest.insert(rest.end(), flags.begin(), flags.end());
  rest.insert(rest.end(), {"--nproc-per-node", "gpu", "sh", "-c", "sleep 300"});
  std::map<std::string, std::string> env = {
      {"DLAUNCH_CUDA_DEVICES", fake_gpu_counter(dir, 2)}};
  if (launcher == "pdsh") env["PDSH_RCMD_TYPE"] = "exec";
  CommandResult r = testing::run_command(
      cmd(head(launcher, "localhost,127.0.0.3,127.0.0.4", mark, rest), env),
      60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex(why));
  EXPECT_TRUE(none_marked(mark, 30s));
}

// An elastic job (--nnodes 2:3, no --rdzv-endpoint: the head hosts the
// store) whose two other hosts both fail at once: counted after every
// command ended (the monitor once stopped first, and the head waited).
TEST(MultiHostHead, HostsFailingBelowTheMinimumEndTheJobAtOnce) {
  TempDir dir;
  expect_lost_hosts_end_the_job(
      "local", fake_gpu_counter(dir, 0), {"--nnodes", "2:3"},
      "the agents on 127\\.0\\.0\\.[34], 127\\.0\\.0\\.[34] ended, the first "
      "with exit 2 \\(their lines above say why\\), leaving 1 of 3 hosts where "
      "the job needs 2");
}

// Under pdsh one command reaches every host and runs until all end: a
// host that fails while another waits is known from pdsh's line for it
// ("pdsh@head: HOST: dlaunch exited with exit code 2"). Only the first
// host to count its GPUs sees none.
TEST(MultiHostHead, AHostFailingUnderPdshEndsTheJobAtOnce) {
  if (!have("pdsh")) {
    GTEST_SKIP() << "pdsh is not installed (scripts/setup installs it)";
  }
  TempDir dir;
  expect_lost_hosts_end_the_job(
      "pdsh", gpus_once(dir), {},
      "dlaunch: rendezvous failed: the agent on 127\\.0\\.0\\.[34] ended with "
      "exit 2 \\(its lines above say why\\), leaving 2 of 3 hosts where the "
      "job needs 3");
  EXPECT_TRUE(fs::exists(dir / "once"));
}

// The head's agent adopts what its commands leave (an ssh ControlPersist
// master, the head being a subreaper): no stray of its workers, so it
// outlives them. Here a pdsh that leaves a child 2 s after it starts, while
// the head's workers run.
TEST(MultiHostHead, ChildrenTheHeadsCommandsLeaveAreNoStrays) {
  if (!have("pdsh")) {
    GTEST_SKIP() << "pdsh is not installed (scripts/setup installs it)";
  }
  TempDir dir;
  const std::string real =
      testing::run_command(cmd({"sh", "-c", "command -v pdsh"})).out;
  const fs::path left = dir / "left";
  // The child holds no fd but /dev/null: pdsh's output pipes would hold
  // the head.
  testing::write_file(
      dir / "pdsh",
      "#!/bin/bash\n(exec </dev/null >/dev/null 2>&1; for fd in $(ls "
      "/proc/$BASHPID/fd); do [ $fd -gt 2 ] && eval \"exec $fd>&-\"; done; "
      "sleep 2; setsid sleep 300 & echo $! >> " +
          left.string() + ") &\nexec " + real.substr(0, real.find('\n')) +
          " \"$@\"\n",
      0755);
  const std::string mark = unique_mark("m");
  CommandResult r = testing::run_command(
      cmd(head("pdsh", "localhost,127.0.0.2", mark, {"sleep", "5"}),
          {{"PDSH_RCMD_TYPE", "exec"},
           {"PATH", dir.path().string() + ":" + std::getenv("PATH")}}),
      90s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(none_marked(mark, 30s));
  std::ifstream in(left);
  int alive = 0;
  for (pid_t pid; in >> pid;) {
    EXPECT_TRUE(testing::process_alive(pid)) << "pdsh's child " << pid;
    if (testing::process_alive(pid)) {
      ++alive;
      ::kill(pid, SIGKILL);
    }
  }
  EXPECT_GT(alive, 0) << "pdsh left no child";
}

// pdsh writes the names of hosts of one domain cut at the first dot
// ("a: dlaunch-check ..."): the pre-flight once looked for "a.x" and
// refused every host ("cannot run dlaunch (exit 0)"). These names do not
// resolve (.invalid), so the agents, once started, fail naming them.
TEST(MultiHostHead, PdshShortNamesPassThePreflight) {
  if (!have("pdsh")) {
    GTEST_SKIP() << "pdsh is not installed (scripts/setup installs it)";
  }
  CommandResult r =
      testing::run_command(cmd({kDlaunch, "--launcher", "pdsh", "--hosts",
                                "a.dlaunch.invalid,b.dlaunch.invalid", "true"},
                               {{"PDSH_RCMD_TYPE", "exec"}}),
                           60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, Not(HasSubstr("pre-flight failed"))) << r.err;
  EXPECT_THAT(r.err, HasSubstr("a.dlaunch.invalid dlaunch: rendezvous failed: "
                               "cannot resolve host 'a.dlaunch.invalid'"));
}

// A host's agent killed by a signal under pdsh: pdsh says so ("HOST:
// dlaunch killed by signal 9") and, with -S, would exit 0 once the rest
// ended. The job ends at once with 128+9 (the other host once waited for
// the lost one to come back, join_timeout).
TEST(MultiHostHead, AnAgentKilledUnderPdshEndsTheJobWithItsSignal) {
  if (!have("pdsh")) {
    GTEST_SKIP() << "pdsh is not installed (scripts/setup installs it)";
  }
  const std::string mark = unique_mark("m");
  CommandResult r = testing::run_command(
      cmd(head("pdsh", "127.0.0.2,127.0.0.3", mark,
               {"sh", "-c",
                "if [ $RANK = 1 ]; then kill -9 $PPID; fi; sleep 300"}),
          {{"PDSH_RCMD_TYPE", "exec"}}),
      60s);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "127\\.0\\.0\\.[23]: dlaunch killed by signal 9"));
  EXPECT_TRUE(none_marked(mark, 30s));
}

TEST(MultiHostHead, NprocGpuIsCountedByEachHostNotTheHead) {
  TempDir dir;
  // The head sees no GPU (alone it would refuse gpu); each host sees 3.
  CommandResult r = run_counting_gpus(
      dir, 0, 3, "gpu", "echo ENV lws=$LOCAL_WORLD_SIZE ws=$WORLD_SIZE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* h : {"127.0.0.2", "127.0.0.3"}) {
    EXPECT_THAT(r.out, HasSubstr(std::string(h) + " [default2]:ENV lws=3 ws=6"))
        << r.out;
  }
}

TEST(MultiHostHead, NprocGpuOnAHostWithoutGpusFailsNamingIt) {
  TempDir dir;
  const std::string mark = unique_mark("m");
  // The head has GPUs; the hosts have none.
  CommandResult r = run_counting_gpus(dir, 2, 0, "gpu", "true", mark);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, ::testing::ContainsRegex(
                         "127\\.0\\.0\\.[23] dlaunch: --nproc-per-node "
                         "gpu: no CUDA device is visible"));
  EXPECT_TRUE(none_marked(mark, 30s));
  // The head in the list, without GPUs itself: refused before anything
  // starts, naming it.
  CommandResult h = testing::run_command(
      cmd(head("local", "localhost,127.0.0.3", mark,
               {"--nproc-per-node", "gpu", "true"}),
          {{"DLAUNCH_CUDA_DEVICES", fake_gpu_counter(dir, 0)}}),
      60s);
  EXPECT_EQ(h.exit_code, 2);
  EXPECT_THAT(h.err, HasSubstr("--nproc-per-node gpu on localhost (this "
                               "machine, the head): no CUDA device is "
                               "visible"));
  // One host alone still refuses at once.
  CommandResult one = testing::run_command(
      cmd({kDlaunch, "--nproc-per-node", "gpu", "true"},
          {{"DLAUNCH_CUDA_DEVICES", fake_gpu_counter(dir, 0)}}),
      60s);
  EXPECT_EQ(one.exit_code, 2);
  EXPECT_THAT(one.err, HasSubstr("no CUDA device is visible"));
}

TEST(MultiHostHead, PreflightTablesEveryFailedHost) {
  const std::string mark = unique_mark("m");
  TempDir dir;
  const std::string file = (dir / "head.json").string();
  CommandResult r = testing::run_command(
      cmd(head("local", "127.0.0.2,127.0.0.3", mark, {"./no-such-program"}),
          {{"TORCHELASTIC_ERROR_FILE", file}}, dir.path().string()),
      60s);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("pre-flight failed on 2 of 2 host(s)"));
  EXPECT_THAT(r.err,
              HasSubstr("127.0.0.2  program-missing: ./no-such-program"));
  EXPECT_THAT(r.err,
              HasSubstr("127.0.0.3  program-missing: ./no-such-program"));
  // The head's error file holds the table (no agent ran to write one).
  const nlohmann::json j = error_file(file);
  ASSERT_FALSE(j.is_discarded()) << testing::read_file(file);
  EXPECT_THAT(j["message"]["message"].get<std::string>(),
              AllOf(HasSubstr("pre-flight failed on 2 of 2 host(s)"),
                    HasSubstr("127.0.0.3  program-missing")));
  // A host without dlaunch gets the head's, whose own check then fails.
  TempDir cache("dlaunch-cache");
  CommandResult v = testing::run_command(
      cmd(head("local", "127.0.0.2", mark,
               {"--remote-dlaunch", "/nonexistent/dlaunch",
                "./no-such-program"}),
          {{"XDG_CACHE_HOME", cache.path().string()}}, dir.path().string()),
      60s);
  EXPECT_EQ(v.exit_code, 1);
  if (!launcher::why_not_shippable(kDlaunch).empty()) {
    EXPECT_THAT(v.err, HasSubstr("127.0.0.2  no usable dlaunch at "
                                 "/nonexistent/dlaunch, and "));
    return;
  }
  EXPECT_THAT(v.err,
              HasSubstr("127.0.0.2  program-missing: ./no-such-program"));
  EXPECT_THAT(v.err, HasSubstr("shipped this one to"));
}

}  // namespace
}  // namespace dlaunch
