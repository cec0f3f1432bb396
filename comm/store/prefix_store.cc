#include "comm/store/prefix_store.h"

#include <utility>

#include "comm/check.h"

namespace dlaunch::comm::store {
namespace {

// Runs `fn` with the base store's timeout set to `t`, restoring it after:
// the base's blocking calls without a timeout argument read timeout().
template <typename Fn>
auto with_timeout(Store& base, std::chrono::milliseconds t, Fn fn) {
  struct Restore {
    Store& s;
    std::chrono::milliseconds old;
    ~Restore() { s.set_timeout(old); }
  } restore{base, base.timeout()};
  base.set_timeout(t);
  return fn();
}

}  // namespace

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  DLAUNCH_CHECK(base_ != nullptr, "PrefixStore needs a base store");
  timeout_ = base_->timeout();
}

std::string PrefixStore::scoped(std::string_view key) const {
  std::string out;
  out.reserve(prefix_.size() + 1 + key.size());
  out.append(prefix_).append("/").append(key);
  return out;
}

std::vector<std::string> PrefixStore::scoped(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(scoped(k));
  return out;
}

void PrefixStore::set(std::string_view key, std::string_view value) {
  base_->set(scoped(key), value);
}

std::string PrefixStore::get(std::string_view key) {
  return with_timeout(*base_, timeout_,
                      [&] { return base_->get(scoped(key)); });
}

int64_t PrefixStore::add(std::string_view key, int64_t delta) {
  return base_->add(scoped(key), delta);
}

std::string PrefixStore::compare_set(std::string_view key,
                                     std::string_view expected,
                                     std::string_view desired) {
  return base_->compare_set(scoped(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys,
                       std::chrono::milliseconds timeout) {
  base_->wait(scoped(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(scoped(keys));
}

bool PrefixStore::delete_key(std::string_view key) {
  return base_->delete_key(scoped(key));
}

int64_t PrefixStore::num_keys() { return base_->num_keys(); }

std::vector<std::string> PrefixStore::multi_get(
    const std::vector<std::string>& keys) {
  return with_timeout(*base_, timeout_,
                      [&] { return base_->multi_get(scoped(keys)); });
}

void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<std::string>& values) {
  base_->multi_set(scoped(keys), values);
}

int64_t PrefixStore::append(std::string_view key, std::string_view value) {
  return base_->append(scoped(key), value);
}

}  // namespace dlaunch::comm::store
