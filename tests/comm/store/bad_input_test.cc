// Bad input on the wire closes only the offending connection, with exactly
// one log line, while other clients (including one blocked in wait) carry on.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <sstream>
#include <thread>

#include "comm/store/wire.h"
#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using testing::RawSocket;
using wire::MsgType;

std::string hello(uint32_t magic = wire::kMagic,
                  uint16_t version = wire::kVersion) {
  std::string out;
  wire::encode_hello(wire::Hello{magic, version}, out);
  return out;
}

std::string frame_header(uint32_t body_len, uint8_t type) {
  std::string out;
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(body_len >> (8 * i)));
  out.push_back(static_cast<char>(type));
  return out;
}

std::string request(wire::Request r) {
  std::string out;
  wire::encode_request(r, out);
  return out;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StoreServerOptions o;
    o.host = "127.0.0.1";
    o.max_frame_bytes = 4096;
    server_ = StoreServer::start(o);
    good_ = testing::connect_to(server_->port());
    // A bystander blocked in wait across every bad connection.
    bystander_ = std::async(std::launch::async, [port = server_->port()] {
      testing::connect_to(port)->wait({"release"}, 20s);
    });
  }

  void TearDown() override {
    // The bystander and an ordinary client are unaffected.
    good_->set("k", "v");
    EXPECT_EQ(good_->get("k"), "v");
    EXPECT_EQ(bystander_.wait_for(0s), std::future_status::timeout);
    good_->set("release", "");
    EXPECT_EQ(bystander_.wait_for(5s), std::future_status::ready);
    bystander_.get();
    server_.reset();
  }

  // Sends `bytes` on a fresh connection and expects the server to close it
  // with exactly one log line containing `why`.
  void expect_rejected(const std::string& bytes, const std::string& why) {
    RawSocket s(server_->port());
    s.send(bytes);
    EXPECT_TRUE(s.closed_by_peer()) << "server kept the connection open";
    expect_one_log_line(why);
  }

  void expect_one_log_line(const std::string& why) {
    std::string log = log_.text();
    log_.clear();
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
    EXPECT_THAT(log, HasSubstr("store: closing connection from 127.0.0.1:"));
    EXPECT_THAT(log, HasSubstr(why));
  }

  testing::LogCapture log_;  // the server's log lines
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<TcpStore> good_;
  std::future<void> bystander_;
};

TEST_F(BadInputTest, GarbageBytes) {
  expect_rejected("GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                  "bad handshake: not a dlaunch store client (magic "
                  "0x20544547, expected 0x54534c44)");
}

TEST_F(BadInputTest, WrongMagic) {
  expect_rejected(hello(0xdeadbeef), "magic 0xdeadbeef");
}

TEST_F(BadInputTest, WrongVersionGetsTheServersHelloThenClose) {
  RawSocket s(server_->port());
  s.send(hello(wire::kMagic, 99));
  EXPECT_EQ(s.recv_n(wire::kHelloBytes), hello());
  EXPECT_TRUE(s.closed_by_peer());
  expect_one_log_line("protocol version 99, this server speaks " +
                      std::to_string(wire::kVersion));
}

TEST_F(BadInputTest, AbsurdLength) {
  expect_rejected(hello() + frame_header(0xffffffff, 1),
                  "frame length 4294967295 exceeds the limit of 4096 bytes");
}

TEST_F(BadInputTest, FrameOverTheConfiguredCapFromARealClient) {
  auto c = testing::connect_to(server_->port());
  EXPECT_THAT([&] { c->set("big", std::string(5000, 'x')); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("lost connection to store 127.0.0.1:")));
  // The client's error and the server's log line come from different
  // threads; the log is written before the server closes the socket.
  expect_one_log_line("exceeds the limit of 4096 bytes");
}

TEST_F(BadInputTest, UnknownMessageType) {
  expect_rejected(hello() + frame_header(0, 0x63), "unknown request type 0x63");
}

TEST_F(BadInputTest, ResponseTypeSentAsARequest) {
  expect_rejected(hello() + frame_header(0, 64), "unknown request type ok");
}

TEST_F(BadInputTest, MalformedBody) {
  // A set whose key claims 100 bytes in a 6-byte body.
  expect_rejected(hello() + frame_header(6, 1) +
                      std::string("\x64\x00\x00\x00"
                                  "ab",
                                  6),
                  "set frame of 6 bytes is malformed: truncated body");
}

TEST_F(BadInputTest, TruncatedFrameThenHangUp) {
  RawSocket s(server_->port());
  s.send(hello() +
         request({.type = MsgType::kSet, .keys = {"k"}, .values = {"v"}})
             .substr(0, 7));
  ::shutdown(s.fd(), SHUT_WR);
  EXPECT_TRUE(s.closed_by_peer());
  expect_one_log_line(
      "truncated frame: peer closed the connection with 7 bytes of an "
      "incomplete frame buffered");
}

TEST_F(BadInputTest, TruncatedHandshakeThenHangUp) {
  RawSocket s(server_->port());
  s.send(hello().substr(0, 5));
  ::shutdown(s.fd(), SHUT_WR);
  EXPECT_TRUE(s.closed_by_peer());
  expect_one_log_line("5 bytes of an incomplete handshake");
}

TEST_F(BadInputTest, StalledPartialFrameDoesNotStallOthers) {
  RawSocket s(server_->port());
  s.send(hello() + frame_header(100, 1) + "abc");
  // The server waits for the rest without blocking anyone: TearDown's
  // clients run while this connection is still half-sent.
  ASSERT_TRUE(s.read_by_server());
  good_->set("during", "stall");
  EXPECT_EQ(good_->get("during"), "stall");
  EXPECT_EQ(log_.text(), "");
}

TEST_F(BadInputTest, ClientHangingUpWhileWaitingIsForgotten) {
  {
    RawSocket s(server_->port());
    s.send(hello() + request({.type = MsgType::kWait,
                              .keys = {"gone-key"},
                              .timeout_ms = 60000}));
    EXPECT_EQ(s.recv_n(wire::kHelloBytes), hello());
    // Parked: this wait and the bystander's.
    ASSERT_TRUE(
        testing::eventually([&] { return server_->num_waiting() == 2; }, 30s));
  }
  // The server has seen the hang-up: only the bystander still waits.
  ASSERT_TRUE(
      testing::eventually([&] { return server_->num_waiting() == 1; }, 30s));
  // Setting the key must not touch the departed waiter; a normal hang-up is
  // not bad input and logs nothing.
  good_->set("gone-key", "x");
  EXPECT_EQ(good_->get("gone-key"), "x");
  EXPECT_EQ(log_.text(), "");
}

TEST_F(BadInputTest, PipelinedRequestsAnswerInOrderEvenBehindABlockedGet) {
  RawSocket s(server_->port());
  s.send(
      hello() +
      request({.type = MsgType::kGet, .keys = {"late"}, .timeout_ms = 5000}) +
      request({.type = MsgType::kSet, .keys = {"p"}, .values = {"1"}}) +
      request({.type = MsgType::kNumKeys}));
  EXPECT_EQ(s.recv_n(wire::kHelloBytes), hello());
  good_->set("late", "L");
  wire::Response value;
  value.type = MsgType::kValue;
  value.values = {"L"};
  wire::Response ok;
  ok.type = MsgType::kOk;
  wire::Response count;
  count.type = MsgType::kInteger;
  count.integer = 2;  // "late" and "p"
  std::string expected;
  wire::encode_response(value, expected);
  wire::encode_response(ok, expected);
  wire::encode_response(count, expected);
  EXPECT_EQ(s.recv_n(expected.size()), expected);
}

// Frames that arrive one by one while a get is parked (so a read is in
// flight when the get completes) are still served in order, and the
// connection keeps working afterwards.
TEST_F(BadInputTest, FramesArrivingWhileParkedAreServedInOrder) {
  RawSocket s(server_->port());
  s.send(
      hello() +
      request({.type = MsgType::kGet, .keys = {"late2"}, .timeout_ms = 5000}));
  EXPECT_EQ(s.recv_n(wire::kHelloBytes), hello());
  // Parked: this get and the bystander's wait.
  ASSERT_TRUE(
      testing::eventually([&] { return server_->num_waiting() == 2; }, 30s));
  s.send(request({.type = MsgType::kSet, .keys = {"q"}, .values = {"1"}}));
  ASSERT_TRUE(s.read_by_server());  // read while parked
  good_->set("late2", "L");
  wire::Response value;
  value.type = MsgType::kValue;
  value.values = {"L"};
  wire::Response ok;
  ok.type = MsgType::kOk;
  std::string expected;
  wire::encode_response(value, expected);
  wire::encode_response(ok, expected);
  EXPECT_EQ(s.recv_n(expected.size()), expected);
  s.send(request({.type = MsgType::kNumKeys}));
  wire::Response count;
  count.type = MsgType::kInteger;
  count.integer = 2;  // "late2" and "q"
  expected.clear();
  wire::encode_response(count, expected);
  EXPECT_EQ(s.recv_n(expected.size()), expected);
  EXPECT_EQ(log_.text(), "");
}

}  // namespace
}  // namespace dlaunch::comm::store
