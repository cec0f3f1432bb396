// `dlaunch --config` end to end: the real binary runs YAML jobs, writes
// LOG_DIR/RUN_ID/job.yaml that reruns the job, refuses bad files before
// starting anything, dry-runs every example in configs/, and trains the
// README's SGD job from configs/ as the flags do.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "workloads/idx.h"

namespace dlaunch {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::read_file;
using testing::TempDir;
using testing::write_file;
using namespace std::chrono_literals;

const std::string kDlaunch = DLAUNCH_BIN_DIR "/dlaunch";
const fs::path kConfigs = fs::path(DLAUNCH_SOURCE_DIR) / "configs";

CommandResult dlaunch(std::vector<std::string> args,
                      std::map<std::string, std::string> env = {},
                      const std::string& cwd = "") {
  args.insert(args.begin(), kDlaunch);
  env.emplace("DLAUNCH_BIN", DLAUNCH_BIN_DIR);
  return testing::run_command({args, env, {}, cwd}, 120s);
}

// -x beats a job file's env map on this machine and on every host (the
// map won on this machine).
TEST(JobConfig, AnExportBeatsTheFilesEnvOnEveryHost) {
  TempDir dir;
  const std::string f = (dir / "job.yaml").string();
  write_file(f, "program: sh\nargs: [-c, 'echo X=$X']\nenv: {X: file}\n");
  CommandResult one = dlaunch({"--config", f, "-x", "X=flag"});
  EXPECT_EQ(one.exit_code, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("X=flag"));
  EXPECT_THAT(one.out, Not(HasSubstr("X=file")));
  CommandResult two =
      dlaunch({"--config", f, "-x", "X=flag", "--launcher", "local", "--hosts",
               "127.0.0.1,127.0.0.2", "--local-addr", "127.0.0.1"});
  EXPECT_EQ(two.exit_code, 0) << two.err;
  EXPECT_THAT(two.out, HasSubstr("127.0.0.1 [default0]:X=flag"));
  EXPECT_THAT(two.out, HasSubstr("127.0.0.2 [default0]:X=flag"));
  EXPECT_THAT(two.out, Not(HasSubstr("X=file")));
}

// The run folders under `log_dir`.
std::vector<fs::path> runs(const fs::path& log_dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(log_dir)) out.push_back(e.path());
  return out;
}

TEST(JobConfig, RunsWritesJobYamlAndRerunsFromIt) {
  TempDir dir;
  write_file(dir / "job.yaml",
             "# a test job\n"
             "program: sh\n"
             "args: [-c, 'echo \"$RANK $GREETING\"']\n"
             "nproc_per_node: 2\n"
             "log_dir: logs\n"
             "tee: 1\n"
             "rdzv_id: first\n"
             "env: {GREETING: hello, API_TOKEN: s3cret}\n");
  // Started from another folder: log_dir follows the file.
  CommandResult r = dlaunch({"--config", (dir / "job.yaml").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[default0]:0 hello\n"));
  EXPECT_THAT(r.out, HasSubstr("[default1]:1 hello\n"));
  fs::path job = dir / "logs/first/job.yaml";
  std::string text = read_file(job);
  ASSERT_FALSE(text.empty()) << job;
  EXPECT_THAT(text, HasSubstr("log_dir: " + (dir / "logs").string()));
  EXPECT_THAT(text, Not(HasSubstr("rdzv_id")));
  EXPECT_THAT(text, Not(HasSubstr("s3cret")));
  EXPECT_THAT(text, HasSubstr("API_TOKEN: ${API_TOKEN}"));
  EXPECT_THAT(read_file(dir / "logs/first/attempt_0/0/stdout.log"),
              HasSubstr("0 hello"));

  // The written job reruns into a fresh log folder (the secret comes from
  // the environment).
  CommandResult again =
      dlaunch({"--config", job.string()}, {{"API_TOKEN", "s3cret"}});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("[default0]:0 hello\n"));
  EXPECT_THAT(again.out, HasSubstr("[default1]:1 hello\n"));
  EXPECT_EQ(runs(dir / "logs").size(), 2u);
  // Without it, the rerun names the variable and starts nothing.
  CommandResult no_secret = dlaunch({"--config", job.string()});
  EXPECT_EQ(no_secret.exit_code, 2);
  EXPECT_THAT(no_secret.err, HasSubstr("${API_TOKEN} is not set"));
  EXPECT_EQ(runs(dir / "logs").size(), 2u);
}

TEST(JobConfig, ABadFileExits2AndStartsNothing) {
  TempDir dir;
  fs::path marker = dir / "started";
  for (const std::string& bad :
       {std::string("max_restartz: 1\n"), std::string("nnodes: two\n"),
        std::string("term_timeout: nan\n"),
        std::string("env: {A: '${DLAUNCH_TEST_UNSET}'}\n")}) {
    SCOPED_TRACE(bad);
    write_file(dir / "job.yaml", "program: sh\nargs: [-c, 'touch " +
                                     marker.string() + "']\n" + bad);
    CommandResult r = dlaunch({"--config", (dir / "job.yaml").string()});
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr("job.yaml:3:"));
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(fs::exists(marker));
  }
  // The same file, fixed, does start the program (the test can fail).
  write_file(dir / "job.yaml",
             "program: sh\nargs: [-c, 'touch " + marker.string() + "']\n");
  ASSERT_EQ(dlaunch({"--config", (dir / "job.yaml").string()}).exit_code, 0);
  EXPECT_TRUE(fs::exists(marker));
}

// A folder given as the job file: one line and exit 2 (it was an uncaught
// std::ios_base::failure: "terminate called", SIGABRT).
TEST(JobConfig, AFolderAsTheJobFileExits2) {
  TempDir dir;
  for (const char* flag : {"--config", "--drill"}) {
    CommandResult r = dlaunch({flag, dir.path().string()});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err, "dlaunch: " + std::string(flag) + ": '" +
                         dir.path().string() +
                         "': is a folder; give the path of a YAML job file\n");
  }
}

TEST(JobConfig, PrintConfigOutputRunsTheSameJob) {
  TempDir dir;
  write_file(dir / "job.yaml",
             "program: sh\nargs: [-c, 'echo \"$LOCAL_RANK/$WORLD_SIZE "
             "$ROLE_NAME $X\"']\nnproc_per_node: 3\nrole: r\nenv: {X: '1'}\n");
  CommandResult printed = dlaunch(
      {"--config", (dir / "job.yaml").string(), "--print-config", "-t", "3"},
      {{"PET_MAX_RESTARTS", "2"}});
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_THAT(printed.out, HasSubstr("max_restarts: 2\n"));
  EXPECT_THAT(printed.out, HasSubstr("tee: 3\n"));
  write_file(dir / "printed.yaml", printed.out);
  // The tee's logs outlive the run: in the test's folder, not /tmp.
  const std::map<std::string, std::string> tmp = {
      {"TMPDIR", dir.path().string()}};
  CommandResult a = dlaunch({"--config", (dir / "job.yaml").string()}, tmp);
  CommandResult b = dlaunch({"--config", (dir / "printed.yaml").string()}, tmp);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  for (const char* line :
       {"[r0]:0/3 r 1\n", "[r1]:1/3 r 1\n", "[r2]:2/3 r 1\n"}) {
    EXPECT_THAT(a.out, HasSubstr(line));
    EXPECT_THAT(b.out, HasSubstr(line));
  }
  // Printing it again gives the same text.
  CommandResult twice =
      dlaunch({"--config", (dir / "printed.yaml").string(), "--print-config"});
  EXPECT_EQ(twice.out, printed.out);
}

TEST(JobConfig, HostsThatCannotBeReachedFailPreflightBeforeAnythingStarts) {
  TempDir dir;
  write_file(dir / "job.yaml",
             "program: sh\nargs: [-c, 'touch " + (dir / "started").string() +
                 "']\nhosts: [node1.invalid:2, node2.invalid:2]\n"
                 "nproc_per_node: 2\nconnect_timeout: 5\n");
  CommandResult r = dlaunch({"--config", (dir / "job.yaml").string()});
  EXPECT_EQ(r.exit_code, 1);
  // Every host's failure in one table.
  EXPECT_THAT(r.err, HasSubstr("pre-flight failed on 2 of 2 host(s)"));
  EXPECT_THAT(r.err, HasSubstr("\n  node1.invalid  cannot run "));
  EXPECT_THAT(r.err, HasSubstr("\n  node2.invalid  cannot run "));
  EXPECT_FALSE(fs::exists(dir / "started"));
  // This node alone runs.
  write_file(dir / "job.yaml",
             "program: sh\nargs: [-c, 'touch " + (dir / "started").string() +
                 "']\nhosts: [localhost:2]\nnproc_per_node: 2\n");
  r = dlaunch({"--config", (dir / "job.yaml").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir / "started"));
}

TEST(JobConfig, EveryExampleDryRunsAndStartsNothing) {
  int examples = 0;
  for (const auto& e : fs::directory_iterator(kConfigs)) {
    if (e.path().extension() != ".yaml") continue;
    ++examples;
    SCOPED_TRACE(e.path().string());
    TempDir logs;
    CommandResult r = dlaunch({"--config", e.path().string(), "--dry-run"},
                              {{"LOG_DIR", logs.path().string()}});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("nothing was started"));
    EXPECT_THAT(r.out, HasSubstr("\nworker 0 (local rank 0)\n"));
    EXPECT_TRUE(fs::is_empty(logs.path()));
  }
  EXPECT_GE(examples, 5);
}

// "epoch 1/1 loss L test_acc A" of rank 0.
std::string epoch_line(const std::string& out) {
  std::smatch m;
  std::regex re(R"(\[default0\]:(epoch 1/1 loss \S+ test_acc \S+))");
  return std::regex_search(out, m, re) ? m[1].str() : "";
}

TEST(JobConfig, TheReadmesSgdJobFromConfigsTrainsAsTheFlagsDo) {
  if (!fs::exists(fs::path(workloads::kDefaultDataDir) /
                  "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  TempDir tmp;  // dl-sgd's checkpoints go to $TMPDIR
  std::map<std::string, std::string> env = {{"TMPDIR", tmp.path().string()}};
  auto from_flags = dlaunch(
      {"--nproc-per-node", "2", DLAUNCH_BIN_DIR "/dl-sgd", "--epochs", "1"},
      env);
  env["SGD_EPOCHS"] = "1";
  auto from_config =
      dlaunch({"--config", (kConfigs / "sgd_cpu.yaml").string()}, env);
  ASSERT_EQ(from_flags.exit_code, 0) << from_flags.err;
  ASSERT_EQ(from_config.exit_code, 0) << from_config.err;
  std::string want = epoch_line(from_flags.out);
  ASSERT_NE(want, "") << from_flags.out;
  EXPECT_EQ(epoch_line(from_config.out), want) << from_config.out;
  EXPECT_THAT(from_config.out, HasSubstr("2 rank(s)"));
}

}  // namespace
}  // namespace dlaunch
