#include "comm/store/hash_store.h"

#include <charconv>
#include <stdexcept>

namespace dlaunch::comm::store {
namespace {

std::string missing_message(
    const std::vector<std::string>& keys,
    const std::map<std::string, std::string, std::less<>>& map,
    std::chrono::milliseconds timeout) {
  std::string missing;
  size_t present = 0;
  for (const auto& k : keys) {
    if (map.count(k)) {
      ++present;
      continue;
    }
    if (!missing.empty()) missing += ",";
    missing += "'" + k + "'";
  }
  return "HashStore: timed out after " + std::to_string(timeout.count()) +
         " ms waiting for keys " + missing + " (" + std::to_string(present) +
         "/" + std::to_string(keys.size()) + " present)";
}

}  // namespace

void HashStore::set(std::string_view key, std::string_view value) {
  {
    std::lock_guard lock(mu_);
    map_.insert_or_assign(std::string(key), std::string(value));
  }
  cv_.notify_all();
}

std::string HashStore::get(std::string_view key) {
  std::unique_lock lock(mu_);
  std::vector<std::string> keys{std::string(key)};
  wait_locked(lock, keys, timeout_);
  return map_.find(key)->second;
}

int64_t HashStore::add(std::string_view key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      const std::string& s = it->second;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
      if (ec != std::errc() || end != s.data() + s.size()) {
        throw StoreError("HashStore: add on key '" + std::string(key) +
                         "' whose value '" + s + "' is not an integer");
      }
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      throw StoreError("HashStore: add on key '" + std::string(key) +
                       "' would overflow int64");
    }
    map_.insert_or_assign(std::string(key), std::to_string(value));
  }
  cv_.notify_all();
  return value;
}

std::string HashStore::compare_set(std::string_view key,
                                   std::string_view expected,
                                   std::string_view desired) {
  std::string result;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      if (!expected.empty()) return std::string(expected);
      map_.emplace(std::string(key), std::string(desired));
      result = desired;
    } else {
      if (it->second == expected) it->second = desired;
      result = it->second;
    }
  }
  cv_.notify_all();
  return result;
}

void HashStore::wait(const std::vector<std::string>& keys,
                     std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  wait_locked(lock, keys, timeout);
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  auto all_present = [&] {
    for (const auto& k : keys) {
      if (!map_.count(k)) return false;
    }
    return true;
  };
  if (!cv_.wait_for(lock, timeout, all_present)) {
    throw StoreTimeoutError(missing_message(keys, map_, timeout));
  }
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  for (const auto& k : keys) {
    if (!map_.count(k)) return false;
  }
  return true;
}

bool HashStore::delete_key(std::string_view key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  map_.erase(it);
  return true;
}

int64_t HashStore::num_keys() {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(map_.size());
}

std::vector<std::string> HashStore::multi_get(
    const std::vector<std::string>& keys) {
  std::unique_lock lock(mu_);
  wait_locked(lock, keys, timeout_);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(map_.find(k)->second);
  return values;
}

void HashStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError("HashStore: multi_set with " +
                     std::to_string(keys.size()) + " keys but " +
                     std::to_string(values.size()) +
                     " values; pass one value per key");
  }
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      map_.insert_or_assign(keys[i], values[i]);
    }
  }
  cv_.notify_all();
}

int64_t HashStore::append(std::string_view key, std::string_view value) {
  int64_t size = 0;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      it = map_.emplace(std::string(key), std::string()).first;
    }
    it->second.append(value);
    size = static_cast<int64_t>(it->second.size());
  }
  cv_.notify_all();
  return size;
}

}  // namespace dlaunch::comm::store
