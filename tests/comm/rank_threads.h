#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/init.h"
#include "comm/store/hash_store.h"

namespace dlaunch::comm::testing {

// The message of the CommError `f` throws, or "no CommError".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "no CommError";
}

// Runs `body(group)` on `n` threads, one gloo rank each, all joined through
// one in-process HashStore over real loopback TCP pairs. An exception that
// escapes a rank is reported as a test failure naming the rank.
inline void run_ranks(
    int n, const std::function<void(ProcessGroup&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  auto store = std::make_shared<store::HashStore>();
  store->set_timeout(timeout);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = make_process_group("gloo", store, r, n, timeout);
        body(*pg);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r << " of " << n;
  }
}

}  // namespace dlaunch::comm::testing
