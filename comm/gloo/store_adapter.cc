#include "comm/gloo/store_adapter.h"

namespace dlaunch::comm::gloo {

StoreAdapter::StoreAdapter(std::shared_ptr<SharedStore> store,
                           std::string prefix,
                           std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {
  if (store_->clone) {
    own_ = store_->clone();
    own_->set_timeout(timeout_);
  }
}

std::string StoreAdapter::full(const std::string& key) const {
  return prefix_ + "/" + key;
}

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  with_store([&](store::Store& s) {
    s.set(full(key), std::string_view(data.data(), data.size()));
  });
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  std::string k = full(key);
  std::string v = with_store([&](store::Store& s) {
    s.wait({k}, timeout_);
    return s.get(k);
  });
  return std::vector<char>(v.begin(), v.end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void StoreAdapter::wait(const std::vector<std::string>& keys,
                        const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (const auto& k : keys) full_keys.push_back(full(k));
  with_store(
      [&](store::Store& s) { s.wait(full_keys, std::min(timeout, timeout_)); });
}

}  // namespace dlaunch::comm::gloo
