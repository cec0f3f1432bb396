// dl-store-bench runs end to end and prints the documented lines (a smoke
// test: no timing is asserted).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using testing::bin;
using testing::Child;
using ::testing::MatchesRegex;

TEST(StoreBenchTest, OpsPrintRateAndLatencies) {
  for (const char* op : {"set", "get", "add"}) {
    Child child({bin("dl-store-bench"), "--clients", "4", "--requests", "200",
                 "--op", op});
    EXPECT_THAT(child.read_line(),
                MatchesRegex(std::string(op) +
                             ": [0-9]+ req/s, p50 [0-9.]+ us, p99 [0-9.]+ us"));
    EXPECT_EQ(child.wait(), 0);
  }
}

TEST(StoreBenchTest, LoopDriverPrintsTheSameLine) {
  for (const char* op : {"set", "get", "add"}) {
    Child child({bin("dl-store-bench"), "--driver", "loop", "--clients", "4",
                 "--requests", "200", "--op", op});
    EXPECT_THAT(child.read_line(),
                MatchesRegex(std::string(op) +
                             ": [0-9]+ req/s, p50 [0-9.]+ us, p99 [0-9.]+ us"));
    EXPECT_EQ(child.wait(), 0);
  }
  Child barrier({bin("dl-store-bench"), "--driver", "loop", "--op", "barrier"});
  EXPECT_EQ(barrier.wait(), 2);
  EXPECT_EQ(barrier.read_stderr(),
            "dl-store-bench: --op barrier needs --driver threads\n");
}

TEST(StoreBenchTest, BarrierAgainstARunningServer) {
  auto server = testing::start_local_server();
  Child child({bin("dl-store-bench"), "--addr",
               "127.0.0.1:" + std::to_string(server->port()), "--clients", "16",
               "--op", "barrier", "--rounds", "3"});
  EXPECT_THAT(child.read_line(),
              MatchesRegex("barrier: 16 clients in [0-9.]+ ms \\(median of 3 "
                           "rounds, max [0-9.]+ ms\\)"));
  EXPECT_EQ(child.wait(), 0);
}

TEST(StoreBenchTest, BadAddressExitsTwo) {
  Child child({bin("dl-store-bench"), "--addr", "localhost", "--op", "set"});
  EXPECT_EQ(child.wait(), 2);
  EXPECT_EQ(child.read_stderr(),
            "dl-store-bench: --addr 'localhost' is not HOST:PORT with a port "
            "in 1..65535\n");
}

}  // namespace
}  // namespace dlaunch::comm::store
