#include "comm/gloo/store_adapter.h"

#include <algorithm>

#include "comm/process_group.h"

namespace dlaunch::comm::gloo {

StoreAdapter::StoreAdapter(std::shared_ptr<SharedStore> store,
                           std::string prefix,
                           std::chrono::milliseconds timeout,
                           std::function<std::string()> abandon)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      timeout_(timeout),
      abandon_(std::move(abandon)) {
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

void StoreAdapter::wait_keys(store::Store& s,
                             const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  if (!abandon_) return s.wait(keys, timeout);
  // Slices: a rank that died is found by abandon_ within one.
  // (A second: a late answer to a short wait would close the connection.)
  constexpr std::chrono::milliseconds kSlice(1000);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      return s.wait(keys,
                    std::clamp(left, std::chrono::milliseconds(1), kSlice));
    } catch (const store::StoreTimeoutError&) {
      if (left <= kSlice) throw;
    }
    if (std::string why = abandon_(); !why.empty()) throw CommError(why);
  }
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  std::string k = full(key);
  std::string v = with_store([&](store::Store& s) {
    wait_keys(s, {k}, timeout_);
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
  with_store([&](store::Store& s) {
    wait_keys(s, full_keys, std::min(timeout, timeout_));
  });
}

}  // namespace dlaunch::comm::gloo
