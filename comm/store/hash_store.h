#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store/store.h"

namespace dlaunch::comm::store {

// An in-process Store (torch's HashStore): a map guarded by a mutex, with a
// condition variable that wakes get/wait when keys arrive. Shared by several
// threads (one per rank in tests); unlike other stores, one instance may be
// used by any number of threads at once. get/multi_get/wait block at most
// timeout() / the given timeout and then throw StoreTimeoutError naming the
// missing keys.
class HashStore : public Store {
 public:
  HashStore() = default;
  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  int64_t num_keys() override;
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  int64_t append(std::string_view key, std::string_view value) override;

 private:
  // Waits with mu_ held until every key exists or `timeout` passes.
  void wait_locked(std::unique_lock<std::mutex>& lock,
                   const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout);

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string, std::less<>> map_;
};

}  // namespace dlaunch::comm::store
