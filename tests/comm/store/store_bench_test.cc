// dl-store-bench runs end to end and prints the documented lines (a smoke
// test: no timing is asserted).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/comm/store/store_test_util.h"

namespace dlaunch::comm::store {
namespace {

using testing::bin;
using ::testing::MatchesRegex;
using testing::run;

TEST(StoreBenchTest, OpsPrintRateAndLatenciesWithEitherDriver) {
  for (const char* driver : {"threads", "loop"}) {
    for (const char* op : {"set", "get", "add"}) {
      SCOPED_TRACE(std::string(driver) + " " + op);
      auto r = run({bin("dl-store-bench"), "--driver", driver, "--clients", "4",
                    "--requests", "200", "--op", op});
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_THAT(r.out, MatchesRegex(std::string(op) +
                                      ": [0-9]+ req/s, p50 [0-9.]+ us, p99 "
                                      "[0-9.]+ us\n"));
    }
  }
}

TEST(StoreBenchTest, BarrierAgainstARunningServer) {
  auto server = testing::start_local_server();
  auto r = run({bin("dl-store-bench"), "--addr",
                "127.0.0.1:" + std::to_string(server->port()), "--clients",
                "16", "--op", "barrier", "--rounds", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out,
              MatchesRegex("barrier: 16 clients in [0-9.]+ ms \\(median of 3 "
                           "rounds, max [0-9.]+ ms\\)\n"));
}

TEST(StoreBenchTest, BadArgumentsExitTwo) {
  auto addr = run({bin("dl-store-bench"), "--addr", "localhost"});
  EXPECT_EQ(addr.exit_code, 2);
  EXPECT_EQ(addr.err,
            "dl-store-bench: --addr 'localhost' is not HOST:PORT with a port "
            "in 1..65535\n");
  auto barrier =
      run({bin("dl-store-bench"), "--driver", "loop", "--op", "barrier"});
  EXPECT_EQ(barrier.exit_code, 2);
  EXPECT_EQ(barrier.err,
            "dl-store-bench: --op barrier needs --driver threads\n");
}

}  // namespace
}  // namespace dlaunch::comm::store
