#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace dlaunch::comm::gloo {

// The dlaunch Store shared by every group derived from one world group.
// Groups may be created from several threads at once, so a rendezvous that
// blocks must not hold a lock others need: it uses its own connection
// (`clone`) when the store can make one, the store itself when it is
// thread-safe, and only otherwise serialises on `mu`.
struct SharedStore {
  std::mutex mu;  // guards `store` unless it is thread-safe
  std::shared_ptr<store::Store> store;
  bool thread_safe = false;  // HashStore, FileStore
  // Opens another connection to the same store (TcpStore::clone); empty
  // when the store cannot.
  std::function<std::shared_ptr<store::Store>()> clone;
  std::shared_ptr<void> owned;  // e.g. the store server rank 0 hosts
};

// Gloo's rendezvous store over a dlaunch Store, with every key under
// "<prefix>/". Gloo's connectFullMesh calls get() without wait(), so get()
// blocks until the key exists, bounded by `timeout`. Used by one thread (the
// one creating a group), through its own connection where SharedStore can
// make one.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  // `abandon`, when given, is asked between slices of every wait: a
  // non-empty answer (why the group cannot form: a rank is gone) ends the
  // wait with a CommError of that text, not at `timeout`.
  StoreAdapter(std::shared_ptr<SharedStore> store, std::string prefix,
               std::chrono::milliseconds timeout,
               std::function<std::string()> abandon = {});

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string full(const std::string& key) const;
  // s.wait(keys, timeout), in slices when `abandon_` is set.
  void wait_keys(store::Store& s, const std::vector<std::string>& keys,
                 std::chrono::milliseconds timeout);

  // Runs f(store) with whatever exclusion the store needs.
  template <class F>
  auto with_store(F&& f) {
    if (own_) return f(*own_);
    if (store_->thread_safe) return f(*store_->store);
    std::lock_guard lock(store_->mu);
    return f(*store_->store);
  }

  std::shared_ptr<SharedStore> store_;
  std::shared_ptr<store::Store> own_;  // this adapter's connection, if any
  std::string prefix_;
  std::chrono::milliseconds timeout_;
  std::function<std::string()> abandon_;
};

}  // namespace dlaunch::comm::gloo
