// Fault specs on the command line: --fault (repeatable), PET_FAULTS,
// DLAUNCH_FAULTS and a job file's faults: add up; a bad spec or a
// duplicate is exit 2 naming the spec and where it came from; ranks and
// nodes of a fixed-size job are checked before anything starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "launcher/cli.h"
#include "launcher/job_print.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::launcher {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_file;

ParseResult parse(const std::vector<std::string>& args,
                  const agent::EnvMap& env = {}) {
  return parse_command_line(args, env);
}

std::vector<std::string> specs(const ParseResult& r) {
  if (auto* e = std::get_if<UsageError>(&r)) {
    ADD_FAILURE() << "rejected: " << e->message;
    return {};
  }
  std::vector<std::string> out;
  for (const agent::Fault& f : std::get<LaunchOptions>(r).agent.faults) {
    out.push_back(f.spec);
  }
  return out;
}

std::string error(const ParseResult& r) {
  auto* e = std::get_if<UsageError>(&r);
  if (e == nullptr) {
    ADD_FAILURE() << "accepted";
    return "";
  }
  EXPECT_EQ(e->exit_code, 2);
  return e->message;
}

TEST(FaultFlags, RepeatedAndListedFaultsAreAllApplied) {
  EXPECT_EQ(specs(parse({"--nproc-per-node", "4", "--fault", "kill:rank=1",
                         "--fault", "stop:rank=2:after=1,exit:rank=3:code=5",
                         "prog", "--fault", "x"})),
            (std::vector<std::string>{"kill:rank=1", "stop:rank=2:after=1",
                                      "exit:rank=3:code=5"}));
  // PROG after the flag is the program, not a second spec.
  auto r = parse({"--fault", "kill:rank=0", "prog", "arg"});
  ASSERT_TRUE(std::holds_alternative<LaunchOptions>(r)) << error(r);
  EXPECT_EQ(std::get<LaunchOptions>(r).program, "prog");
  EXPECT_EQ(std::get<LaunchOptions>(r).program_args,
            std::vector<std::string>{"arg"});
}

TEST(FaultFlags, FileVariablesAndFlagsAddUp) {
  TempDir dir;
  write_file(dir / "job.yaml",
             "program: prog\nnproc_per_node: 4\nfaults:\n  - kill:rank=0\n"
             "  - stop:rank=1:after=2\n");
  agent::EnvMap env{{"DLAUNCH_FAULTS", "exit:rank=2;kill:rank=3:signal=TERM"},
                    {"PET_FAULTS", "kill:rank=1:attempt=1"}};
  EXPECT_EQ(specs(parse({"--config", (dir / "job.yaml").string(), "--fault",
                         "kill-agent:node=0:after=5"},
                        env)),
            (std::vector<std::string>{"kill:rank=0", "stop:rank=1:after=2",
                                      "kill:rank=1:attempt=1", "exit:rank=2",
                                      "kill:rank=3:signal=TERM",
                                      "kill-agent:node=0:after=5"}));
  // A flow list in the file reads the same.
  write_file(dir / "flow.yaml",
             "program: prog\nfaults: [kill:rank=0:after=1, 'stop:rank=0']\n");
  EXPECT_EQ(specs(parse({"--config", (dir / "flow.yaml").string()})),
            (std::vector<std::string>{"kill:rank=0:after=1", "stop:rank=0"}));
}

TEST(FaultFlags, BadSpecsNameTheSpecAndTheirSource) {
  EXPECT_EQ(error(parse({"--fault", "kil:rank=0", "prog"})),
            "dlaunch: --fault: fault 'kil:rank=0': unknown kind 'kil'; use "
            "kill, exit, stop, kill-agent or cut (see dlaunch --help)");
  EXPECT_THAT(error(parse({"prog"}, {{"DLAUNCH_FAULTS", "kill:rank=x"}})),
              HasSubstr("DLAUNCH_FAULTS: fault 'kill:rank=x': rank='x'"));
  TempDir dir;
  write_file(dir / "job.yaml", "program: prog\nfaults:\n  - stop\n");
  EXPECT_THAT(
      error(parse({"--config", (dir / "job.yaml").string()})),
      HasSubstr("job.yaml:3:3: faults: fault 'stop': stop needs rank="));
  write_file(dir / "map.yaml", "program: prog\nfaults: {kill: 1}\n");
  EXPECT_THAT(error(parse({"--config", (dir / "map.yaml").string()})),
              HasSubstr("map.yaml:2:9: faults: expected a list"));
}

TEST(FaultFlags, TheSameFaultFromTwoSourcesIsAnError) {
  EXPECT_THAT(error(parse({"--fault", "kill:rank=0:signal=9", "prog"},
                          {{"DLAUNCH_FAULTS", "kill:rank=0"}})),
              HasSubstr("fault 'kill:rank=0:signal=9': the same fault as "
                        "'kill:rank=0' is given twice"));
}

TEST(FaultFlags, TargetsOutsideAFixedJobAreRefusedAtOnce) {
  EXPECT_EQ(
      error(parse({"--nproc-per-node", "2", "--fault", "kill:rank=2", "prog"})),
      "dlaunch: fault 'kill:rank=2': rank 2 is out of range: 2 workers "
      "(ranks 0..1)");
  EXPECT_THAT(error(parse({"--fault", "kill-agent:node=1", "prog"})),
              HasSubstr("node 1 is out of range: 1 node(s) (0..0)"));
  EXPECT_EQ(error(parse({"--fault", "cut:node=0:for=1", "prog"})),
            "dlaunch: fault 'cut:node=0:for=1': one node has no link to the "
            "other nodes to cut; cut needs a multi-node job (--rdzv-endpoint)");
  // One agent of several nodes knows only its own workers (the others may
  // run more): its ranks are checked when the round forms; its nodes now.
  EXPECT_EQ(
      specs(parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   "127.0.0.1:29400", "--fault", "kill:rank=3", "prog"})),
      (std::vector<std::string>{"kill:rank=3"}));
  EXPECT_THAT(
      error(parse({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   "127.0.0.1:29400", "--fault", "kill-agent:node=2", "prog"})),
      HasSubstr("node 2 is out of range: 2 node(s) (0..1)"));
  // Elastic jobs check when each round forms.
  EXPECT_EQ(
      specs(parse({"--nnodes", "1:4", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", "127.0.0.1:29400", "--fault",
                   "kill:rank=7", "--fault", "kill-agent:node=3", "prog"})),
      (std::vector<std::string>{"kill:rank=7", "kill-agent:node=3"}));
}

TEST(FaultFlags, PrintConfigWritesThemBack) {
  auto r = parse({"--nproc-per-node", "2", "--hang-timeout", "1.5", "--fault",
                  "kill:rank=1:after=2", "--fault", "stop:rank=0", "prog"});
  ASSERT_TRUE(std::holds_alternative<LaunchOptions>(r)) << error(r);
  const LaunchOptions& o = std::get<LaunchOptions>(r);
  EXPECT_EQ(o.agent.hang_timeout, std::chrono::milliseconds(1500));
  std::string yaml = job_yaml(o, true);
  EXPECT_THAT(yaml, HasSubstr("faults: [kill:rank=1:after=2, stop:rank=0]"));
  EXPECT_THAT(yaml, HasSubstr("hang_timeout: 1.5"));
  TempDir dir;
  write_file(dir / "printed.yaml", yaml);
  auto again = parse({"--config", (dir / "printed.yaml").string()});
  EXPECT_EQ(specs(again), specs(r));
  EXPECT_EQ(job_yaml(std::get<LaunchOptions>(again), true), yaml);
  EXPECT_THAT(dry_run_plan(o),
              HasSubstr("fault:     kill:rank=1:after=2 (SIGKILL to rank 1)"));
}

}  // namespace
}  // namespace dlaunch::launcher
