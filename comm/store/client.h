#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/wire.h"

namespace dlaunch::comm::store {

struct TcpStoreOptions {
  // Server host name or address. No default.
  std::string host;
  // Server port. No default (0 is not a valid port to connect to).
  uint16_t port = 0;
  // How long connect() keeps retrying an unreachable server before it throws
  // StoreError. Default 30 s.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  // The store's initial timeout(): bound on get/multi_get/wait(keys) and on
  // the server's answer to any request. Default 5 min.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // The job's token (comm/store/token.h), presented right after the hello.
  // A server started with a token refuses a connection without it or with
  // another (StoreAuthError). Default empty: none.
  std::string token{};
};

// A client connection to a StoreServer (torch's TCPStore client). Each call
// is one request and one response on a blocking socket, bounded by a
// deadline. Blocking calls (get, multi_get, wait) are timed out by the server,
// which reports how many keys were present; should the server not answer at
// all, the client gives up on its own shortly after the same deadline.
// After a lost connection or a client-side timeout the connection is closed
// and every later call throws StoreError; clone() opens a fresh one.
// One thread at a time; threads that block concurrently each use a clone().
class TcpStore : public Store {
 public:
  // Connects and handshakes, retrying with bounded back-off until
  // options.connect_timeout passes; then throws StoreError such as
  // "store 127.0.0.1:29400 unreachable after 30 s (connection refused)".
  // A server speaking another protocol version fails at once, and so does
  // one that refuses the token (StoreAuthError); an empty host or port 0
  // throws std::invalid_argument. `cancelled`, when given, is asked between
  // attempts (at least once a second): true gives up at once with StoreError
  // "... interrupted ...", as a Ctrl-C'd agent must.
  static std::unique_ptr<TcpStore> connect(
      const TcpStoreOptions& options,
      const std::function<bool()>& cancelled = {});

  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // A new connection to the same server with the same options and timeout().
  std::unique_ptr<TcpStore> clone() const;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  // For a missing key and a non-empty `expected`, nothing is stored and
  // `expected` is returned (torch's TCPStore does the same).
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
  // When this connection ends -- closed, its process dead, or silent for
  // `keep_alive` (zero: never) -- the server appends `value` to `key`,
  // waking whoever waits for the key: how agents learn at once that a peer
  // is gone. With a keep-alive, send something (check({})) more often.
  void append_on_close(std::string_view key, std::string_view value,
                       std::chrono::milliseconds keep_alive);

  // Thread-safe: makes a call blocked in another thread fail now
  // (StoreError), and every later call. For the owner of a thread parked
  // in wait() that must stop it; not to be raced with destruction.
  void interrupt();

  const TcpStoreOptions& options() const { return options_; }
  // "host:port", as used in messages.
  const std::string& address() const { return address_; }

 private:
  TcpStore(const TcpStoreOptions& options, int fd);

  // Sends request_ and returns the server's answer, which must be of type
  // `expected`. `wait` is the server-side timeout of a blocking request
  // (zero for the others). Throws StoreTimeoutError for kTimedOut, StoreError
  // for kError, a lost connection or a protocol violation.
  const wire::Response& call(wire::MsgType expected,
                             std::chrono::milliseconds wait);
  void set_keys(const std::vector<std::string>& keys);
  [[noreturn]] void fail(const std::string& why);
  void send_all(std::chrono::steady_clock::time_point deadline);
  // False when the deadline passed first.
  bool read_frame(std::chrono::steady_clock::time_point deadline,
                  wire::Frame& frame);
  [[noreturn]] void throw_timed_out(std::chrono::milliseconds wait,
                                    const wire::Response* response);

  TcpStoreOptions options_;
  std::string address_;
  int fd_ = -1;
  std::atomic<int> live_fd_{-1};  // fd_ for interrupt(), -1 once closed
  std::string broken_;            // why fd_ was closed
  std::string out_;
  std::vector<char> in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  size_t consumed_ = 0;  // bytes of the last response, dropped next call
  wire::Request request_;
  wire::Response response_;
  std::string error_;
};

}  // namespace dlaunch::comm::store
