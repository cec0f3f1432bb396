#pragma once

// Internal to server.cc and server_connections.cc (not a public header): the
// server's state (StoreServer::Impl) and one client connection (Connection).

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/store/server.h"
#include "comm/store/wire.h"

namespace dlaunch::comm::store {

// A connection's received request bytes. Not zeroed, and grown with
// realloc (a large block moves by remapping its pages, not by copying
// them): an idle connection costs only the pages it was sent, where a
// zero-filled 64 KiB vector cost all 16, and a large frame's growth no
// longer zeroes and copies each step. Throws std::bad_alloc.
class RequestBuffer {
 public:
  explicit RequestBuffer(size_t bytes) { resize(bytes); }
  ~RequestBuffer() { std::free(data_); }
  RequestBuffer(const RequestBuffer&) = delete;
  RequestBuffer& operator=(const RequestBuffer&) = delete;

  char* data() { return data_; }
  size_t size() const { return size_; }
  // Keeps the first min(bytes, size()) bytes; what is added is undefined.
  void resize(size_t bytes) {
    if (bytes == 0) {
      std::free(data_);
      data_ = nullptr;
    } else if (void* p = std::realloc(data_, bytes)) {
      data_ = static_cast<char*>(p);
    } else {
      throw std::bad_alloc();
    }
    size_ = bytes;
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::MsgType;

// Heterogeneous lookup: requests carry string_views into the read buffer, and
// looking a key up must not allocate a std::string.
struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const {
    return std::hash<std::string_view>{}(s);
  }
};
template <typename V>
using KeyMap = std::unordered_map<std::string, V, KeyHash, std::equal_to<>>;

class Connection;

// The server's state: the listening socket, the key-value map, the per-key
// waiter lists and the connection table, all touched only by the event-loop
// thread (stop() posts its work there). The atomics are the only members
// other threads read.
class StoreServer::Impl {
 public:
  explicit Impl(const StoreServerOptions& options)
      : options_(options),
        io_(1),
        acceptor_(io_),
        accept_retry_(io_),
        pause_note_(io_) {}

  void bind();
  void run() {
    thread_ = std::thread([this] { io_.run(); });
  }
  void stop();
  uint16_t port() const { return port_; }
  size_t num_connections() const { return num_connections_.load(); }
  size_t num_waiting() const { return num_waiting_.load(); }
  size_t buffered_bytes() const { return buffered_bytes_.load(); }
  std::map<std::string, size_t> peer_hosts();
  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(idle_mu_);
    return idle_cv_.wait_for(lock, timeout,
                             [this] { return num_connections_.load() == 0; });
  }

  // Called on the event-loop thread by connections.
  void handle(Connection& c, const wire::Request& r);
  // `c` completed its hello and token, or closed before: it no longer
  // counts against max_pending_connections.
  void admitted(Connection& c);
  void on_closed(Connection& c);
  void on_wait_timeout(Connection& c);
  size_t max_frame_bytes() const { return options_.max_frame_bytes; }
  const StoreServerOptions& options() const { return options_; }
  // Charges `bytes` of request buffer growth to the server's budget; false
  // (nothing charged) when that would exceed it.
  bool charge(size_t bytes) {
    if (bytes > options_.max_server_buffer_bytes - buffered_) return false;
    buffered_ += bytes;
    buffered_bytes_.store(buffered_, std::memory_order_relaxed);
    return true;
  }
  void release(size_t bytes) {
    buffered_ -= bytes;
    buffered_bytes_.store(buffered_, std::memory_order_relaxed);
  }

 private:
  void accept();
  void accept_ready();
  // A key that was absent now exists: wake the connections waiting on it.
  void key_created(std::string_view key);
  // Parks `c` until every key of its request exists or the timeout passes.
  void block(Connection& c, const wire::Request& r);
  // Rechecks a parked request whose keys all arrived; answers it, or parks it
  // again on keys deleted in the meantime.
  void try_complete(Connection& c);
  // Removes `c` from every waiter list; its parked request is over.
  void unpark(Connection& c);
  // Counts distinct keys of `keys` not present; registers `c` as a waiter on
  // each once.
  size_t register_missing(Connection& c, const std::vector<std::string>& keys);
  void respond_error(Connection& c, std::string message);
  // Appends `value` to `key` (created when missing, waking its waiters);
  // returns the new value.
  std::string& append(std::string_view key, std::string_view value);
  // Why appending `value` to `key` (by `op`) is refused: the value would
  // outgrow max_value_bytes. "" when it fits.
  std::string append_refused(const char* op, std::string_view key,
                             std::string_view value);
  std::string* find(std::string_view key) {
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : &it->second;
  }
  auto finder() {
    return [this](std::string_view k) { return find(k); };
  }

  StoreServerOptions options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  asio::steady_timer pause_note_;  // logs a lasting pause in accepting
  tcp protocol_ = tcp::v4();       // of the bound address, for accepted sockets
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;

  // Event-loop thread only from here on.
  KeyMap<std::string> data_;
  KeyMap<std::vector<Connection*>> waiters_;
  std::unordered_map<Connection*, std::shared_ptr<Connection>> connections_;
  wire::Response response_;  // scratch, reused for every response
  // Scratch for answering parked requests, which happens inside handle()
  // (a write wakes waiters) while response_ holds that request's answer.
  wire::Response wake_response_;
  uint64_t next_wait_id_ = 0;
  bool shutting_down_ = false;
  bool accept_failing_ = false;  // logged the current accept failure
  // Accepted connections still pending (Connection::pending()), and whether
  // accepting waits for one of them to leave that state.
  size_t pending_ = 0;
  bool accept_paused_ = false;
  uint64_t pauses_ = 0;  // pauses so far, the current one's number
  size_t buffered_ = 0;  // charged request-buffer growth
  // Written by the event loop, read by any thread.
  std::atomic<size_t> num_connections_{0};
  std::atomic<size_t> num_waiting_{0};
  std::atomic<size_t> buffered_bytes_{0};
  std::mutex idle_mu_;  // with idle_cv_: wait_idle() sleeps until 0 clients
  std::condition_variable idle_cv_;
};

// One client connection. Reads frames into a growing buffer, handles every
// complete frame in order and batches the responses into one write. While a
// blocking request (get/wait/multi_get) is parked, later frames stay
// buffered, so responses keep the order of requests; reading continues so a
// client that hangs up is noticed. The buffer grows only with bytes that
// arrived (never from a length announced in a header), within the
// connection's and the server's budgets; a deadline closes connections
// that never finish their hello or stall mid-request. Lives on the
// event-loop thread; owned by the server's connection table and by pending
// handlers.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // The client's address (no port); "unknown peer" when unknown.
  const std::string& peer_host() const { return peer_host_; }
  // A parked blocking request.
  struct Parked {
    MsgType type;
    std::vector<std::string> keys;
    size_t missing = 0;  // registrations in the server's waiter lists
    uint64_t id = 0;     // tells a stale timer expiry from the live one
  };

  Connection(StoreServer::Impl& server, tcp::socket socket);

  void start();

  // Closes a connection that sent nothing for keep_alive_: its peer is
  // frozen or cut off (a dead peer's kernel would have closed it).
  void arm_keep_alive(std::chrono::milliseconds after);

  // Closes the socket and drops any parked request; pending handlers finish
  // with operation_aborted. Idempotent.
  void close();

  // Bad input: one log line, then close.
  void reject(const std::string& why);

  void park(Parked p, std::chrono::milliseconds timeout);

  // The parked request was answered: resume handling buffered frames.
  void unparked();

  // append_on_close: what to append when this connection ends, and the
  // keep-alive that ends it when the client falls silent (0: none).
  void append_on_close(std::string_view key, std::string_view value,
                       std::chrono::milliseconds keep_alive);

  // Taken by the server when the connection closes.
  std::vector<std::pair<std::string, std::string>>& on_close() {
    return on_close_;
  }

  // Accepted, and not yet through its hello and token nor closed.
  bool pending() const { return pending_; }
  void set_admitted() { pending_ = false; }

  std::optional<Parked>& parked() { return parked_; }
  std::string& out() { return out_; }
  bool closed() const { return closed_; }

  // Starts writing what handlers appended to out(); one write in flight.
  void flush();

 private:
  void read();

  // Ensures `bytes` of free space after in_end_, compacting first and
  // growing (at most doubling, within the connection's budget) only when
  // the data already received needs it. Only while no read is in flight:
  // the read's buffer points into in_. False when the server's budget
  // refused the growth: the connection is closed.
  bool make_room(size_t bytes);

  // Handles every complete frame in the buffer unless a request is parked
  // or output is piling up, then writes the answers.
  void process();

  // Handles the frame (or handshake) at the front of the buffer. False when
  // it is incomplete or the connection was rejected.
  bool handle_next();

  // kAuth: the token, compared in constant time; never logged. A server
  // without a token accepts any (the client cannot know it has none).
  bool authenticate(const wire::Request& r);

  // Answers `why` as an error, then closes: an unauthenticated connection
  // gets no other answer, and sees no key.
  void refuse(const std::string& why);

  // Closes a connection that has not said hello within the handshake
  // timeout, or that holds part of a request and has sent nothing for the
  // idle timeout (slowloris); otherwise re-arms for what is left.
  void arm_deadline(std::chrono::milliseconds after);

  void on_deadline();

  bool handshake(const wire::Hello& hello);

  static std::string hex(uint32_t v);

  StoreServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;     // a parked request's timeout
  asio::steady_timer deadline_;  // handshake and idle deadlines
  asio::steady_timer keep_alive_timer_;
  std::chrono::milliseconds keep_alive_{0};
  std::vector<std::pair<std::string, std::string>> on_close_;
  std::string peer_;
  std::string peer_host_;  // peer_'s address alone
  RequestBuffer in_;
  size_t in_begin_ = 0;
  size_t in_end_ = 0;
  std::string out_;
  std::string writing_buf_;
  wire::Request request_;
  std::string error_;
  std::optional<Parked> parked_;
  std::chrono::steady_clock::time_point last_received_;
  bool deadline_armed_ = false;
  bool handshaken_ = false;
  bool authenticated_ = server_.options().token.empty();
  bool pending_ = true;
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool close_after_write_ = false;
};

}  // namespace dlaunch::comm::store
