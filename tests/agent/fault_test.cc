// Fault specs (agent/fault.h, comm/fault_spec.h): every kind, the
// canonical text, and every bad form with the message it gets.
#include "agent/fault.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/fault_spec.h"

namespace dlaunch::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string error_of(const std::string& spec) {
  try {
    parse_fault(spec);
  } catch (const comm::FaultSpecError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << spec;
  return "";
}

TEST(Fault, EveryKindParses) {
  Fault k = parse_fault("kill:rank=1:after=2.5:signal=TERM:attempt=1");
  EXPECT_EQ(k.kind, Fault::Kind::kKill);
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.node, -1);
  EXPECT_EQ(k.after, std::chrono::milliseconds(2500));
  EXPECT_EQ(k.signal, SIGTERM);
  EXPECT_EQ(k.attempt, 1);
  EXPECT_EQ(k.spec, "kill:rank=1:signal=TERM:after=2.5:attempt=1");

  Fault e = parse_fault("exit:rank=0:code=3");
  EXPECT_EQ(e.kind, Fault::Kind::kExit);
  EXPECT_EQ(e.code, 3);
  EXPECT_EQ(e.spec, "exit:rank=0:code=3");

  Fault s = parse_fault("stop:rank=7:after=0.25");
  EXPECT_EQ(s.kind, Fault::Kind::kStop);
  EXPECT_EQ(s.spec, "stop:rank=7:after=0.25");

  Fault a = parse_fault("kill-agent:node=2:signal=SIGTERM");
  EXPECT_EQ(a.kind, Fault::Kind::kKillAgent);
  EXPECT_EQ(a.node, 2);
  EXPECT_EQ(a.rank, -1);
  EXPECT_FALSE(a.targets_rank());
  EXPECT_EQ(a.signal, SIGTERM);

  Fault c = parse_fault("cut:for=20:node=1:after=1");
  EXPECT_EQ(c.kind, Fault::Kind::kCut);
  EXPECT_EQ(c.node, 1);
  EXPECT_EQ(c.duration, std::chrono::seconds(20));
  EXPECT_EQ(c.spec, "cut:node=1:for=20:after=1");
}

TEST(Fault, DefaultsAndSpellingsGiveOneCanonicalText) {
  // Defaults left out; SIGKILL, KILL and 9 are one signal.
  for (const char* same :
       {"kill:rank=1", "kill:rank=1:signal=KILL", "kill:rank=1:signal=SIGKILL",
        "kill:rank=1:signal=9", "kill:rank=1:after=0:attempt=0",
        "kill:attempt=0:rank=1"}) {
    EXPECT_EQ(parse_fault(same).spec, "kill:rank=1") << same;
  }
  EXPECT_EQ(parse_fault("exit:rank=2:code=1").spec, "exit:rank=2");
  EXPECT_EQ(parse_fault("kill:rank=0:signal=USR1").signal, SIGUSR1);
  EXPECT_EQ(parse_fault("kill:rank=0:after=0.001").after.count(), 1);
}

TEST(Fault, EveryBadFormIsAnErrorNamingTheSpec) {
  struct Case {
    std::string spec;
    std::string message;
  };
  const Case cases[] = {
      {"", "fault '': empty"},
      {":rank=1", "fault ':rank=1': no kind before ':'"},
      {"kil:rank=1",
       "unknown kind 'kil'; use kill, exit, stop, kill-agent or cut"},
      {"cut:node=1", "cut needs for= (like cut:node=1:for=20)"},
      {"cut:for=3", "cut needs node= (like cut:node=1)"},
      {"cut:node=1:for=0", "for=0 cuts nothing"},
      {"cut:node=1:for=2:signal=KILL", "'signal' is not a key of cut"},
      {"kill", "kill needs rank= (like kill:rank=1)"},
      {"kill-agent:rank=1", "'rank' is not a key of kill-agent"},
      {"kill-agent", "kill-agent needs node="},
      {"kill:rank", "'rank' is not KEY=VALUE"},
      {"kill:rank=", "'rank=' is not KEY=VALUE"},
      {"kill:=1", "'=1' is not KEY=VALUE"},
      {"kill:rank=1:", "'' is not KEY=VALUE"},
      {"kill:rank=1:rank=2", "'rank' is given twice"},
      {"kill:rank=1:code=2",
       "'code' is not a key of kill; its keys are rank, "
       "signal, after, attempt"},
      {"stop:rank=1:signal=KILL", "'signal' is not a key of stop"},
      {"kill:rank=-1", "rank='-1' is not valid; use a whole number"},
      {"kill:rank=one", "rank='one' is not valid"},
      {"kill:rank=1.5", "rank='1.5' is not valid"},
      {"kill:rank=1:after=-1", "after='-1' is not valid; use seconds"},
      {"kill:rank=1:after=soon", "after='soon' is not valid"},
      {"kill:rank=1:after=inf", "after='inf' is not valid"},
      {"kill:rank=1:after=1e9", "after='1e9' is not valid"},
      {"kill:rank=1:attempt=x", "attempt='x' is not valid"},
      {"kill:rank=1:signal=BOOM", "signal='BOOM' is not a signal"},
      {"kill:rank=1:signal=0", "signal='0' is not a signal"},
      {"kill:rank=1:signal=65", "signal='65' is not a signal"},
      {"exit:rank=1:code=0", "code=0 is not a failure"},
      {"exit:rank=1:code=256", "code='256' is not valid"},
      {"kill,rank=1", "unknown kind 'kill,rank=1'"},
  };
  for (const Case& c : cases) {
    std::string e = error_of(c.spec);
    EXPECT_THAT(e, StartsWith("fault '" + c.spec + "': ")) << c.spec;
    EXPECT_THAT(e, HasSubstr(c.message)) << c.spec;
  }
}

TEST(Fault, TheSameFaultTwiceIsAnError) {
  EXPECT_EQ(parse_faults({"kill:rank=1", "kill:rank=1:attempt=1", "stop:rank=1",
                          "kill:rank=0"})
                .size(),
            4u);
  try {
    parse_faults({"kill:rank=1", "stop:rank=0", "kill:rank=1:signal=9"});
    FAIL() << "a duplicate was accepted";
  } catch (const comm::FaultSpecError& e) {
    EXPECT_THAT(e.what(), HasSubstr("fault 'kill:rank=1:signal=9': the same "
                                    "fault as 'kill:rank=1' is given twice"));
  }
  EXPECT_THROW(parse_faults({"stop:rank=0", "bad"}), comm::FaultSpecError);
}

TEST(Fault, ListsSplitOnCommasSemicolonsAndSpace) {
  EXPECT_EQ(
      comm::split_fault_list("kill:rank=1, stop:rank=0;exit:rank=2\n"),
      (std::vector<std::string>{"kill:rank=1", "stop:rank=0", "exit:rank=2"}));
  EXPECT_TRUE(comm::split_fault_list(" ;, ").empty());
}

TEST(Fault, ActionsSayWhatFiringDoes) {
  EXPECT_EQ(fault_action(parse_fault("kill:rank=1")), "SIGKILL to rank 1");
  EXPECT_EQ(fault_action(parse_fault("exit:rank=2:code=4")),
            "rank 2 ended as exit code 4");
  EXPECT_EQ(fault_action(parse_fault("stop:rank=0")),
            "SIGSTOP to rank 0 (frozen)");
  EXPECT_EQ(fault_action(parse_fault("kill-agent:node=1")),
            "SIGKILL to the agent of node 1");
  EXPECT_EQ(fault_action(parse_fault("cut:node=1:for=2.5")),
            "node 1 silent to the agents' store for 2.5 s");
}

}  // namespace
}  // namespace dlaunch::agent
