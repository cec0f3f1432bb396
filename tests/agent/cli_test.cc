// `dlaunch`'s command line: torchrun's flags in both spellings, PET_
// fallbacks, the worker command, and one clear line for each bad input.
#include "launcher/cli.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "launcher/flags.h"
#include "launcher/job_token.h"
#include "launcher/read_text.h"
#include "tests/testing/bin.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::launcher {
namespace {

using ::testing::HasSubstr;

// The test binaries live in build/tests, not beside the helper.
const agent::EnvMap kHelperEnv{
    {"DLAUNCH_CUDA_DEVICES", dlaunch::testing::bin("dlaunch-cuda-devices")}};

LaunchOptions ok(std::vector<std::string> args, agent::EnvMap env = {}) {
  ParseResult r = parse_command_line(args, env);
  if (auto* e = std::get_if<UsageError>(&r)) {
    ADD_FAILURE() << "rejected: " << e->message;
    return {};
  }
  EXPECT_TRUE(std::holds_alternative<LaunchOptions>(r));
  return std::get<LaunchOptions>(r);
}

UsageError bad(std::vector<std::string> args, agent::EnvMap env = {}) {
  ParseResult r = parse_command_line(args, env);
  if (!std::holds_alternative<UsageError>(r)) {
    ADD_FAILURE() << "accepted a bad command line";
    return {};
  }
  UsageError e = std::get<UsageError>(r);
  EXPECT_EQ(e.message.find('\n'), std::string::npos)
      << "one line: " << e.message;
  return e;
}

TEST(Cli, BothSpellingsOfEveryFlag) {
  for (const char* flag : {"--nproc-per-node", "--nproc_per_node"}) {
    EXPECT_EQ(ok({flag, "3", "true"}).agent.nproc_per_node, 3);
  }
  LaunchOptions o = ok({"--max_restarts",
                        "2",
                        "--log_dir",
                        "/tmp/x",
                        "--run_id",
                        "r1",
                        "--master_port",
                        "1234",
                        "--master-addr",
                        "127.0.0.2",
                        "--role",
                        "trainer",
                        "--term-timeout",
                        "0.5",
                        "--tee",
                        "3",
                        "-r",
                        "0:1",
                        "--local_ranks_filter",
                        "0,2",
                        "--monitor_interval",
                        "0.1",
                        "--standalone",
                        "true"});
  EXPECT_EQ(o.agent.max_restarts, 2);
  EXPECT_EQ(o.agent.log_dir, "/tmp/x");
  EXPECT_EQ(o.agent.run_id, "r1");
  EXPECT_EQ(o.agent.master_port, 1234);
  EXPECT_EQ(o.agent.master_addr, "127.0.0.2");
  EXPECT_EQ(o.agent.role, "trainer");
  EXPECT_EQ(o.agent.term_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(o.agent.tee.all, agent::Streams::kBoth);
  EXPECT_EQ(o.agent.redirects.for_rank(0), agent::Streams::kOut);
  EXPECT_EQ(*o.agent.local_ranks_filter, (std::set<int>{0, 2}));
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.agent.entrypoint, std::vector<std::string>{"true"});
}

TEST(Cli, EverythingAfterTheProgramBelongsToIt) {
  LaunchOptions o = ok({"--nproc-per-node", "2", "prog", "--nproc-per-node",
                        "9", "-x", "${local_rank}"});
  EXPECT_EQ(o.agent.nproc_per_node, 2);
  EXPECT_EQ(o.agent.entrypoint,
            (std::vector<std::string>{"prog", "--nproc-per-node", "9", "-x",
                                      "${local_rank}"}));
  LaunchOptions ep = ok({"--rdzv-endpoint", "node1:29401", "prog"});
  EXPECT_EQ(ep.rdzv.endpoint_host, "node1");
  EXPECT_EQ(ep.rdzv.endpoint_port, 29401);
  EXPECT_FALSE(ep.standalone);  // an endpoint was given
  EXPECT_EQ(ok({"--", "prog", "-v"}).agent.entrypoint,
            (std::vector<std::string>{"prog", "-v"}));
  // After "--" even a name starting with '-' is the program.
  EXPECT_EQ(ok({"--max-restarts", "1", "--", "-odd-name"}).agent.entrypoint,
            (std::vector<std::string>{"-odd-name"}));
  EXPECT_THAT(bad({"--max-restarts", "1", "--bogus", "prog"}).message,
              HasSubstr("unknown option '--bogus'"));
}

// The flag syntax dlaunch has always accepted (CLI11's, before the table
// parser replaced it), spelled out so that a rewrite cannot drift.
TEST(Cli, FlagSyntaxKeepsItsMeaning) {
  // --NAME=VALUE; --NAME= is an empty value, as argparse has it (it once
  // took the next argument: an unset variable ran a --dry-run for real).
  EXPECT_EQ(ok({"--nproc_per_node=3", "true"}).agent.nproc_per_node, 3);
  EXPECT_EQ(ok({"--role=a=b", "true"}).agent.role, "a=b");
  EXPECT_THAT(bad({"--role=", "x", "true"}).message,
              HasSubstr("--role: must not be empty"));
  EXPECT_THAT(bad({"--rdzv_id=", "--dry-run", "true"}).message,
              HasSubstr("--rdzv-id: must not be empty"));
  EXPECT_EQ(ok({"--rdzv-endpoint=", "true"}).agent.entrypoint,
            (std::vector<std::string>{"true"}));
  // -XVALUE, and -XY for switches X and Y.
  EXPECT_EQ(ok({"-r0:1", "true"}).agent.redirects.for_rank(0),
            agent::Streams::kOut);
  LaunchOptions mr = ok({"-mr", "3", "mod"});
  EXPECT_TRUE(mr.module);
  EXPECT_EQ(mr.agent.redirects.all, agent::Streams::kBoth);
  // A value is the next argument whatever it looks like, but for one of
  // dlaunch's long options (`--rdzv-id $UNSET --dry-run prog`).
  EXPECT_EQ(ok({"--role", "--x", "true"}).agent.role, "--x");
  EXPECT_THAT(bad({"--rdzv-id", "--dry-run", "true"}).message,
              HasSubstr("--rdzv-id: the value '--dry-run' is an option; give "
                        "the value first"));
  EXPECT_THAT(bad({"--role", "--nnodes=2", "true"}).message,
              HasSubstr("write --role=--nnodes=2 if it is one"));
  EXPECT_EQ(ok({"--role=--dry-run", "true"}).agent.role, "--dry-run");
  // dlaunch's short switches too (`--log-dir $UNSET -m train`), not other
  // short words (ssh's -x).
  EXPECT_THAT(bad({"--rdzv-id", "-m", "--dry-run", "prog"}).message,
              HasSubstr("the value '-m' is an option"));
  EXPECT_EQ(ok({"--ssh-args", "-x", "true"}).remote.ssh_args,
            (std::vector<std::string>{"-x"}));
  // A switch takes no value: `--standalone=false` read as on.
  EXPECT_THAT(bad({"--standalone=false", "true"}).message,
              HasSubstr("--standalone=false: a switch takes no value"));
  EXPECT_THAT(bad({"--no_python=0", "true"}).message,
              HasSubstr("--no_python=0: a switch takes no value"));
  // An empty job file (`--config=$UNSET`) aborted dlaunch.
  EXPECT_THAT(bad({"--config=", "--dry-run", "true"}).message,
              HasSubstr("--config: must not be empty"));
  EXPECT_THAT(bad({"--drill", "", "true"}).message,
              HasSubstr("--drill: must not be empty"));
  EXPECT_EQ(ok({"--ssh-args", "-p 2222", "true"}).remote.ssh_args,
            (std::vector<std::string>{"-p", "2222"}));
  // Switches may repeat; value flags may not.
  EXPECT_TRUE(ok({"-m", "--module", "mod"}).module);
  EXPECT_THAT(bad({"--role", "a", "--role", "b", "true"}).message,
              HasSubstr("--role is given 2 times; give it once"));
  EXPECT_THAT(bad({"-r"}).message,
              HasSubstr("--redirects: the value is missing; give one"));
  // --help answers even after an unknown option; an unknown letter in a
  // group of switches is named alone.
  EXPECT_TRUE(std::holds_alternative<HelpRequested>(
      parse_command_line({"--bogus", "--help"}, {})));
  EXPECT_THAT(bad({"-mq", "prog"}).message, HasSubstr("unknown option '-q'"));
  // A bare "-" and "-1" start the program ("-1" then is no option).
  EXPECT_EQ(ok({"-", "a"}).agent.entrypoint,
            (std::vector<std::string>{"-", "a"}));
  EXPECT_THAT(bad({"-1", "--help"}).message, HasSubstr("unknown option '-1'"));
}

TEST(Cli, PetVariablesFillFlagsAndTheCommandLineWins) {
  agent::EnvMap env{{"PET_NPROC_PER_NODE", "5"}, {"PET_MAX_RESTARTS", "4"}};
  LaunchOptions o = ok({"true"}, env);
  EXPECT_EQ(o.agent.nproc_per_node, 5);
  EXPECT_EQ(o.agent.max_restarts, 4);
  EXPECT_EQ(ok({"--nproc_per_node", "2", "true"}, env).agent.nproc_per_node, 2);
  EXPECT_THAT(bad({"true"}, {{"PET_NPROC_PER_NODE", "lots"}}).message,
              HasSubstr("PET_NPROC_PER_NODE (--nproc-per-node): 'lots' is not "
                        "valid"));
}

TEST(Cli, PythonProgramsRunUnderPythonUnbuffered) {
  dlaunch::testing::TempDir dir;
  dlaunch::testing::write_file(dir / "train.py", "print(1)\n");
  std::string script = (dir / "train.py").string();
  EXPECT_EQ(ok({script, "--lr", "1"}).agent.entrypoint,
            (std::vector<std::string>{"python3", "-u", script, "--lr", "1"}));
  EXPECT_EQ(ok({script}, {{"PYTHON", "/usr/bin/python3"}}).agent.entrypoint[0],
            "/usr/bin/python3");
  EXPECT_EQ(ok({"--python", "/opt/py", script}, {{"PYTHON", "x"}})
                .agent.entrypoint[0],
            "/opt/py");
  EXPECT_EQ(ok({"-m", "pkg.mod", "a"}).agent.entrypoint,
            (std::vector<std::string>{"python3", "-u", "-m", "pkg.mod", "a"}));
  EXPECT_EQ(ok({"--no-python", script}).agent.entrypoint,
            (std::vector<std::string>{script}));
  UsageError missing = bad({"/nonexistent/train.py"});
  EXPECT_EQ(missing.exit_code, 127);
  EXPECT_THAT(missing.message,
              HasSubstr("'/nonexistent/train.py': No such file"));
}

// torchrun's --run-path runs the script in its interpreter
// (runpy.run_path) whatever its name, before --no-python; it was unknown.
TEST(Cli, RunPathRunsAnyScriptUnderPython) {
  dlaunch::testing::TempDir dir;
  dlaunch::testing::write_file(dir / "train", "print(1)\n");
  std::string script = (dir / "train").string();
  for (const char* flag : {"--run-path", "--run_path"}) {
    EXPECT_EQ(ok({flag, script, "--lr", "1"}).agent.entrypoint,
              (std::vector<std::string>{"python3", "-u", script, "--lr", "1"}));
  }
  EXPECT_EQ(ok({"--run-path", "--no-python", script}).agent.entrypoint,
            (std::vector<std::string>{"python3", "-u", script}));
  EXPECT_TRUE(ok({script}, {{"PET_RUN_PATH", "1"}}).run_path);
  EXPECT_EQ(bad({"--run-path", "/nonexistent/train"}).exit_code, 127);
  EXPECT_EQ(bad({"--run-path", "-m", "pkg.mod"}).message,
            "dlaunch: --run-path runs PROG as a script file and --module as "
            "a module; drop one");
}

TEST(Cli, NprocPerNodeKeywords) {
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(ok({"--nproc-per-node", "cpu", "true"}).agent.nproc_per_node, cpus);
  // The real helper asks the real driver (none here: 0).
  int gpus = cuda_device_count(kHelperEnv);
  EXPECT_EQ(
      ok({"--nproc-per-node", "auto", "true"}, kHelperEnv).agent.nproc_per_node,
      gpus > 0 ? gpus : cpus);
  if (gpus == 0) {
    EXPECT_THAT(bad({"--nproc-per-node", "gpu", "true"}, kHelperEnv).message,
                HasSubstr("no CUDA device is visible"));
  } else {
    EXPECT_EQ(ok({"--nproc-per-node", "gpu", "true"}, kHelperEnv)
                  .agent.nproc_per_node,
              gpus);
  }
}

// The real helper over a fake driver (tests/agent/fake_libcuda.cc): only
// "no device" and the toolkit's stub mean zero GPUs; other errors are loud.
class FakeDriver {
 public:
  explicit FakeDriver(int cuinit_rc, int devices = 0) {
    ::setenv("LD_LIBRARY_PATH", DLAUNCH_FAKE_CUDA_DIR, 1);
    ::setenv("FAKE_CUINIT", std::to_string(cuinit_rc).c_str(), 1);
    ::setenv("FAKE_CUDA_DEVICES", std::to_string(devices).c_str(), 1);
  }
  ~FakeDriver() {
    ::unsetenv("LD_LIBRARY_PATH");
    ::unsetenv("FAKE_CUINIT");
    ::unsetenv("FAKE_CUDA_DEVICES");
  }
};

TEST(Cli, GpuCountFromTheDriver) {
  FakeDriver three(0, 3);
  EXPECT_EQ(cuda_device_count(kHelperEnv), 3);
}

TEST(Cli, NoDeviceAndTheStubDriverMeanZeroGpus) {
  {
    FakeDriver no_device(100);  // CUDA_ERROR_NO_DEVICE
    EXPECT_EQ(cuda_device_count(kHelperEnv), 0);
  }
  {
    FakeDriver stub(34);  // CUDA_ERROR_STUB_LIBRARY
    EXPECT_EQ(cuda_device_count(kHelperEnv), 0);
  }
}

TEST(Cli, OtherDriverErrorsAreReportedNotTakenForNoGpu) {
  FakeDriver broken(999);
  EXPECT_THAT(
      [] { cuda_device_count(kHelperEnv); },
      ::testing::ThrowsMessage<std::runtime_error>(HasSubstr(
          "cannot count CUDA devices: cuInit failed with CUDA_ERROR_UNKNOWN "
          "(999); check the NVIDIA driver")));
  // `auto` must not quietly fall back to one worker per CPU.
  UsageError e = bad({"--nproc-per-node", "auto", "true"}, kHelperEnv);
  EXPECT_THAT(e.message, HasSubstr("--nproc-per-node auto: cannot count CUDA "
                                   "devices: cuInit failed with "
                                   "CUDA_ERROR_UNKNOWN (999)"));
  FakeDriver unnamed(35);
  EXPECT_THAT([] { cuda_device_count(kHelperEnv); },
              ::testing::ThrowsMessage<std::runtime_error>(
                  HasSubstr("cuInit failed with unknown CUDA error (35)")));
}

TEST(Cli, CpuBindIsNoneOrCore) {
  EXPECT_EQ(ok({"true"}).agent.cpu_binding, agent::CpuBinding::kNone);
  EXPECT_EQ(ok({"--cpu-bind", "core", "true"}).agent.cpu_binding,
            agent::CpuBinding::kCore);
  EXPECT_EQ(ok({"--cpu_bind=none", "true"}).agent.cpu_binding,
            agent::CpuBinding::kNone);
  EXPECT_EQ(ok({"true"}, {{"PET_CPU_BIND", "core"}}).agent.cpu_binding,
            agent::CpuBinding::kCore);
  UsageError e = bad({"--cpu-bind", "socket", "true"});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_THAT(e.message,
              HasSubstr("--cpu-bind: 'socket' is not valid; use none or core"));
}

TEST(Cli, GpuBindingIsNoneOrPerRankAndChecksTheUsersDeviceList) {
  EXPECT_EQ(ok({"true"}).agent.gpu_binding, agent::GpuBinding::kNone);
  EXPECT_EQ(ok({"--gpu-binding", "per-rank", "true"}).agent.gpu_binding,
            agent::GpuBinding::kPerRank);
  EXPECT_EQ(ok({"--gpu_binding", "none", "true"}).agent.gpu_binding,
            agent::GpuBinding::kNone);
  EXPECT_EQ(ok({"true"}, {{"PET_GPU_BINDING", "per-rank"}}).agent.gpu_binding,
            agent::GpuBinding::kPerRank);
  UsageError e = bad({"--gpu-binding", "each", "true"});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_THAT(e.message,
              HasSubstr("--gpu-binding: 'each' is not valid; use none or "
                        "per-rank"));
  agent::EnvMap two{{"CUDA_VISIBLE_DEVICES", "3,5"}};
  EXPECT_EQ(
      ok({"--gpu-binding", "per-rank", "--nproc-per-node", "2", "true"}, two)
          .agent.nproc_per_node,
      2);
  e = bad({"--gpu-binding", "per-rank", "--nproc-per-node", "3", "true"}, two);
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_THAT(e.message, HasSubstr("--gpu-binding per-rank: 3 workers per "
                                   "node but CUDA_VISIBLE_DEVICES=3,5 lists "
                                   "2"));
  // Without the binding the list is the workers' business.
  ok({"--nproc-per-node", "3", "true"}, two);
}

TEST(Cli, GpuCountingFailuresNameTheHelper) {
  agent::EnvMap missing{{"DLAUNCH_CUDA_DEVICES", "/nonexistent/helper"}};
  EXPECT_THAT(bad({"--nproc-per-node", "gpu", "true"}, missing).message,
              HasSubstr("--nproc-per-node gpu: cannot count CUDA devices: "
                        "/nonexistent/helper is missing"));
  dlaunch::testing::TempDir dir;
  auto script = dir.path() / "helper";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\necho lots\n";
  }
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  agent::EnvMap garbled{{"DLAUNCH_CUDA_DEVICES", script.string()}};
  EXPECT_THAT(bad({"--nproc-per-node", "auto", "true"}, garbled).message,
              HasSubstr("printed 'lots'"));
}

// Each bounded number takes its bounds and refuses one past them, with a
// message that quotes those same bounds (one helper writes the range from
// the bounds it checks).
TEST(Cli, ABoundedNumberQuotesTheBoundsItChecks) {
  struct Case {
    std::string flag;
    int lo, hi;
    std::string noun;
  };
  for (const Case& c :
       std::vector<Case>{{"--max-restarts", 0, 1 << 20, "a number"},
                         {"--pdsh-fanout", 1, 1 << 16, "a number"},
                         {"--ssh-port", 1, 65535, "a port"},
                         {"--master-port", 0, 65535, "a port"}}) {
    SCOPED_TRACE(c.flag);
    ok({c.flag, std::to_string(c.lo), "true"});
    ok({c.flag, std::to_string(c.hi), "true"});
    const std::string range = "use " + c.noun + " " + std::to_string(c.lo) +
                              ".." + std::to_string(c.hi);
    for (int v : {c.lo - 1, c.hi + 1}) {
      EXPECT_THAT(
          bad({c.flag, std::to_string(v), "true"}).message,
          HasSubstr("'" + std::to_string(v) + "' is not valid; " + range));
    }
  }
  EXPECT_THAT(
      bad({"--rdzv-conf", "keep_alive_max_attempt=1001", "true"}).message,
      HasSubstr("use a whole number 1..1000"));
  EXPECT_THAT(bad({"--rdzv-endpoint", "h:65536", "true"}).message,
              HasSubstr("with a port 0..65535"));
}

TEST(Cli, EachBadInputGetsOneLineNamingItAndExit2) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{"--bogus", "true"}, "unknown option '--bogus'"},
      {{}, "no program given"},
      {{"--nproc-per-node", "0", "true"},
       "positive number (at most 65536), cpu, gpu or auto"},
      {{"--nproc-per-node", "70000", "true"}, "(at most 65536)"},
      {{"--max-restarts", "99999999999", "true"}, "use a number 0..1048576"},
      {{"--pdsh-fanout", "0", "true"}, "use a number 1..65536"},
      {{"-r", "0:3,0:1", "true"}, "local rank 0 is given twice"},
      {{"--nnodes", "2:", "true"}, "--nnodes: '2:' is not valid"},
      {{"--nnodes", "1:2:3", "true"}, "--nnodes: '1:2:3' is not valid"},
      {{"--rdzv-endpoint", "host:", "true"}, "'host:' is not valid"},
      {{"--rdzv-endpoint", "host:x", "true"}, "'host:x' is not valid"},
      // A name holds no ':' (these were names, failing at the join timeout).
      {{"--rdzv-endpoint", "node0:29400:1", "true"},
       "--rdzv-endpoint: 'node0:29400:1' is not a host: a name or IPv4 "
       "address holds no ':'"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoint", "http://h:2379", "true"},
       "'http://h:2379' is not a host"},
      {{"--master-addr", "h:80", "true"}, "'h:80' is not a host"},
      {{"--rdzv-id", "../x", "true"}, "--rdzv-id: '../x' cannot name a folder"},
      {{"--rdzv-endpoint", "a b:29400", "true"},
       "--rdzv-endpoint: 'a b' is not a host name or address"},
      {{"--master-addr", "a\tb", "true"}, "is not a host name or address"},
      {{"--local-addr", "node 1", "true"}, "is not a host name or address"},
      {{"--run-id", "..", "true"}, "cannot name a folder"},
      // DEL is a control character too (once let through by both checks).
      {{"--rdzv-id", "a\x7f", "true"}, "cannot name a folder"},
      {{"--master-addr", "a\x7f", "true"},
       "is not a host name or address (it holds a space or a control "
       "character); give a name like node01"},
      {{"--rdzv-id", "a\tb", "true"}, "cannot name a folder"},
      {{"--nproc-per-node"}, "--nproc-per-node"},
      {{"--max-restarts", "x", "true"}, "--max-restarts: 'x' is not valid"},
      {{"--master-port", "70000", "true"}, "a port 0..65535"},
      {{"-r", "7", "true"}, "--redirects: '7': 7 is out of range"},
      {{"--tee", "0:x", "true"}, "--tee:"},
      {{"--local-ranks-filter", "0,a", "true"}, "--local-ranks-filter: 'a'"},
      {{"--term-timeout", "0", "true"}, "--term-timeout: '0' is not valid"},
      {{"--monitor-interval", "-1", "true"}, "--monitor-interval"},
      {{"--signals-to-handle", "SIGFOO", "true"}, "'SIGFOO' is not valid"},
      {{"--nnodes", "2", "true"}, "static backend needs --node-rank (0..1)"},
      {{"--nnodes", "0", "true"}, "--nnodes: '0' is not valid"},
      {{"--nnodes", "3:2", "true"}, "1 <= MIN <= MAX"},
      {{"--nnodes", "1048577", "true"},
       "--nnodes: '1048577' is not valid; use N or MIN:MAX with 1 <= MIN <= "
       "MAX <= 1048576, like 2 or 2:4"},
      {{"--nnodes", "2:x", "true"}, "--nnodes: '2:x' is not valid"},
      {{"--nnodes", "2:3", "true"}, "use --rdzv-backend c10d for MIN:MAX"},
      {{"--nnodes", "2", "--rdzv-backend", "c10d", "true"},
       "needs --rdzv-endpoint"},
      {{"--nnodes", "2", "--node-rank", "2", "true"},
       "is not below --nnodes 2; use 0..1"},
      {{"--rdzv-backend", "c10d", "--node-rank", "0", "--rdzv-endpoint", "h",
        "true"},
       "c10d assigns node ranks itself"},
      {{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:0",
        "true"},
       "port 0 (a free port) works for one node only"},
      {{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h",
        "--master-addr", "a", "true"},
       "drop --master-addr"},
      {{"--nnodes", "2", "--node-rank", "0", "--master-port", "29400", "true"},
       "pick a different --master-port"},
      {{"--standalone", "--nnodes", "2", "--node-rank", "0", "true"},
       "--standalone runs one node"},
      {{"--standalone", "--rdzv-endpoint", "h:1", "true"},
       "drop it or --rdzv-endpoint"},
      {{"--rdzv-backend", "etcd-v9", "true"}, "use static, c10d or etcd"},
      {{"--rdzv-backend", "etcd", "--nnodes", "2", "true"},
       "etcd needs --rdzv-endpoint HOST:2379"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoint", "h", "--rdzv-conf",
        "is_host=true", "true"},
       "with etcd no agent hosts the store"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoint", "h", "--rdzv-conf",
        "user=u", "true"},
       "user= and password_file= go together"},
      {{"--rdzv-backend", "etcd", "--rdzv-endpoint", "h:0", "true"},
       "etcd listens on a fixed port"},
      {{"--rdzv-conf", "password=hunter2", "true"}, "give password_file=PATH"},
      {{"--rdzv-backend", "c10d", "--rdzv-endpoint", "h", "--rdzv-conf",
        "cacert=/ca.pem", "true"},
       "cacert applies to --rdzv-backend etcd"},
      {{"--rdzv-backend", "c10d", "--rdzv-endpoint", "a,b", "true"},
       "a list of endpoints is for --rdzv-backend etcd"},
      {{"--rdzv-endpoint", "host:http", "true"}, "HOST or HOST:PORT"},
      {{"--rdzv-endpoint", ":29400", "true"}, "HOST or HOST:PORT"},
      {{"--rdzv-conf", "bogus", "true"}, "'bogus' is not KEY=VALUE"},
      {{"--rdzv-conf", "colour=red", "true"},
       "unknown key 'colour'; valid keys are join_timeout, "
       "last_call_timeout, close_timeout, keep_alive_interval, "
       "keep_alive_max_attempt, is_host, read_timeout, timeout, token_file, "
       "and for "
       "etcd cacert, cert, key, user, password_file"},
      {{"--rdzv-conf", "join_timeout=nan", "true"},
       "--rdzv-conf join_timeout: 'nan' is not valid"},
      {{"--rdzv-conf", "last_call_timeout=inf", "true"}, "'inf' is not valid"},
      {{"--rdzv-conf", "keep_alive_max_attempt=0", "true"}, "1..1000"},
      {{"--rdzv-conf", "is_host=maybe", "true"}, "use true or false"},
      {{"--exit-barrier-timeout", "1e308", "true"},
       "--exit-barrier-timeout: '1e308'"},
      {{"--local-addr", "", "true"}, "--local-addr: must not be empty"},
      {{"-x", "", "true"},
       "--export: '' names no variable; give NAME or NAME=VALUE, or drop "
       "the empty export"},
      {{"-x", "A", "--export", "", "true"}, "'' names no variable"},
      {{"-x", "1A=v", "true"},
       "--export: '1A=v' is not NAME or NAME=VALUE (a name is letters, "
       "digits and _, not starting with a digit)"},
      // torchrun's default (empty) endpoint is this machine: no meeting
      // place for nodes on other hosts.
      {{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "",
        "true"},
       "--nnodes 2 with --rdzv-backend c10d needs --rdzv-endpoint "
       "HOST[:PORT]"},
      {{"--nnodes", "1:2", "--rdzv-backend", "c10d", "true"},
       "needs --rdzv-endpoint"},
      {{"--start-method", "thread", "true"}, "spawn, fork or forkserver"},
      {{"-m", "--no-python", "x"}, "cannot be used together"},
  };
  for (const Case& c : cases) {
    UsageError e = bad(c.args);
    EXPECT_EQ(e.exit_code, 2);
    EXPECT_THAT(e.message, HasSubstr(c.expect));
  }
}

// A folder reads as nothing and an empty file lists nothing: either would
// run the job on this node alone.
TEST(Cli, AHostfileThatIsAFolderOrListsNoHostIsAnError) {
  dlaunch::testing::TempDir dir;
  std::ofstream(dir / "empty") << "# no hosts yet\n\n";
  UsageError e = bad({"--hostfile", dir.path().string(), "true"});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_THAT(e.message, HasSubstr("--hostfile: '" + dir.path().string() +
                                   "': is a folder; give a readable file "
                                   "with one host per line"));
  e = bad({"--hostfile", (dir / "none").string(), "true"});
  EXPECT_THAT(e.message, HasSubstr("--hostfile: '" + (dir / "none").string() +
                                   "': no such file; give a readable file"));
  e = bad({"--hostfile", (dir / "empty").string(), "true"});
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_THAT(e.message, HasSubstr("lists no host; write one host per line"));
}

// The files dlaunch reads (a hostfile, a job file, --env-file, a pdsh job
// file) fail alike: the file as given, what is wrong, and the fix.
TEST(ReadText, NamesTheFileWhatIsWrongAndTheFix) {
  dlaunch::testing::TempDir dir;
  std::ofstream(dir / "f") << "A=1\nB";
  const auto read = [](const std::string& path) {
    try {
      return read_text<std::runtime_error>(path, "--env-file", "give X");
    } catch (const std::runtime_error& e) {
      return "error: " + std::string(e.what());
    }
  };
  EXPECT_EQ(read((dir / "f").string()), "A=1\nB");
  EXPECT_EQ(read((dir / "none").string()), "error: --env-file: '" +
                                               (dir / "none").string() +
                                               "': no such file; give X");
  EXPECT_EQ(
      read(dir.path().string()),
      "error: --env-file: '" + dir.path().string() + "': is a folder; give X");
  // Opens, then fails to read (EIO at offset 0).
  EXPECT_EQ(read("/proc/self/mem"),
            "error: --env-file: '/proc/self/mem': cannot be read "
            "(Input/output error); give X");
}

// As in torchrun, a --rdzv-conf key given again wins: defaults first,
// then overrides.
TEST(Cli, ARdzvConfKeyGivenAgainWins) {
  EXPECT_EQ(ok({"--rdzv-conf", "join_timeout=1,join_timeout=2", "true"})
                .rdzv.join_timeout,
            std::chrono::seconds(2));
}

TEST(Cli, RendezvousFlagsAreHonoured) {
  LaunchOptions o =
      ok({"--nnodes", "2:4", "--rdzv_backend", "c10d", "--rdzv-endpoint",
          "127.0.0.1", "--rdzv-conf",
          "join_timeout=5,last_call_timeout=0.5,close_timeout=2,keep_alive_"
          "interval=0.25,keep_alive_max_attempt=2,is_host=false,read_"
          "timeout=7",
          "--local_addr", "127.0.0.3", "--exit-barrier-timeout", "9",
          "--master-port", "1234", "true"});
  const auto& r = o.rdzv;
  EXPECT_EQ(r.backend, "c10d");
  EXPECT_EQ(r.min_nodes, 2);
  EXPECT_EQ(r.max_nodes, 4);
  EXPECT_EQ(r.endpoint_host, "127.0.0.1");
  EXPECT_EQ(r.endpoint_port, 29400);  // torchrun's default port
  EXPECT_EQ(r.join_timeout, std::chrono::seconds(5));
  EXPECT_EQ(r.last_call_timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(r.close_timeout, std::chrono::seconds(2));
  EXPECT_EQ(r.keep_alive_interval, std::chrono::milliseconds(250));
  EXPECT_EQ(r.keep_alive_max_attempt, 2);
  EXPECT_EQ(r.is_host, std::optional<bool>(false));
  EXPECT_EQ(r.read_timeout, std::chrono::seconds(7));
  EXPECT_EQ(r.local_addr, "127.0.0.3");
  EXPECT_EQ(o.agent.exit_barrier_timeout, std::chrono::seconds(9));
  EXPECT_EQ(o.agent.rdzv_timeout, std::chrono::seconds(5));
  EXPECT_EQ(o.agent.master_port, 1234);
  EXPECT_FALSE(o.standalone);

  // torchrun's single-node lines keep working.
  LaunchOptions one = ok({"--rdzv-backend", "c10d", "--rdzv-endpoint",
                          "localhost:0", "--nnodes", "1", "true"});
  EXPECT_EQ(one.rdzv.endpoint_host, "localhost");
  EXPECT_EQ(one.rdzv.endpoint_port, 0);
  EXPECT_TRUE(ok({"--standalone", "true"}).standalone);
  // An empty endpoint is torchrun's default: one node, no agents' store.
  EXPECT_EQ(ok({"--rdzv-endpoint", "", "true"}).rdzv.endpoint_host, "");
  EXPECT_EQ(ok({"--rdzv-backend", "c10d", "--rdzv-endpoint", "", "true"})
                .rdzv.endpoint_host,
            "");
  EXPECT_EQ(ok({"--rdzv-endpoint", "[::1]:29500", "true"}).rdzv.endpoint_port,
            29500);

  // Static multi-node: node rank 0 hosts the agents' store at the master
  // address on port 29400; PET_ variables work as for every flag.
  LaunchOptions st = ok({"--master-addr", "127.0.0.2", "true"},
                        {{"PET_NNODES", "3"}, {"PET_NODE_RANK", "2"}});
  EXPECT_EQ(st.rdzv.backend, "static");
  EXPECT_EQ(st.rdzv.node_rank, 2);
  EXPECT_EQ(st.rdzv.endpoint_host, "127.0.0.2");
  EXPECT_EQ(st.rdzv.endpoint_port, 29400);
}

// torchrun's help writes IPv6 as [0:0:0:0:0:0:0:1]: taken as ::1, as
// --rdzv-endpoint takes it (the nodes once waited at "[::1]" forever), and
// loopback needs no token.
TEST(Cli, AnIpv6HostMayBeBracketed) {
  for (const char* addr : {"[::1]", "::1", "[0:0:0:0:0:0:0:1]"}) {
    SCOPED_TRACE(addr);
    LaunchOptions o = ok({"--nnodes", "2", "--node-rank", "1", "--master-addr",
                          addr, "--local-addr", addr, "true"});
    EXPECT_EQ(o.agent.master_addr, "::1");
    EXPECT_EQ(o.rdzv.local_addr, "::1");
    EXPECT_EQ(o.rdzv.endpoint_host, "::1");
    EXPECT_EQ(tokenless_warning(o.rdzv, JobToken{}), std::nullopt);
  }
  EXPECT_EQ(ok({"--rdzv-endpoint", "[0:0:0:0:0:0:0:1]:29500", "true"})
                .rdzv.endpoint_host,
            "::1");
  for (const char* addr : {"[::1", "[]", "[::1]:29500"}) {
    EXPECT_THAT(bad({"--master-addr", addr, "true"}).message,
                HasSubstr("write an IPv6 address as [::1] or ::1"));
  }
  // A link-local address keeps its zone; a v4-mapped one is IPv6 too.
  EXPECT_EQ(ok({"--master-addr", "[fe80::1%eth0]", "true"}).agent.master_addr,
            "fe80::1%eth0");
  EXPECT_EQ(
      ok({"--rdzv-endpoint", "[fe80::1%lo]:29500", "true"}).rdzv.endpoint_host,
      "fe80::1%lo");
  EXPECT_EQ(ok({"--local-addr", "::ffff:1.2.3.4", "true"}).rdzv.local_addr,
            "::ffff:1.2.3.4");
}

TEST(Cli, EtcdTakesAListOfMembersAndItsTlsAndLogin) {
  LaunchOptions o =
      ok({"--nnodes", "2:4", "--rdzv-backend", "etcd", "--rdzv-endpoint",
          "e1,e2:2380,[::1]", "--rdzv-conf",
          "cacert=/ca.pem,cert=/c.pem,key=/k.pem,user=dl,password_file=/pw",
          "true"});
  const auto& r = o.rdzv;
  EXPECT_EQ(r.backend, "etcd");
  EXPECT_EQ(r.etcd_endpoints,
            (std::vector<std::string>{"e1:2379", "e2:2380", "[::1]:2379"}));
  EXPECT_EQ(r.cacert, "/ca.pem");
  EXPECT_EQ(r.cert, "/c.pem");
  EXPECT_EQ(r.key, "/k.pem");
  EXPECT_EQ(r.user, "dl");
  EXPECT_EQ(r.password_file, "/pw");
}

TEST(Cli, HelpReadsLikeAManPage) {
  EXPECT_TRUE(std::holds_alternative<HelpRequested>(
      parse_command_line({"--help"}, {})));
  EXPECT_TRUE(
      std::holds_alternative<HelpRequested>(parse_command_line({"-h"}, {})));
  for (const char* section :
       {"NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "--nproc-per-node",
        "--max-restarts", "--tee", "--signals-to-handle", "EXAMPLES"}) {
    EXPECT_THAT(help_text(), HasSubstr(section));
  }
}

TEST(FlagTable, EveryJobFlagHasAKeyAndEveryActionNone) {
  std::set<std::string> keys, names;
  for (const FlagSpec& f : flags()) {
    SCOPED_TRACE(std::string(f.name));
    if (f.action) {
      EXPECT_TRUE(f.key.empty()) << "an action configures no job";
      EXPECT_EQ(f.apply, nullptr);
      EXPECT_EQ(pet_variable(f), "");
    } else {
      EXPECT_FALSE(f.key.empty()) << "a job flag needs a YAML key";
      EXPECT_NE(f.apply, nullptr);
      EXPECT_NE(f.print, nullptr);
      EXPECT_TRUE(keys.insert(std::string(f.key)).second) << "duplicate key";
      // The help page's rule: PET_ + the key in capitals.
      std::string pet = "PET_";
      for (char c : f.key) pet += static_cast<char>(std::toupper(c));
      EXPECT_EQ(pet_variable(f), pet);
      EXPECT_EQ(find_flag(f.key), &f);
    }
    EXPECT_FALSE(f.help.empty());
    EXPECT_FALSE(f.section.empty());
    EXPECT_EQ(f.placeholder.empty(), f.type == ValueType::kSwitch);
    for (const std::string& s : spellings(f)) {
      EXPECT_TRUE(names.insert(s).second) << "spelling used twice: " << s;
      EXPECT_THAT(help_text(), HasSubstr(s.find('_') == std::string::npos
                                             ? s
                                             : std::string(f.name)));
    }
  }
  for (const char* action : {"help", "version"}) {
    ASSERT_NE(find_flag(action), nullptr) << action;
    EXPECT_TRUE(find_flag(action)->action);
  }
}

TEST(FlagTable, PrintedValuesReadBackTheSame) {
  // What --print-config writes for each flag parses to the same options.
  LaunchOptions o = ok({"--nproc-per-node",
                        "3",
                        "--max-restarts",
                        "2",
                        "--term-timeout",
                        "0.25",
                        "-t",
                        "0:3,1:1",
                        "--local-ranks-filter",
                        "0,2",
                        "--signals-to-handle",
                        "SIGINT,SIGUSR1",
                        "--rdzv-conf",
                        "join_timeout=5,is_host=true",
                        "--nnodes",
                        "2:3",
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        "h:29500",
                        "--local-addr",
                        "127.0.0.2",
                        "--exit-barrier-timeout",
                        "9",
                        "--monitor-interval",
                        "1.5",
                        "--log-dir",
                        "/tmp/l",
                        "--rdzv-id",
                        "abc",
                        "-m",
                        "pkg"});
  for (const FlagSpec& f : flags()) {
    if (f.action) continue;
    SCOPED_TRACE(std::string(f.name));
    std::optional<std::string> text = f.print(o);
    if (!text) continue;
    LaunchOptions again = o;
    f.apply(f, *text, again, kHelperEnv);
    EXPECT_EQ(f.print(again), text);
  }
}

TEST(Cli, EveryDurationIsFinitePositiveAndBounded) {
  int durations = 0;
  for (const FlagSpec& f : flags()) {
    if (f.type != ValueType::kSeconds) continue;
    ++durations;
    std::string flag = "--" + std::string(f.name);
    for (const char* v : {"nan", "inf", "-inf", "1e308", "-1", "0", "0.0001",
                          "604801", "x", ""}) {
      SCOPED_TRACE(flag + " " + v);
      UsageError e = bad({flag, v, "true"});
      EXPECT_EQ(e.exit_code, 2);
      EXPECT_THAT(e.message, HasSubstr(flag + ": '" + v + "' is not valid"));
      EXPECT_THAT(e.message, HasSubstr("from 0.001 to 604800 (7 days)"));
      // The same check for the PET_* variable.
      EXPECT_THAT(bad({"true"}, {{pet_variable(f), v}}).message,
                  HasSubstr(pet_variable(f) + " (" + flag + "): '" + v + "'"));
    }
    EXPECT_TRUE(std::holds_alternative<LaunchOptions>(
        parse_command_line({flag, "604800", "true"}, {})));
  }
  EXPECT_GE(durations, 2);  // --term-timeout, --monitor-interval
  EXPECT_EQ(ok({"--term-timeout", "0.001", "true"}).agent.term_timeout,
            std::chrono::milliseconds(1));
  EXPECT_EQ(ok({"--term-timeout", "604800", "true"}).agent.term_timeout,
            std::chrono::hours(24 * 7));
}

TEST(Cli, VersionPrintsTheVersion) {
  EXPECT_TRUE(std::holds_alternative<VersionRequested>(
      parse_command_line({"--version"}, {})));
}

}  // namespace
}  // namespace dlaunch::launcher
