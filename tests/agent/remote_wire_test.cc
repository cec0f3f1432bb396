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

// The options the agent sends the helper come back as they were.
TEST(RemoteWire, OptionsRoundTrip) {
  RendezvousOptions o;
  o.backend = "etcd";
  o.min_nodes = 2;
  o.max_nodes = 5;
  o.etcd_endpoints = {"10.0.0.1:2379", "10.0.0.2:2379"};
  o.cacert = "/ca path.pem";
  o.cert = "c.pem";
  o.key = "k.pem";
  o.user = "root";
  o.password_file = "/run/pw";
  o.join_timeout = std::chrono::milliseconds(12345);
  o.last_call_timeout = std::chrono::milliseconds(1500);
  o.close_timeout = std::chrono::milliseconds(2000);
  o.keep_alive_interval = std::chrono::milliseconds(250);
  o.keep_alive_max_attempt = 7;
  o.read_timeout = std::chrono::milliseconds(9000);
  RendezvousOptions b =
      decode_options(decode_settings(encode_settings(encode_options(o))));
  EXPECT_EQ(b.backend, o.backend);
  EXPECT_EQ(b.min_nodes, 2);
  EXPECT_EQ(b.max_nodes, 5);
  EXPECT_EQ(b.node_rank, -1);
  EXPECT_EQ(b.etcd_endpoints, o.etcd_endpoints);
  EXPECT_EQ(b.cacert, o.cacert);
  EXPECT_EQ(b.cert, o.cert);
  EXPECT_EQ(b.key, o.key);
  EXPECT_EQ(b.user, o.user);
  EXPECT_EQ(b.password_file, o.password_file);
  EXPECT_EQ(b.join_timeout, o.join_timeout);
  EXPECT_EQ(b.last_call_timeout, o.last_call_timeout);
  EXPECT_EQ(b.close_timeout, o.close_timeout);
  EXPECT_EQ(b.keep_alive_interval, o.keep_alive_interval);
  EXPECT_EQ(b.keep_alive_max_attempt, 7);
  EXPECT_EQ(b.read_timeout, o.read_timeout);
  auto s = encode_options(o);
  s.erase("max_nodes");
  EXPECT_THROW(decode_options(s), std::invalid_argument);
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
