#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store/store.h"

namespace dlaunch::comm::store {

// A view of another store whose keys all live under `prefix + "/"` (torch's
// PrefixStore): rendezvous rounds and process groups share one server without
// seeing each other's keys. Shares ownership of the base store. num_keys()
// counts the whole base store, as torch's does. Its timeout() starts as the
// base's and bounds get/multi_get/wait(keys) made through this view. Not
// thread-safe beyond what the base store allows.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

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

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string scoped(std::string_view key) const;
  std::vector<std::string> scoped(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace dlaunch::comm::store
