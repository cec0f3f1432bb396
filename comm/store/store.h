#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch::comm::store {

// Any store failure: unreachable server, lost connection, protocol error.
class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store refused this client: it requires the job's token and the
// client presented none, or another one. Retrying cannot help.
class StoreAuthError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A blocking store call ran past its timeout. The message names the keys
// waited for, how many were present and the timeout.
class StoreTimeoutError : public StoreError {
 public:
  using StoreError::StoreError;
};

// A key-value store shared by the agents and workers of a job (torch's
// c10d::Store). Values are arbitrary bytes. Implementations: the TCP client
// (client.h) and PrefixStore (prefix_store.h). One instance may be used by one
// thread at a time unless the implementation says otherwise.
class Store {
 public:
  virtual ~Store() = default;

  virtual void set(std::string_view key, std::string_view value) = 0;
  // Blocks until `key` exists or timeout() passes (StoreTimeoutError).
  virtual std::string get(std::string_view key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (missing = 0) and
  // returns the new value.
  virtual int64_t add(std::string_view key, int64_t delta) = 0;
  // torch semantics: when `key` holds `expected` (a missing key matches an
  // empty `expected`), stores `desired`. Returns the value held afterwards.
  virtual std::string compare_set(std::string_view key,
                                  std::string_view expected,
                                  std::string_view desired) = 0;
  // Blocks until every key exists; StoreTimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) = 0;
  // True when every key exists right now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns true when the key existed.
  virtual bool delete_key(std::string_view key) = 0;
  virtual int64_t num_keys() = 0;
  // Blocks like get() until all keys exist; values in the order of `keys`.
  virtual std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) = 0;
  // Appends to the value at `key` (created when missing); returns the new
  // length in bytes.
  virtual int64_t append(std::string_view key, std::string_view value) = 0;

  // wait() with the store's own timeout.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  // Bound on get/multi_get/wait without an explicit timeout.
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

}  // namespace dlaunch::comm::store
