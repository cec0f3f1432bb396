// The dl-store binary: announces its port, serves clients, stops on SIGTERM
// or SIGINT, and reports bad flags and bind failures.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "comm/store/token.h"
#include "comm/store/wire.h"
#include "tests/comm/store/store_test_util.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::comm::store {
namespace {

using namespace std::chrono_literals;
using testing::announced_port;
using testing::bin;
using ::testing::HasSubstr;
using testing::run;
using testing::spawn;

TEST(DlStoreTest, ServesOnTheAnnouncedPortUntilSigterm) {
  auto child = spawn({bin("dl-store"), "--host", "127.0.0.1", "--port", "0"});
  uint16_t port = announced_port(*child);
  ASSERT_NE(port, 0) << child->out();
  auto a = testing::connect_to(port);
  auto b = testing::connect_to(port);
  a->set("k", "v");
  EXPECT_EQ(b->get("k"), "v");
  child->signal(SIGTERM);
  EXPECT_EQ(child->wait(5s).exit_code, 0);
  EXPECT_THROW(b->get("k"), StoreError);
}

TEST(DlStoreTest, StopsOnSigint) {
  auto child = spawn({bin("dl-store"), "--host", "127.0.0.1", "--port", "0"});
  ASSERT_NE(announced_port(*child), 0) << child->out();
  child->signal(SIGINT);
  EXPECT_EQ(child->wait(5s).exit_code, 0);
}

TEST(DlStoreTest, BadFlagExitsTwoNamingIt) {
  auto bad = run({bin("dl-store"), "--port", "70000"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--port: '70000' is not valid; use a whole "
                                 "number from 0 to 65535"));
  auto unknown = run({bin("dl-store"), "--prot", "1"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("--prot"));
  // One line naming the range, not CLI11's "0.000000 to 1797693...".
  auto zero = run({bin("dl-store"), "--max-frame-bytes", "0"});
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_THAT(zero.err, HasSubstr("dl-store: --max-frame-bytes: '0' is not "
                                  "valid; use a whole number from 1 to "));
  EXPECT_EQ(std::count(zero.err.begin(), zero.err.end(), '\n'), 1) << zero.err;
}

TEST(DlStoreTest, PortInUseExitsOneNamingTheAddress) {
  auto server = testing::start_local_server();
  std::string port = std::to_string(server->port());
  auto r = run({bin("dl-store"), "--host", "127.0.0.1", "--port", port});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "dl-store: cannot bind store to 127.0.0.1:" + port +
                       ": address already in use\n");
}

// With --token-file (or DLAUNCH_RDZV_TOKEN) only clients that present the
// token read or write: one without it and one with another are refused
// before any request and see no key.
TEST(DlStoreTest, ATokenLocksOutClientsWithoutIt) {
  const std::string token = "dl-store-test-token-0123456789";
  ::dlaunch::testing::TempDir dir;
  ::dlaunch::testing::write_file(dir / "token", token + "\n", 0600);
  ::dlaunch::testing::CommandOptions from_env;
  from_env.argv = {bin("dl-store"), "--host", "127.0.0.1", "--port", "0"};
  from_env.env[kTokenEnv] = token;
  std::vector<std::unique_ptr<::dlaunch::testing::Subprocess>> stores;
  stores.push_back(spawn({bin("dl-store"), "--host", "127.0.0.1", "--port", "0",
                          "--token-file", (dir / "token").string()}));
  stores.push_back(std::make_unique<::dlaunch::testing::Subprocess>(from_env));
  for (auto& child : stores) {
    uint16_t port = announced_port(*child);
    ASSERT_NE(port, 0) << child->out() << child->err();
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.token = token;
    auto owner = TcpStore::connect(o);
    owner->set("k", "v");
    for (const std::string& other : {std::string(), token + "-not"}) {
      o.token = other;
      EXPECT_THROW(TcpStore::connect(o), StoreAuthError);
      wire::Request get;
      get.type = wire::MsgType::kGet;
      get.keys = {"k"};
      wire::Request set;
      set.type = wire::MsgType::kSet;
      set.keys = {"k"};
      set.values = {"overwritten"};
      for (const wire::Request& r : {get, set}) {
        testing::RawAnswer a = testing::raw_request(port, other, r);
        EXPECT_EQ(a.type, wire::MsgType::kError) << a.message;
        EXPECT_TRUE(a.closed);
      }
    }
    EXPECT_EQ(owner->get("k"), "v");
    EXPECT_EQ(owner->num_keys(), 1);
    child->signal(SIGTERM);
    auto end = child->wait(5s);
    EXPECT_EQ(end.exit_code, 0);
    EXPECT_THAT(end.err, HasSubstr("wrong token"));
    EXPECT_THAT(end.out + end.err, ::testing::Not(HasSubstr(token)));
  }
}

TEST(DlStoreTest, UnsafeOrBadTokenExitsTwo) {
  ::dlaunch::testing::TempDir dir;
  ::dlaunch::testing::write_file(dir / "token", "dl-store-test-token-0123\n",
                                 0644);
  auto open = run({bin("dl-store"), "--port", "0", "--token-file",
                   (dir / "token").string()});
  EXPECT_EQ(open.exit_code, 2);
  EXPECT_THAT(open.err, HasSubstr("has mode 0644"));
  EXPECT_THAT(open.err, HasSubstr("chmod 600 " + (dir / "token").string()));
  ::dlaunch::testing::CommandOptions o;
  o.argv = {bin("dl-store"), "--port", "0"};
  o.env[kTokenEnv] = "short";
  auto short_token = ::dlaunch::testing::run_command(o);
  EXPECT_EQ(short_token.exit_code, 2);
  EXPECT_THAT(short_token.err,
              HasSubstr("the store token in DLAUNCH_RDZV_TOKEN has 5 "
                        "characters"));
}

// Out of file descriptors, the server logs once, keeps serving the clients
// it has, and accepts again once descriptors free up.
TEST(DlStoreTest, SurvivesRunningOutOfFileDescriptors) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizer runtimes probe memory through a pipe(); with no
  // descriptor left they report false errors.
  GTEST_SKIP() << "not meaningful under sanitizers (they need free fds)";
#endif
  auto child = spawn({"/bin/sh", "-c",
                      "ulimit -n 32 && exec " + bin("dl-store") +
                          " --host 127.0.0.1 --port 0"});
  uint16_t port = announced_port(*child);
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<TcpStore>> clients;
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  // Long enough for a loaded machine's stall; the one refusal waits it out.
  o.connect_timeout = std::chrono::seconds(2);
  bool refused = false;
  while (!refused && clients.size() < 64) {
    try {
      clients.push_back(TcpStore::connect(o));
    } catch (const StoreError& e) {
      refused = true;
      EXPECT_THAT(e.what(), HasSubstr("unreachable after 2 s"));
    }
  }
  ASSERT_TRUE(refused) << "the fd limit never bit";
  EXPECT_GT(clients.size(), 10u);
  clients.front()->set("k", "v");
  EXPECT_EQ(clients.back()->get("k"), "v");
  clients.resize(clients.size() - 5);
  o.connect_timeout = std::chrono::seconds(10);
  EXPECT_EQ(TcpStore::connect(o)->get("k"), "v");
  child->signal(SIGTERM);
  auto result = child->wait(5s);
  EXPECT_EQ(result.exit_code, 0);
  const std::string& err = result.err;
  size_t lines = 0;
  for (size_t at = 0;
       (at = err.find("cannot accept connections", at)) != std::string::npos;
       ++at) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << err;
  EXPECT_THAT(err, HasSubstr("cannot accept connections: too many open "
                             "files; retrying every 100 ms"));
}

// An agent hosts the server and spawns workers: neither the listening socket
// nor any connection may leak into them.
TEST(StoreServerTest, SocketsAreNotInheritedByChildProcesses) {
  auto server = testing::start_local_server();
  auto client = testing::connect_to(server->port());
  client->set("k", "v");  // the server has accepted the connection
  auto ls = run({"/bin/sh", "-c", "ls -l /proc/$$/fd"});
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_THAT(ls.out, ::testing::Not(HasSubstr("socket:"))) << ls.out;
}

}  // namespace
}  // namespace dlaunch::comm::store
