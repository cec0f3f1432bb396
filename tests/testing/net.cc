#include "tests/testing/net.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "comm/store/resolve.h"

namespace dlaunch::testing {

int free_port() {
  std::string error;
  int port = comm::store::free_port(
      "127.0.0.1", std::chrono::steady_clock::now() + std::chrono::seconds(5),
      error);
  EXPECT_GT(port, 0) << error;
  return port;
}

}  // namespace dlaunch::testing
