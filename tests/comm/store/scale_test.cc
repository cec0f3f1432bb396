// Scale: 1,000 clients blocked in wait on one key are all released by one
// set, and one dl-store serves 10,000 concurrent connections (all of them
// parked in wait on its single event-loop thread).

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "comm/store/wire.h"
#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::eventually;
using testing::ms_since;
using wire::MsgType;

// Raises the soft open-file limit so the test can hold `fds` descriptors;
// false when the hard limit does not allow it.
bool allow_fds(rlim_t fds) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_max < fds) return false;
  lim.rlim_cur = std::max(lim.rlim_cur, fds);
  return setrlimit(RLIMIT_NOFILE, &lim) == 0;
}

TEST(StoreScaleTest, ThousandWaitersReleasedByOneSet) {
  constexpr int kClients = 1000;
  ASSERT_TRUE(allow_fds(2 * kClients + 100));
  auto server = testing::start_local_server();
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(testing::connect_to(server->port()));
  }
  std::atomic<int> released{0};
  std::atomic<int> failed{0};
  // jthreads join on every way out; before that, `release` (declared
  // after them, so destroyed first) sets the key, so that a failed ASSERT
  // below fails the test instead of std::terminate()-ing with threads
  // running or waiting out their 30 s.
  std::vector<std::jthread> threads;
  struct Release {
    uint16_t port;
    ~Release() {
      try {
        testing::connect_to(port)->set("go", "");
      } catch (const std::exception&) {
        // The waiters then end at their own 30 s timeout.
      }
    }
  } release{server->port()};
  for (auto& c : clients) {
    threads.emplace_back([&, store = c.get()] {
      try {
        store->wait({"go"}, 30s);
        released.fetch_add(1);
      } catch (const StoreError&) {
        failed.fetch_add(1);
      }
    });
  }
  ASSERT_TRUE(eventually(
      [&] { return server->num_waiting() == size_t{kClients}; }, 20s))
      << server->num_waiting() << " of " << kClients << " parked";
  EXPECT_EQ(released.load(), 0);
  auto start = Clock::now();
  testing::connect_to(server->port())->set("go", "");
  for (auto& t : threads) t.join();
  std::printf("released %d waiters in %lld ms\n", kClients,
              static_cast<long long>(ms_since(start)));
  EXPECT_EQ(released.load(), kClients);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(server->num_waiting(), 0u);
}

// One raw connection driven by hand, so that a single thread can hold
// thousands of clients that are all blocked in wait.
std::string encoded(const wire::Request& r) {
  std::string out;
  wire::encode_request(r, out);
  return out;
}

TEST(StoreScaleTest, TenThousandConcurrentConnectionsOnOneDlStore) {
  constexpr int kClients = 10000;
  if (!allow_fds(kClients + 200)) {
    GTEST_SKIP() << "RLIMIT_NOFILE hard limit below " << kClients + 200;
  }
  // A separate process, so client and server sockets count against two
  // limits.
  auto child = testing::spawn(
      {testing::bin("dl-store"), "--host", "127.0.0.1", "--port", "0"});
  uint16_t port = testing::announced_port(*child);
  ASSERT_NE(port, 0) << child->out();

  // hello, add("arrived", 1), wait(["go"]): the add and the wait are handled
  // in one go, so once "arrived" reaches kClients every wait is parked.
  wire::Request add;
  add.type = MsgType::kAdd;
  add.keys = {"arrived"};
  add.delta = 1;
  wire::Request wait;
  wait.type = MsgType::kWait;
  wait.keys = {"go"};
  wait.timeout_ms = 60000;
  std::string opening;
  wire::encode_hello(wire::Hello{}, opening);
  opening += encoded(add) + encoded(wait);

  auto start = Clock::now();
  std::vector<std::unique_ptr<testing::RawSocket>> conns;
  for (int i = 0; i < kClients; ++i) {
    conns.push_back(std::make_unique<testing::RawSocket>(port));
    conns.back()->send(opening);
  }
  auto control = testing::connect_to(port);
  ASSERT_TRUE(
      eventually([&] { return control->add("arrived", 0) == kClients; }, 30s))
      << control->add("arrived", 0) << " of " << kClients << " arrived";
  std::printf("%d connections opened and parked in %lld ms\n", kClients,
              static_cast<long long>(ms_since(start)));

  control->set("go", "");
  std::string ok;
  wire::Response r;
  r.type = MsgType::kOk;
  wire::encode_response(r, ok);
  int answered = 0;
  for (auto& c : conns) {
    // hello + kInteger(n) + kOk
    std::string got = c->recv_n(wire::kHelloBytes + 13 + ok.size());
    if (got.size() == wire::kHelloBytes + 13 + ok.size() &&
        got.substr(got.size() - ok.size()) == ok) {
      ++answered;
    }
  }
  EXPECT_EQ(answered, kClients);
  conns.clear();
  child->signal(SIGTERM);
  auto result = child->wait(10s);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.err, "");
}

}  // namespace
}  // namespace dlaunch::comm::store
