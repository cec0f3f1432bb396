// Every TcpStore operation against a real StoreServer over loopback sockets,
// timeouts on both sides, connect errors and server shutdown.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "comm/store/wire.h"
#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using namespace std::chrono_literals;
using testing::connect_to;
using ::testing::HasSubstr;
using testing::ms_since;
using Clock = std::chrono::steady_clock;

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = testing::start_local_server();
    store_ = connect_to(server_->port());
  }
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<TcpStore> store_;
};

TEST_F(TcpStoreTest, ServerReportsTheKernelChosenPort) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(store_->address(), "127.0.0.1:" + std::to_string(server_->port()));
}

TEST_F(TcpStoreTest, SetGetOverwriteAndBinaryValues) {
  store_->set("a", "1");
  EXPECT_EQ(store_->get("a"), "1");
  store_->set("a", "two");
  EXPECT_EQ(store_->get("a"), "two");
  std::string binary("x\0y\xff", 4);
  store_->set("bin", binary);
  EXPECT_EQ(store_->get("bin"), binary);
  store_->set("empty", "");
  EXPECT_EQ(store_->get("empty"), "");
  std::string big(3 << 20, 'z');
  store_->set("big", big);
  EXPECT_EQ(store_->get("big"), big);
  auto other = connect_to(server_->port());
  EXPECT_EQ(other->get("a"), "two");
}

TEST_F(TcpStoreTest, GetBlocksUntilAnotherClientSets) {
  auto getter = std::async(std::launch::async, [&] {
    auto c = connect_to(server_->port());
    return c->get("later");
  });
  EXPECT_EQ(getter.wait_for(100ms), std::future_status::timeout);
  store_->set("later", "here");
  EXPECT_EQ(getter.get(), "here");
}

TEST_F(TcpStoreTest, GetTimesOutNamingTheKey) {
  store_->set_timeout(200ms);
  auto start = Clock::now();
  try {
    store_->get("missing");
    FAIL() << "get returned";
  } catch (const StoreTimeoutError& e) {
    EXPECT_STREQ(e.what(),
                 "timed out after 200 ms waiting for key 'missing' (0/1 "
                 "present)");
  }
  EXPECT_GE(ms_since(start), 200);
  EXPECT_LT(ms_since(start), 15000);  // hang guard, far below the defaults
  // The connection stays usable after a server-reported timeout.
  store_->set("missing", "now");
  EXPECT_EQ(store_->get("missing"), "now");
}

TEST_F(TcpStoreTest, AddCountsAtomicallyAcrossClients) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -7), -2);
  EXPECT_EQ(store_->get("n"), "-2");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto c = store_->clone();
      for (int i = 0; i < 500; ++i) c->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->add("counter", 0), 4000);
}

TEST_F(TcpStoreTest, AddOnANonIntegerIsAnErrorAndTheConnectionSurvives) {
  store_->set("word", "hello");
  EXPECT_THAT([&] { store_->add("word", 1); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("add: the value at key 'word' is not an integer")));
  store_->set(std::string("max"), std::to_string(INT64_MAX));
  EXPECT_THAT([&] { store_->add("max", 1); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("key 'max' would overflow int64")));
  EXPECT_EQ(store_->add("fine", 1), 1);
}

// An answer a client would refuse (over wire::kMaxResponseBytes) is refused
// by the server before it builds it (one multi_get of 17 copies of a 64 MiB
// value once made it build 1 GiB; 65 copies, over 4 GiB, aborted it).
TEST_F(TcpStoreTest, AnAnswerTooLargeToSendIsAnErrorAndTheServerLives) {
  const std::string big((64 << 20) - 64, 'v');
  store_->set("big", big);
  EXPECT_THAT([&] { store_->multi_get(std::vector<std::string>(17, "big")); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("multi_get: the answer would hold")));
  EXPECT_THAT([&] { store_->multi_get(std::vector<std::string>(17, "big")); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("MiB a response may carry; ask for fewer keys "
                            "per call")));
  EXPECT_EQ(store_->multi_get({"big", "big"}).size(), 2u);
  EXPECT_EQ(store_->get("big"), big);
}

// A wait naming one key many times registers once: a second waiter's
// timeout once scanned the first's copies once per copy (N^2), freezing
// the server's only thread.
TEST_F(TcpStoreTest, AWaitNamingAKeyManyTimesCostsOneRegistration) {
  const std::vector<std::string> keys(1000000, "x");
  auto first = std::async(std::launch::async, [&] {
    auto c = connect_to(server_->port());
    c->wait(keys, 60s);
  });
  testing::eventually([&] { return server_->num_waiting() == 1; }, 10s);
  auto second = connect_to(server_->port());
  const auto start = Clock::now();
  EXPECT_THROW(second->wait(keys, 1ms), StoreTimeoutError);
  // A liveness bound, not a speed check: the old cost was minutes.
  EXPECT_LT(ms_since(start), 20000);
  store_->set("x", "1");
  EXPECT_EQ(first.wait_for(10s), std::future_status::ready);
  first.get();
  EXPECT_EQ(server_->num_waiting(), 0);
}

TEST_F(TcpStoreTest, CompareSetFollowsTorch) {
  // Missing key, empty expected: stores desired.
  EXPECT_EQ(store_->compare_set("k", "", "v1"), "v1");
  EXPECT_EQ(store_->get("k"), "v1");
  // Matching expected: swaps.
  EXPECT_EQ(store_->compare_set("k", "v1", "v2"), "v2");
  // Wrong expected: unchanged, returns the current value.
  EXPECT_EQ(store_->compare_set("k", "nope", "v3"), "v2");
  EXPECT_EQ(store_->get("k"), "v2");
  // Missing key, non-empty expected: nothing stored, expected echoed.
  EXPECT_EQ(store_->compare_set("absent", "x", "y"), "x");
  EXPECT_FALSE(store_->check({"absent"}));
}

TEST_F(TcpStoreTest, WaitReturnsWhenAllKeysExist) {
  store_->set("a", "1");
  auto waiter = std::async(std::launch::async, [&] {
    auto c = connect_to(server_->port());
    c->wait({"a", "b", "c"}, 30s);
  });
  store_->set("b", "2");
  EXPECT_EQ(waiter.wait_for(100ms), std::future_status::timeout);
  store_->multi_set({"c"}, {"3"});
  waiter.get();
  store_->wait({});  // nothing to wait for
  store_->wait({"a"});
}

TEST_F(TcpStoreTest, WaitTimesOutNamingMissingKeysAndProgress) {
  store_->multi_set(
      {"rank_0", "rank_1", "rank_2", "rank_4", "rank_5", "rank_6"},
      {"", "", "", "", "", ""});
  std::vector<std::string> keys;
  for (int r = 0; r < 8; ++r) keys.push_back("rank_" + std::to_string(r));
  auto start = Clock::now();
  EXPECT_THAT([&] { store_->wait(keys, 300ms); },
              ::testing::ThrowsMessage<StoreTimeoutError>(::testing::StrEq(
                  "timed out after 300 ms waiting for keys 'rank_3','rank_7' "
                  "(6/8 present)")));
  EXPECT_GE(ms_since(start), 300);
  EXPECT_LT(ms_since(start), 15000);  // hang guard, far below the defaults
}

TEST_F(TcpStoreTest, TimeoutMessageListsTenMissingKeysAndCountsTheRest) {
  std::vector<std::string> keys;
  for (int i = 0; i < 25; ++i) keys.push_back("k" + std::to_string(i));
  EXPECT_THAT([&] { store_->wait(keys, 50ms); },
              ::testing::ThrowsMessage<StoreTimeoutError>(::testing::StrEq(
                  "timed out after 50 ms waiting for keys "
                  "'k0','k1','k2','k3','k4','k5','k6','k7','k8','k9' and 15 "
                  "more (0/25 present)")));
}

TEST_F(TcpStoreTest, WaitSurvivesAKeyDeletedBeforeTheOthersArrive) {
  auto waiter = std::async(std::launch::async, [&] {
    auto c = connect_to(server_->port());
    c->wait({"a", "b"}, 30s);
  });
  store_->set("a", "1");
  store_->delete_key("a");
  store_->set("b", "1");
  EXPECT_EQ(waiter.wait_for(150ms), std::future_status::timeout)
      << "wait returned although 'a' was deleted";
  store_->set("a", "again");
  waiter.get();
}

TEST_F(TcpStoreTest, CheckDeleteAndNumKeys) {
  EXPECT_EQ(store_->num_keys(), 0);
  EXPECT_TRUE(store_->check({}));
  EXPECT_FALSE(store_->check({"x"}));
  store_->set("x", "1");
  store_->set("y", "1");
  EXPECT_TRUE(store_->check({"x", "y"}));
  EXPECT_FALSE(store_->check({"x", "z"}));
  EXPECT_EQ(store_->num_keys(), 2);
  EXPECT_TRUE(store_->delete_key("x"));
  EXPECT_FALSE(store_->delete_key("x"));
  EXPECT_FALSE(store_->check({"x"}));
  EXPECT_EQ(store_->num_keys(), 1);
}

TEST_F(TcpStoreTest, MultiSetAndMultiGet) {
  store_->multi_set({"p", "q", "r"}, {"1", "", "3"});
  EXPECT_EQ(store_->multi_get({"r", "p", "q", "p"}),
            (std::vector<std::string>{"3", "1", "", "1"}));
  EXPECT_TRUE(store_->multi_get({}).empty());
  EXPECT_THROW(store_->multi_set({"a", "b"}, {"1"}), std::invalid_argument);
}

TEST_F(TcpStoreTest, MultiGetBlocksForTheLastKeyAndTimesOut) {
  auto getter = std::async(std::launch::async, [&] {
    auto c = connect_to(server_->port());
    return c->multi_get({"m1", "m2"});
  });
  store_->set("m1", "a");
  EXPECT_EQ(getter.wait_for(100ms), std::future_status::timeout);
  store_->set("m2", "b");
  EXPECT_EQ(getter.get(), (std::vector<std::string>{"a", "b"}));

  store_->set_timeout(100ms);
  EXPECT_THAT(
      [&] {
        store_->multi_get({"m1", "m3"});
      },
      ::testing::ThrowsMessage<StoreTimeoutError>(
          ::testing::StrEq("timed out after 100 ms waiting for keys 'm3' (1/2 "
                           "present)")));
}

TEST_F(TcpStoreTest, AppendCreatesThenExtends) {
  EXPECT_EQ(store_->append("log", "ab"), 2);
  EXPECT_EQ(store_->append("log", "cde"), 5);
  EXPECT_EQ(store_->get("log"), "abcde");
}

// A write that wakes a parked client answers its own request, not the
// waiter's: compare_set once answered "ok" here (the waiter's answer).
TEST_F(TcpStoreTest, WritesThatWakeWaitersGetTheirOwnAnswers) {
  for (int op = 0; op < 2; ++op) {
    std::string key = "woken" + std::to_string(op);
    auto waiter = std::async(std::launch::async, [&] {
      auto c = connect_to(server_->port());
      c->wait({key}, 10s);
      return c->get(key);
    });
    ASSERT_TRUE(
        testing::eventually([&] { return server_->num_waiting() == 1; }, 10s));
    if (op == 0) {
      EXPECT_EQ(store_->compare_set(key, "", "v"), "v");
    } else {
      EXPECT_EQ(store_->append(key, "v"), 1);
    }
    EXPECT_EQ(waiter.get(), "v");
  }
}

TEST_F(TcpStoreTest, AppendOnCloseWakesWaitersWhenTheClientGoes) {
  auto waiter = std::async(std::launch::async, [&] {
    auto c = connect_to(server_->port());
    c->wait({"gone"}, 10s);
    return c->get("gone");
  });
  auto dying = connect_to(server_->port());
  dying->append_on_close("gone", "node 1;", 0ms);
  dying->append_on_close("other", "x", 0ms);
  ASSERT_TRUE(
      testing::eventually([&] { return server_->num_waiting() == 1; }, 10s));
  EXPECT_FALSE(store_->check({"gone"}));  // not before it closes
  dying.reset();
  EXPECT_EQ(waiter.get(), "node 1;");
  EXPECT_EQ(store_->get("other"), "x");
}

TEST_F(TcpStoreTest, KeepAliveClosesASilentClientAndRunsItsAppends) {
  auto frozen = connect_to(server_->port());
  auto lively = connect_to(server_->port());
  frozen->append_on_close("frozen", "lost;", 200ms);
  // Far above its 50 ms pings: a stall of the test or the server's thread
  // must not close it.
  lively->append_on_close("lively", "lost;", 2000ms);
  // `lively` talks more often than its keep-alive; `frozen` says nothing.
  auto start = Clock::now();
  while (!store_->check({"frozen"})) {
    ASSERT_LT(ms_since(start), 10000) << "the silent client was never closed";
    lively->check({});
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(store_->get("frozen"), "lost;");
  EXPECT_FALSE(store_->check({"lively"}));
  EXPECT_THROW(frozen->check({}), StoreError);
}

TEST_F(TcpStoreTest, CloneIsANewConnectionWithTheSameTimeout) {
  store_->set_timeout(1234ms);
  auto c = store_->clone();
  EXPECT_EQ(c->timeout(), 1234ms);
  c->set("from-clone", "1");
  EXPECT_EQ(store_->get("from-clone"), "1");
}

TEST_F(TcpStoreTest, StopReleasesBlockedClientsWithAnError) {
  std::vector<std::future<std::string>> blocked;
  auto expect_error = [&](auto fn) {
    return std::async(std::launch::async, [&, fn]() -> std::string {
      auto c = connect_to(server_->port(), 60s);
      try {
        fn(*c);
      } catch (const StoreTimeoutError& e) {
        return std::string("timeout: ") + e.what();
      } catch (const StoreError& e) {
        // The connection is unusable from now on.
        try {
          c->set("x", "y");
        } catch (const StoreError& again) {
          return std::string(e.what()) + " | " + again.what();
        }
        return "set after the error succeeded";
      }
      return "returned";
    });
  };
  blocked.push_back(expect_error([](TcpStore& c) { c.get("never"); }));
  blocked.push_back(expect_error([](TcpStore& c) { c.wait({"never"}); }));
  blocked.push_back(expect_error([](TcpStore& c) {
    c.multi_get({"never", "x"});
  }));
  // All three are parked in the server (the fixture's client is not).
  ASSERT_TRUE(
      testing::eventually([&] { return server_->num_waiting() == 3; }, 10s));
  auto start = Clock::now();
  server_->stop();
  server_->stop();  // idempotent
  for (auto& f : blocked) {
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    std::string msg = f.get();
    EXPECT_THAT(msg, HasSubstr("lost connection to store 127.0.0.1:"));
    EXPECT_THAT(msg, HasSubstr("the server closed the connection"));
    EXPECT_THAT(msg, HasSubstr("is closed after an earlier error"));
  }
  EXPECT_LT(ms_since(start), 5000);
}

TEST(TcpStoreConnectTest, UnreachableServerFailsAfterTheConnectTimeout) {
  uint16_t port = testing::unused_port();
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 300ms;
  auto start = Clock::now();
  EXPECT_THAT([&] { TcpStore::connect(o); },
              ::testing::ThrowsMessage<StoreError>(::testing::StrEq(
                  "store 127.0.0.1:" + std::to_string(port) +
                  " unreachable after 300 ms (connection refused)")));
  EXPECT_GE(ms_since(start), 300);
  EXPECT_LT(ms_since(start), 15000);  // hang guard, far below the defaults
}

TEST(TcpStoreConnectTest, UnresolvableHostNamesTheResolverError) {
  TcpStoreOptions o;
  o.host = "no-such-host.invalid";
  o.port = 29400;
  o.connect_timeout = 50ms;
  EXPECT_THAT([&] { TcpStore::connect(o); },
              ::testing::ThrowsMessage<StoreError>(HasSubstr(
                  "store no-such-host.invalid:29400 unreachable after 50 ms "
                  "(cannot resolve host 'no-such-host.invalid': ")));
}

TEST(TcpStoreConnectTest, MissingHostOrPortFailsAtOnce) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  EXPECT_THAT([&] { TcpStore::connect(o); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr(
                  "store address '127.0.0.1:0' needs a host and a port")));
  o.host = "";
  o.port = 29400;
  EXPECT_THROW(TcpStore::connect(o), std::invalid_argument);
}

TEST(TcpStoreConnectTest, ConnectRetriesUntilTheServerStarts) {
  uint16_t port = testing::unused_port();
  // Asked between attempts: set once the first one has been refused.
  std::promise<void> refused;
  std::future<void> first_refusal = refused.get_future();
  std::atomic<bool> told{false};
  auto client = std::async(std::launch::async, [&] {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.connect_timeout = 30s;
    auto c = TcpStore::connect(o, [&] {
      if (!told.exchange(true)) refused.set_value();
      return false;
    });
    return c->get("ready");
  });
  // The server starts only after the client has been refused.
  ASSERT_EQ(first_refusal.wait_for(30s), std::future_status::ready);
  StoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  auto server = StoreServer::start(so);
  testing::connect_to(port)->set("ready", "yes");
  EXPECT_EQ(client.get(), "yes");
}

TEST(StoreServerTest, BindFailureNamesTheAddressAndReason) {
  auto first = testing::start_local_server();
  StoreServerOptions o;
  o.host = "127.0.0.1";
  o.port = first->port();
  EXPECT_THAT([&] { StoreServer::start(o); },
              ::testing::ThrowsMessage<StoreError>(::testing::StrEq(
                  "cannot bind store to 127.0.0.1:" +
                  std::to_string(first->port()) + ": address already in use")));
  o.host = "256.1.1.1";
  o.port = 0;
  EXPECT_THAT([&] { StoreServer::start(o); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("cannot bind store to 256.1.1.1:0: ")));
}

TEST(StoreServerTest, RaisesTheOpenFileSoftLimitToTheHardLimit) {
  rlimit lim{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  rlimit lowered = lim;
  lowered.rlim_cur = std::min<rlim_t>(lim.rlim_max, 256);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  auto server = testing::start_local_server();
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, lim.rlim_max);
}

// A server that handshakes and then never answers: the client's own deadline
// (the timeout plus a short grace) still ends the call.
TEST(TcpStoreSilentServerTest, ClientGivesUpOnItsOwnDeadline) {
  testing::RawListener listener;
  auto serve = std::async(std::launch::async, [&] {
    auto peer = listener.accept();
    peer->recv_n(wire::kHelloBytes);
    std::string hello;
    wire::encode_hello(wire::Hello{}, hello);
    peer->send(hello);
    peer->closed_by_peer();  // holds the connection open, silently
  });
  auto c = testing::connect_to(listener.port());
  auto start = Clock::now();
  std::string addr = "127.0.0.1:" + std::to_string(listener.port());
  EXPECT_THAT([&] { c->wait({"k"}, 100ms); },
              ::testing::ThrowsMessage<StoreTimeoutError>(::testing::StrEq(
                  "timed out after 100 ms waiting for key 'k' (store " + addr +
                  " did not answer)")));
  EXPECT_GE(ms_since(start), 100);
  EXPECT_LT(ms_since(start), 15000);  // hang guard, far below the defaults
  EXPECT_THAT([&] { c->num_keys(); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("is closed after an earlier error")));
  c.reset();
  serve.get();
}

TEST(TcpStoreHandshakeTest, OtherProtocolVersionFailsAtOnce) {
  testing::RawListener listener;
  auto serve = std::async(std::launch::async, [&] {
    auto peer = listener.accept();
    peer->recv_n(wire::kHelloBytes);
    std::string hello;
    wire::encode_hello(wire::Hello{wire::kMagic, wire::kVersion + 1}, hello);
    peer->send(hello);
  });
  std::string addr = "127.0.0.1:" + std::to_string(listener.port());
  EXPECT_THAT(
      [&] { testing::connect_to(listener.port()); },
      ::testing::ThrowsMessage<StoreError>(HasSubstr(
          "store " + addr + " speaks protocol version " +
          std::to_string(wire::kVersion + 1) + "; this client speaks version " +
          std::to_string(wire::kVersion))));
  serve.get();
}

TEST(TcpStoreHandshakeTest, NonStoreServerFailsAtOnce) {
  testing::RawListener listener;
  auto serve = std::async(std::launch::async, [&] {
    auto peer = listener.accept();
    peer->send("HTTP/1.1 400 Bad Request\r\n\r\n");
  });
  EXPECT_THAT([&] { testing::connect_to(listener.port()); },
              ::testing::ThrowsMessage<StoreError>(
                  HasSubstr("is not a dlaunch store (bad handshake)")));
  serve.get();
}

}  // namespace
}  // namespace dlaunch::comm::store
