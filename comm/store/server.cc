#include "comm/store/server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/check.h"
#include "comm/store/store.h"
#include "comm/store/text.h"
#include "comm/store/token.h"

namespace dlaunch::comm::store {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::MsgType;

namespace {

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

// Reads are issued into at least this much free buffer space (less only
// near the connection's budget).
constexpr size_t kMinReadBytes = 16 * 1024;
// Every connection's own request buffer; growth past it is charged to the
// server's budget (StoreServerOptions::max_server_buffer_bytes).
constexpr size_t kInitialBufferBytes = 64 * 1024;
// Buffers grown past this by a large frame are given back once drained.
constexpr size_t kShrinkAboveBytes = size_t{1} << 20;
// A connection with this much output not yet written is not read from or
// served until the client reads: a client that sends without reading
// cannot make the server buffer without bound.
constexpr size_t kOutputHighWaterBytes = size_t{4} << 20;
// A server-side wait longer than this is clamped (steady_timer overflows
// near the top of its range; nobody waits a year for a key).
constexpr uint64_t kMaxWaitMs = uint64_t{365} * 24 * 3600 * 1000;

void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      spdlog::warn("store: cannot raise the open-file limit to {}: {}",
                   lim.rlim_max, errno_text(errno));
    }
  }
}

}  // namespace

class Connection;

// The server's state: the listening socket, the key-value map, the per-key
// waiter lists and the connection table, all touched only by the event-loop
// thread (stop() posts its work there). The atomics are the only members
// other threads read.
class StoreServer::Impl {
 public:
  explicit Impl(const StoreServerOptions& options)
      : options_(options), io_(1), acceptor_(io_), accept_retry_(io_) {}

  void bind();
  void run() {
    thread_ = std::thread([this] { io_.run(); });
  }
  void stop();
  uint16_t port() const { return port_; }
  size_t num_connections() const { return num_connections_.load(); }
  size_t num_waiting() const { return num_waiting_.load(); }
  size_t buffered_bytes() const { return buffered_bytes_.load(); }
  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(idle_mu_);
    return idle_cv_.wait_for(lock, timeout,
                             [this] { return num_connections_.load() == 0; });
  }

  // Called on the event-loop thread by connections.
  void handle(Connection& c, const wire::Request& r);
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
  // Counts keys of `keys` not present; registers `c` as a waiter on them.
  size_t register_missing(Connection& c, const std::vector<std::string>& keys);
  void respond_error(Connection& c, std::string message);
  // Appends `value` to `key` (created when missing, waking its waiters);
  // returns the new value.
  std::string& append(std::string_view key, std::string_view value);
  std::string* find(std::string_view key) {
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : &it->second;
  }

  StoreServerOptions options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  tcp protocol_ = tcp::v4();  // of the bound address, for accepted sockets
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
  size_t buffered_ = 0;          // charged request-buffer growth
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
  // A parked blocking request.
  struct Parked {
    MsgType type;
    std::vector<std::string> keys;
    size_t missing = 0;  // registrations in the server's waiter lists
    uint64_t id = 0;     // tells a stale timer expiry from the live one
  };

  Connection(StoreServer::Impl& server, tcp::socket socket)
      : server_(server),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        deadline_(socket_.get_executor()),
        keep_alive_timer_(socket_.get_executor()),
        in_(kInitialBufferBytes),
        last_received_(std::chrono::steady_clock::now()) {
    boost::system::error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? "unknown peer"
               : ep.address().to_string() + ":" + std::to_string(ep.port());
    socket_.set_option(tcp::no_delay(true), ec);
  }

  void start() {
    arm_deadline(server_.options().handshake_timeout);
    read();
  }

  // Closes a connection that sent nothing for keep_alive_: its peer is
  // frozen or cut off (a dead peer's kernel would have closed it).
  void arm_keep_alive(std::chrono::milliseconds after) {
    keep_alive_timer_.expires_after(after);
    keep_alive_timer_.async_wait(
        [self = shared_from_this()](const boost::system::error_code& ec) {
          if (ec || self->closed_) return;
          auto silent = std::chrono::steady_clock::now() - self->last_received_;
          if (silent < self->keep_alive_) {
            self->arm_keep_alive(
                std::chrono::duration_cast<std::chrono::milliseconds>(
                    self->keep_alive_ - silent) +
                std::chrono::milliseconds(1));
            return;
          }
          spdlog::warn(
              "store: closing connection from {}: silent for {} ms, past its "
              "keep-alive",
              self->peer_,
              std::chrono::duration_cast<std::chrono::milliseconds>(silent)
                  .count());
          self->close();
        });
  }

  // Closes the socket and drops any parked request; pending handlers finish
  // with operation_aborted. Idempotent.
  void close() {
    if (closed_) return;
    auto self = shared_from_this();
    closed_ = true;
    boost::system::error_code ec;
    timer_.cancel();
    deadline_.cancel();
    keep_alive_timer_.cancel();
    socket_.close(ec);
    server_.release(in_.size() - kInitialBufferBytes);
    std::vector<char>().swap(in_);
    in_begin_ = in_end_ = 0;
    server_.on_closed(*this);
  }

  // Bad input: one log line, then close.
  void reject(const std::string& why) {
    spdlog::warn("store: closing connection from {}: {}", peer_, why);
    close();
  }

  void park(Parked p, std::chrono::milliseconds timeout) {
    parked_ = std::move(p);
    timer_.expires_after(timeout);
    timer_.async_wait([self = shared_from_this(),
                       id = parked_->id](const boost::system::error_code& ec) {
      if (ec || self->closed_ || !self->parked_ || self->parked_->id != id)
        return;
      self->server_.on_wait_timeout(*self);
    });
  }

  // The parked request was answered: resume handling buffered frames.
  void unparked() {
    parked_.reset();
    timer_.cancel();
    if (closed_) return;
    // Frames that arrived while parked are handled from a fresh handler, not
    // from inside another connection's request.
    if (in_end_ > in_begin_) {
      asio::post(socket_.get_executor(), [self = shared_from_this()] {
        self->process();
        self->read();
      });
    } else {
      read();
    }
  }

  // append_on_close: what to append when this connection ends, and the
  // keep-alive that ends it when the client falls silent (0: none).
  void append_on_close(std::string_view key, std::string_view value,
                       std::chrono::milliseconds keep_alive) {
    on_close_.emplace_back(key, value);
    if (keep_alive.count() > 0 &&
        (keep_alive_.count() == 0 || keep_alive < keep_alive_)) {
      keep_alive_ = keep_alive;
      arm_keep_alive(keep_alive_);
    }
  }
  // Taken by the server when the connection closes.
  std::vector<std::pair<std::string, std::string>>& on_close() {
    return on_close_;
  }

  std::optional<Parked>& parked() { return parked_; }
  std::string& out() { return out_; }
  bool closed() const { return closed_; }

  // Starts writing what handlers appended to out(); one write in flight.
  void flush() {
    if (writing_ || closed_ || out_.empty()) return;
    writing_ = true;
    std::swap(out_, writing_buf_);
    asio::async_write(socket_, asio::buffer(writing_buf_),
                      [self = shared_from_this()](
                          const boost::system::error_code& ec, size_t) {
                        self->writing_ = false;
                        if (self->writing_buf_.capacity() > kShrinkAboveBytes) {
                          std::string().swap(self->writing_buf_);
                        }
                        self->writing_buf_.clear();
                        if (ec) return self->close();
                        if (self->close_after_write_ && self->out_.empty())
                          return self->close();
                        // Output drained: serve what the high-water mark
                        // held back, and write what is pending.
                        self->process();
                        self->read();
                      });
  }

 private:
  void read() {
    if (reading_ || closed_ || close_after_write_) return;
    // Back-pressure: the connection's budget buffered (requests behind a
    // parked one), or output piling up unread, stops reading until that
    // clears. A frame the server accepts always fits in the budget.
    const size_t budget = server_.options().max_connection_buffer_bytes;
    const size_t buffered = in_end_ - in_begin_;
    if (buffered >= budget) return;
    if (out_.size() >= kOutputHighWaterBytes) return;
    if (in_.size() - in_end_ < kMinReadBytes &&
        !make_room(std::min(kMinReadBytes, budget - buffered))) {
      return;
    }
    reading_ = true;
    size_t room = std::min(in_.size() - in_end_, budget - buffered);
    socket_.async_read_some(
        asio::buffer(in_.data() + in_end_, room),
        [self = shared_from_this()](const boost::system::error_code& ec,
                                    size_t n) {
          self->reading_ = false;
          if (self->closed_) return;
          if (ec) {
            if (ec != asio::error::eof && ec != asio::error::connection_reset) {
              spdlog::warn("store: closing connection from {}: {}", self->peer_,
                           lower_first(ec.message()));
              return self->close();
            }
            if (self->in_end_ > self->in_begin_ && !self->parked_ &&
                self->out_.size() < kOutputHighWaterBytes) {
              return self->reject(
                  "truncated frame: peer closed the connection with " +
                  std::to_string(self->in_end_ - self->in_begin_) +
                  " bytes of an incomplete " +
                  (self->handshaken_ ? "frame" : "handshake") + " buffered");
            }
            return self->close();
          }
          self->in_end_ += n;
          self->last_received_ = std::chrono::steady_clock::now();
          self->process();
          self->read();
        });
  }

  // Ensures `bytes` of free space after in_end_, compacting first and
  // growing (at most doubling, within the connection's budget) only when
  // the data already received needs it. Only while no read is in flight:
  // the read's buffer points into in_. False when the server's budget
  // refused the growth: the connection is closed.
  bool make_room(size_t bytes) {
    if (in_begin_ > 0) {
      std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
      in_end_ -= in_begin_;
      in_begin_ = 0;
    }
    if (in_.size() - in_end_ >= bytes) return true;
    size_t want = std::min(
        std::max(in_.size() * 2, in_end_ + bytes),
        std::max(server_.options().max_connection_buffer_bytes, in_.size()));
    if (!server_.charge(want - in_.size())) {
      reject("buffered requests would exceed the server's budget of " +
             std::to_string(server_.options().max_server_buffer_bytes) +
             " bytes (max_server_buffer_bytes) with " +
             std::to_string(in_end_) + " bytes of this connection's pending");
      return false;
    }
    in_.resize(want);
    return true;
  }

  // Handles every complete frame in the buffer unless a request is parked
  // or output is piling up, then writes the answers.
  void process() {
    while (!closed_ && !close_after_write_ && !parked_ &&
           out_.size() < kOutputHighWaterBytes && handle_next()) {
    }
    // Rewind (and shrink) a drained buffer, unless a read in flight is
    // filling it at in_end_.
    if (!closed_ && !reading_ && in_begin_ == in_end_) {
      in_begin_ = in_end_ = 0;
      if (in_.size() > kShrinkAboveBytes) {
        server_.release(in_.size() - kInitialBufferBytes);
        std::vector<char>(kInitialBufferBytes).swap(in_);
      }
    }
    // Part of a request waits for the client: its idle deadline runs.
    if (!closed_ && handshaken_ && !parked_ && in_end_ > in_begin_ &&
        !deadline_armed_) {
      arm_deadline(server_.options().request_idle_timeout);
    }
    flush();
  }

  // Handles the frame (or handshake) at the front of the buffer. False when
  // it is incomplete or the connection was rejected.
  bool handle_next() {
    std::string_view avail(in_.data() + in_begin_, in_end_ - in_begin_);
    if (!handshaken_) {
      wire::Hello hello;
      if (wire::decode_hello(avail, hello) == wire::DecodeStatus::kNeedMore) {
        return false;
      }
      in_begin_ += wire::kHelloBytes;
      return handshake(hello);
    }
    wire::Frame frame;
    // Before the token, a frame can only be a small kAuth: a stranger
    // cannot make the server buffer more.
    const size_t limit = authenticated_
                             ? server_.max_frame_bytes()
                             : wire::kMaxTokenBytes + wire::kFrameHeaderBytes;
    switch (wire::next_frame(avail, limit, frame, error_)) {
      case wire::DecodeStatus::kNeedMore:
        // The buffer grows as the rest arrives (read()), not from the
        // length in the header: a header alone costs the server nothing.
        return false;
      case wire::DecodeStatus::kBad:
        reject(error_);
        return false;
      case wire::DecodeStatus::kOk:
        break;
    }
    if (wire::decode_request(frame, request_, error_) !=
        wire::DecodeStatus::kOk) {
      reject(error_);
      return false;
    }
    in_begin_ += frame.size;
    if (request_.type == MsgType::kAuth) return authenticate(request_);
    if (!authenticated_) {
      refuse(
          "the job's token is required before any request (the client "
          "sent " +
          wire::msg_type_name(request_.type) + " first)");
      return false;
    }
    server_.handle(*this, request_);
    return true;
  }

  // kAuth: the token, compared in constant time; never logged. A server
  // without a token accepts any (the client cannot know it has none).
  bool authenticate(const wire::Request& r) {
    const std::string& token = server_.options().token;
    if (!authenticated_ && !token_matches(token, r.values[0])) {
      refuse(r.values[0].empty() ? "the job's token is required (the client "
                                   "presented none)"
                                 : "wrong token");
      return false;
    }
    if (!authenticated_) {
      authenticated_ = true;
      // The token came in time; an idle deadline starts when a request is
      // incomplete (process()).
      deadline_.cancel();
      deadline_armed_ = false;
    }
    wire::Response ok;
    ok.type = MsgType::kOk;
    wire::encode_response(ok, out_);
    return true;
  }

  // Answers `why` as an error, then closes: an unauthenticated connection
  // gets no other answer, and sees no key.
  void refuse(const std::string& why) {
    spdlog::warn("store: closing connection from {}: {}", peer_, why);
    wire::Response error;
    error.type = MsgType::kError;
    error.message = why;
    wire::encode_response(error, out_);
    close_after_write_ = true;
  }

  // Closes a connection that has not said hello within the handshake
  // timeout, or that holds part of a request and has sent nothing for the
  // idle timeout (slowloris); otherwise re-arms for what is left.
  void arm_deadline(std::chrono::milliseconds after) {
    deadline_armed_ = true;
    deadline_.expires_after(after);
    deadline_.async_wait(
        [self = shared_from_this()](const boost::system::error_code& ec) {
          if (ec || self->closed_) return;
          self->deadline_armed_ = false;
          self->on_deadline();
        });
  }

  void on_deadline() {
    const StoreServerOptions& o = server_.options();
    const size_t held = in_end_ - in_begin_;
    if (!handshaken_) {
      return reject("no handshake within " +
                    format_duration(o.handshake_timeout) + " (" +
                    std::to_string(held) + " of its " +
                    std::to_string(wire::kHelloBytes) + " bytes received)");
    }
    if (!authenticated_) {
      return reject("no token within " + format_duration(o.handshake_timeout) +
                    " (the store requires the job's token)");
    }
    // Only while the server waits on the client for the rest of a request.
    if (parked_ || held == 0) return;
    auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - last_received_);
    if (!reading_ || idle < o.request_idle_timeout) {
      return arm_deadline(std::max(o.request_idle_timeout - idle,
                                   std::chrono::milliseconds(1)));
    }
    reject("incomplete request (" + std::to_string(held) +
           " bytes buffered) and nothing received for " +
           format_duration(o.request_idle_timeout));
  }

  bool handshake(const wire::Hello& hello) {
    if (hello.magic != wire::kMagic) {
      reject("bad handshake: not a dlaunch store client (magic 0x" +
             hex(hello.magic) + ", expected 0x" + hex(wire::kMagic) + ")");
      return false;
    }
    // Either way the client learns our version from the reply, and whether
    // it must present a token.
    wire::Hello mine;
    if (!authenticated_) mine.flags = wire::kAuthRequired;
    wire::encode_hello(mine, out_);
    if (hello.version != wire::kVersion) {
      spdlog::warn(
          "store: closing connection from {}: protocol version {}, this "
          "server speaks {}",
          peer_, hello.version, wire::kVersion);
      close_after_write_ = true;
      flush();
      return false;
    }
    handshaken_ = true;
    // The handshake deadline is met (unless the token must follow within
    // it); an idle one starts when a request is incomplete (process()).
    if (authenticated_) {
      deadline_.cancel();
      deadline_armed_ = false;
    }
    return true;
  }

  static std::string hex(uint32_t v) {
    char buf[9];
    std::snprintf(buf, sizeof(buf), "%08x", v);
    return buf;
  }

  StoreServer::Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;     // a parked request's timeout
  asio::steady_timer deadline_;  // handshake and idle deadlines
  asio::steady_timer keep_alive_timer_;
  std::chrono::milliseconds keep_alive_{0};
  std::vector<std::pair<std::string, std::string>> on_close_;
  std::string peer_;
  std::vector<char> in_;
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
  bool reading_ = false;
  bool writing_ = false;
  bool closed_ = false;
  bool close_after_write_ = false;
};

void StoreServer::Impl::bind() {
  std::string where = options_.host + ":" + std::to_string(options_.port);
  auto fail = [&](const std::string& why) {
    throw StoreError("cannot bind store to " + where + ": " + why);
  };
  boost::system::error_code ec;
  tcp::resolver resolver(io_);
  auto results = resolver.resolve(options_.host, std::to_string(options_.port),
                                  tcp::resolver::passive, ec);
  if (ec) fail("cannot resolve host: " + lower_first(ec.message()));
  std::string last_error = "no address";
  for (const auto& entry : results) {
    // Close-on-exec from the start: an agent hosting the server spawns
    // workers, which must not inherit (and keep alive) the listening port.
    int fd = ::socket(entry.endpoint().protocol().family(),
                      SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    acceptor_.assign(entry.endpoint().protocol(), fd, ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(entry.endpoint(), ec);
    if (!ec) acceptor_.listen(options_.backlog, ec);
    if (!ec) break;
    last_error = lower_first(ec.message());
    boost::system::error_code ignored;
    acceptor_.close(ignored);
  }
  if (!acceptor_.is_open()) fail(last_error);
  protocol_ = acceptor_.local_endpoint().protocol();
  port_ = acceptor_.local_endpoint().port();
  accept();
}

void StoreServer::Impl::accept() {
  acceptor_.async_wait(tcp::acceptor::wait_read,
                       [this](const boost::system::error_code& ec) {
                         if (ec || shutting_down_) return;
                         accept_ready();
                       });
}

void StoreServer::Impl::accept_ready() {
  // Drains the accept queue (a connect storm arrives in bursts), with
  // accept4 so every connection is close-on-exec from birth.
  while (true) {
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      boost::system::error_code ec;
      tcp::socket socket(io_);
      socket.assign(protocol_, fd, ec);
      if (ec) {
        ::close(fd);
        continue;
      }
      accept_failing_ = false;
      auto c = std::make_shared<Connection>(*this, std::move(socket));
      connections_.emplace(c.get(), c);
      num_connections_.store(connections_.size(), std::memory_order_relaxed);
      c->start();
      continue;
    }
    int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return accept();
    // Out of file descriptors (or similar): say so once per episode and
    // retry shortly rather than spin on a queue that stays readable.
    if (!accept_failing_) {
      spdlog::warn(
          "store: cannot accept connections: {}; retrying every 100 ms",
          errno_text(err));
    }
    accept_failing_ = true;
    accept_retry_.expires_after(std::chrono::milliseconds(100));
    accept_retry_.async_wait([this](const boost::system::error_code& e) {
      if (!e && !shutting_down_) accept();
    });
    return;
  }
}

void StoreServer::Impl::stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (!thread_.joinable()) return;
  DLAUNCH_CHECK(std::this_thread::get_id() != thread_.get_id(),
                "StoreServer::stop called from its own event loop");
  asio::post(io_, [this] {
    shutting_down_ = true;
    boost::system::error_code ec;
    acceptor_.close(ec);
    accept_retry_.cancel();
    auto all = std::move(connections_);
    connections_.clear();
    for (auto& [ptr, c] : all) c->close();
    // Runs after the aborted handlers the closes queued.
    asio::post(io_, [this] { io_.stop(); });
  });
  thread_.join();
}

void StoreServer::Impl::on_closed(Connection& c) {
  if (c.parked()) unpark(c);
  // A peer that died (or went silent) is announced to whoever waits on the
  // keys it named; a server shutting down announces nothing.
  if (!shutting_down_) {
    for (const auto& [key, value] : c.on_close()) append(key, value);
  }
  c.on_close().clear();
  connections_.erase(&c);
  {
    std::lock_guard<std::mutex> lock(idle_mu_);
    num_connections_.store(connections_.size(), std::memory_order_relaxed);
  }
  if (connections_.empty()) idle_cv_.notify_all();
}

void StoreServer::Impl::handle(Connection& c, const wire::Request& r) {
  wire::Response& out = response_;
  out.values.clear();
  out.missing.clear();
  switch (r.type) {
    case MsgType::kSet: {
      if (std::string* v = find(r.keys[0])) {
        v->assign(r.values[0]);
      } else {
        data_.emplace(r.keys[0], r.values[0]);
        key_created(r.keys[0]);
      }
      out.type = MsgType::kOk;
      break;
    }
    case MsgType::kGet: {
      std::string* v = find(r.keys[0]);
      if (!v) return block(c, r);
      out.type = MsgType::kValue;
      out.values.push_back(*v);
      break;
    }
    case MsgType::kAdd: {
      std::string* v = find(r.keys[0]);
      int64_t now = 0;
      if (v) {
        auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), now);
        if (ec != std::errc() || end != v->data() + v->size()) {
          return respond_error(c, "add: the value at key '" +
                                      std::string(r.keys[0]) +
                                      "' is not an integer");
        }
      }
      if (__builtin_add_overflow(now, r.delta, &now)) {
        return respond_error(c, "add: key '" + std::string(r.keys[0]) +
                                    "' would overflow int64");
      }
      if (v) {
        *v = std::to_string(now);
      } else {
        data_.emplace(r.keys[0], std::to_string(now));
        key_created(r.keys[0]);
      }
      out.type = MsgType::kInteger;
      out.integer = now;
      break;
    }
    case MsgType::kCompareSet: {
      // torch's semantics, including its answer for a missing key with a
      // non-empty `expected`: that `expected` is echoed back.
      std::string* v = find(r.keys[0]);
      out.type = MsgType::kValue;
      if (!v) {
        if (r.values[0].empty()) {
          data_.emplace(r.keys[0], r.values[1]);
          key_created(r.keys[0]);
        }
        out.values.push_back(r.values[0].empty() ? r.values[1] : r.values[0]);
      } else {
        if (*v == r.values[0]) v->assign(r.values[1]);
        out.values.push_back(*v);
      }
      break;
    }
    case MsgType::kWait:
    case MsgType::kMultiGet:
    case MsgType::kCheck: {
      bool all = std::all_of(r.keys.begin(), r.keys.end(),
                             [&](std::string_view k) { return find(k); });
      if (r.type == MsgType::kCheck) {
        out.type = MsgType::kBool;
        out.integer = all;
      } else if (!all) {
        return block(c, r);
      } else if (r.type == MsgType::kWait) {
        out.type = MsgType::kOk;
      } else {
        out.type = MsgType::kValues;
        for (std::string_view k : r.keys) out.values.push_back(*find(k));
      }
      break;
    }
    case MsgType::kDeleteKey: {
      auto it = data_.find(r.keys[0]);
      out.type = MsgType::kBool;
      out.integer = it != data_.end();
      if (it != data_.end()) data_.erase(it);
      break;
    }
    case MsgType::kNumKeys:
      out.type = MsgType::kInteger;
      out.integer = static_cast<int64_t>(data_.size());
      break;
    case MsgType::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) {
        if (std::string* v = find(r.keys[i])) {
          v->assign(r.values[i]);
        } else {
          data_.emplace(r.keys[i], r.values[i]);
          key_created(r.keys[i]);
        }
      }
      out.type = MsgType::kOk;
      break;
    case MsgType::kAppend:
      out.type = MsgType::kInteger;
      out.integer = static_cast<int64_t>(append(r.keys[0], r.values[0]).size());
      break;
    case MsgType::kAppendOnClose:
      c.append_on_close(
          r.keys[0], r.values[0],
          std::chrono::milliseconds(std::min(r.timeout_ms, kMaxWaitMs)));
      out.type = MsgType::kOk;
      break;
    default:
      DLAUNCH_CHECK(false, "decode_request let a non-request type through");
  }
  wire::encode_response(out, c.out());
}

std::string& StoreServer::Impl::append(std::string_view key,
                                       std::string_view value) {
  if (std::string* v = find(key)) return v->append(value);
  std::string& v = data_.emplace(key, value).first->second;
  key_created(key);
  return v;
}

void StoreServer::Impl::respond_error(Connection& c, std::string message) {
  response_.type = MsgType::kError;
  response_.message = message;
  wire::encode_response(response_, c.out());
}

void StoreServer::Impl::block(Connection& c, const wire::Request& r) {
  Connection::Parked p;
  p.type = r.type;
  p.keys.assign(r.keys.begin(), r.keys.end());
  p.id = ++next_wait_id_;
  p.missing = register_missing(c, p.keys);
  uint64_t ms = std::min(r.timeout_ms, kMaxWaitMs);
  c.park(std::move(p), std::chrono::milliseconds(ms));
  num_waiting_.fetch_add(1, std::memory_order_relaxed);
}

size_t StoreServer::Impl::register_missing(
    Connection& c, const std::vector<std::string>& keys) {
  size_t missing = 0;
  for (const std::string& k : keys) {
    if (find(k)) continue;
    auto it = waiters_.find(k);
    if (it == waiters_.end()) it = waiters_.try_emplace(k).first;
    it->second.push_back(&c);
    ++missing;
  }
  return missing;
}

void StoreServer::Impl::key_created(std::string_view key) {
  if (waiters_.empty()) return;
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<Connection*> woken = std::move(it->second);
  waiters_.erase(it);
  for (Connection* c : woken) {
    if (c->parked() && --c->parked()->missing == 0) try_complete(*c);
  }
}

void StoreServer::Impl::try_complete(Connection& c) {
  Connection::Parked& p = *c.parked();
  p.missing = register_missing(c, p.keys);
  if (p.missing > 0) return;  // a key was deleted again meanwhile
  wake_response_.values.clear();
  if (p.type == MsgType::kWait) {
    wake_response_.type = MsgType::kOk;
  } else {
    wake_response_.type =
        p.type == MsgType::kGet ? MsgType::kValue : MsgType::kValues;
    for (const std::string& k : p.keys)
      wake_response_.values.push_back(*find(k));
  }
  unpark(c);
  wire::encode_response(wake_response_, c.out());
  c.flush();
  c.unparked();
}

void StoreServer::Impl::on_wait_timeout(Connection& c) {
  Connection::Parked& p = *c.parked();
  wake_response_.type = MsgType::kTimedOut;
  wake_response_.total_keys = static_cast<uint32_t>(p.keys.size());
  wake_response_.missing.clear();
  for (uint32_t i = 0; i < p.keys.size(); ++i) {
    if (!find(p.keys[i])) wake_response_.missing.push_back(i);
  }
  unpark(c);
  wire::encode_response(wake_response_, c.out());
  c.flush();
  c.unparked();
}

void StoreServer::Impl::unpark(Connection& c) {
  for (const std::string& k : c.parked()->keys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    std::erase(it->second, &c);
    if (it->second.empty()) waiters_.erase(it);
  }
  c.parked()->missing = 0;
  num_waiting_.fetch_sub(1, std::memory_order_relaxed);
}

std::unique_ptr<StoreServer> StoreServer::start(
    const StoreServerOptions& options) {
  // The budgets must hold the largest frame the server accepts, or a legal
  // request could never be read.
  const size_t frame = options.max_frame_bytes + wire::kFrameHeaderBytes;
  if (options.max_connection_buffer_bytes < frame) {
    throw StoreError("max_connection_buffer_bytes (" +
                     std::to_string(options.max_connection_buffer_bytes) +
                     ") must be at least max_frame_bytes + 5 (" +
                     std::to_string(frame) + ")");
  }
  if (options.max_server_buffer_bytes < options.max_connection_buffer_bytes) {
    throw StoreError("max_server_buffer_bytes (" +
                     std::to_string(options.max_server_buffer_bytes) +
                     ") must be at least max_connection_buffer_bytes (" +
                     std::to_string(options.max_connection_buffer_bytes) + ")");
  }
  raise_fd_limit();
  auto impl = std::make_unique<Impl>(options);
  impl->bind();
  impl->run();
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StoreServer::~StoreServer() { stop(); }

uint16_t StoreServer::port() const { return impl_->port(); }

void StoreServer::stop() { impl_->stop(); }

size_t StoreServer::num_connections() const { return impl_->num_connections(); }

size_t StoreServer::num_waiting() const { return impl_->num_waiting(); }

size_t StoreServer::buffered_bytes() const { return impl_->buffered_bytes(); }
bool StoreServer::wait_idle(std::chrono::milliseconds timeout) const {
  return impl_->wait_idle(timeout);
}

}  // namespace dlaunch::comm::store
