// The agent <-> rendezvous helper protocol (agent/rendezvous/remote_wire.h):
// every message round-trips, and malformed ones are refused.
#include "agent/rendezvous/remote_wire.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace dlaunch::agent::rendezvous::remote {
namespace {

TEST(RemoteWire, FieldsWithSpacesNewlinesAndPercentRoundTrip) {
  std::vector<std::string> f = {"log", "waiting for nodes: 2/3\n", "100%", "",
                                "a\rb"};
  std::string line = encode_line(f);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  EXPECT_EQ(decode_line(line.substr(0, line.size() - 1)), f);
}

TEST(RemoteWire, ARoundRoundTrips) {
  RendezvousResult r;
  r.round = 3;
  r.group_rank = 1;
  r.group_world_size = 2;
  r.world_size = 5;
  r.rank_offset = 2;
  r.master_addr = "10.0.0.1";
  r.master_port = 29500;
  r.restart_count = 4;
  r.reason = RoundReason::kNodeJoined;
  r.restart_cause = "a worker on node 10.0.0.2/7 failed";
  r.members = {"10.0.0.1", "10.0.0.2"};
  RendezvousResult back = decode_result(encode_result(r));
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.group_rank, 1);
  EXPECT_EQ(back.group_world_size, 2);
  EXPECT_EQ(back.world_size, 5);
  EXPECT_EQ(back.rank_offset, 2);
  EXPECT_EQ(back.master_addr, "10.0.0.1");
  EXPECT_EQ(back.master_port, 29500);
  EXPECT_EQ(back.restart_count, 4);
  EXPECT_EQ(back.reason, RoundReason::kNodeJoined);
  EXPECT_EQ(back.restart_cause, r.restart_cause);
  EXPECT_EQ(back.members, r.members);
}

TEST(RemoteWire, SettingsAndEnumsRoundTrip) {
  std::map<std::string, std::string> s = {{"endpoints", "a:1,b:2"},
                                          {"user", ""}};
  EXPECT_EQ(decode_settings(encode_settings(s)), s);
  for (auto k : {RoundEvent::Kind::kSucceeded, RoundEvent::Kind::kFatal}) {
    EXPECT_EQ(kind_from_wire(to_wire(k)), k);
  }
  for (auto o : {NodeOutcome::kLeaving, NodeOutcome::kGaveUp}) {
    EXPECT_EQ(outcome_from_wire(to_wire(o)), o);
  }
}

TEST(RemoteWire, MalformedMessagesAreRefused) {
  EXPECT_THROW(decode_line("a%2"), std::invalid_argument);
  EXPECT_THROW(decode_line("a%zz"), std::invalid_argument);
  EXPECT_THROW(decode_result({"1", "2"}), std::invalid_argument);
  EXPECT_THROW(
      decode_result({"x", "0", "1", "1", "0", "h", "1", "0", "0", "h"}),
      std::invalid_argument);
  // A round of two nodes that lists one.
  EXPECT_THROW(
      decode_result({"0", "0", "2", "1", "0", "h", "1", "0", "0", "h"}),
      std::invalid_argument);
  EXPECT_THROW(kind_from_wire(99), std::invalid_argument);
  EXPECT_THROW(decode_settings({"novalue"}), std::invalid_argument);
}

}  // namespace
}  // namespace dlaunch::agent::rendezvous::remote
