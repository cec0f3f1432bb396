#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace dlaunch::comm::gloo {

// A dlaunch Store shared by every group derived from one world group; the
// mutex serialises the groups' calls (a Store instance is single-threaded).
struct SharedStore {
  std::mutex mu;
  std::shared_ptr<store::Store> store;
  std::shared_ptr<void> owned;  // e.g. the store server rank 0 hosts
};

// Gloo's rendezvous store over a dlaunch Store, with every key under
// "<prefix>/". Gloo's connectFullMesh calls get() without wait(), so get()
// blocks until the key exists, bounded by `timeout`. Used by one thread (the
// one creating a group).
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<SharedStore> store, std::string prefix,
               std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string full(const std::string& key) const;

  std::shared_ptr<SharedStore> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dlaunch::comm::gloo
