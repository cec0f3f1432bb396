// The store server's network side: the listening socket (bind, accept,
// stop) and each client Connection: reading and framing requests within the
// buffer budgets, hello and token, deadlines, keep-alive, batched writes.

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "comm/check.h"
#include "comm/store/server_internal.h"
#include "comm/store/store.h"
#include "comm/store/text.h"
#include "comm/store/token.h"

namespace dlaunch::comm::store {

namespace {

// Reads are issued into at least this much free buffer space (less only
// near the connection's budget).
constexpr size_t kMinReadBytes = 16 * 1024;
// Every connection's own request buffer; growth past it is charged to the
// server's budget (StoreServerOptions::max_server_buffer_bytes).
constexpr size_t kInitialBufferBytes = 64 * 1024;
// Buffers grown past this by a large frame are given back once drained.
constexpr size_t kShrinkAboveBytes = size_t{1} << 20;
// A pause in accepting (max_pending_connections) that lasts this long is
// logged.
constexpr std::chrono::milliseconds kPauseNoteAfter{1000};
// A connection with this much output not yet written is not read from or
// served until the client reads: a client that sends without reading
// cannot make the server buffer without bound.
constexpr size_t kOutputHighWaterBytes = size_t{4} << 20;

}  // namespace

Connection::Connection(StoreServer::Impl& server, tcp::socket socket)
    : server_(server),
      socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      deadline_(socket_.get_executor()),
      keep_alive_timer_(socket_.get_executor()),
      in_(kInitialBufferBytes),
      last_received_(std::chrono::steady_clock::now()) {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  peer_host_ = ec ? "unknown peer" : ep.address().to_string();
  peer_ = ec ? peer_host_ : peer_host_ + ":" + std::to_string(ep.port());
  socket_.set_option(tcp::no_delay(true), ec);
}

void Connection::start() {
  arm_deadline(server_.options().handshake_timeout);
  read();
}

void Connection::arm_keep_alive(std::chrono::milliseconds after) {
  keep_alive_timer_.expires_after(after);
  keep_alive_timer_.async_wait([self = shared_from_this()](
                                   const boost::system::error_code& ec) {
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
        std::chrono::duration_cast<std::chrono::milliseconds>(silent).count());
    self->close();
  });
}

void Connection::close() {
  if (closed_) return;
  auto self = shared_from_this();
  closed_ = true;
  boost::system::error_code ec;
  timer_.cancel();
  deadline_.cancel();
  keep_alive_timer_.cancel();
  socket_.close(ec);
  server_.release(in_.size() - kInitialBufferBytes);
  in_.resize(0);
  in_begin_ = in_end_ = 0;
  server_.on_closed(*this);
}

void Connection::reject(const std::string& why) {
  spdlog::warn("store: closing connection from {}: {}", peer_, why);
  close();
}

void Connection::park(Parked p, std::chrono::milliseconds timeout) {
  parked_ = std::move(p);
  timer_.expires_after(timeout);
  timer_.async_wait([self = shared_from_this(),
                     id = parked_->id](const boost::system::error_code& ec) {
    if (ec || self->closed_ || !self->parked_ || self->parked_->id != id)
      return;
    self->server_.on_wait_timeout(*self);
  });
}

void Connection::unparked() {
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

void Connection::append_on_close(std::string_view key, std::string_view value,
                                 std::chrono::milliseconds keep_alive) {
  on_close_.emplace_back(key, value);
  if (keep_alive.count() > 0 &&
      (keep_alive_.count() == 0 || keep_alive < keep_alive_)) {
    keep_alive_ = keep_alive;
    arm_keep_alive(keep_alive_);
  }
}

void Connection::flush() {
  if (writing_ || closed_ || out_.empty()) return;
  writing_ = true;
  std::swap(out_, writing_buf_);
  asio::async_write(
      socket_, asio::buffer(writing_buf_),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
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

void Connection::read() {
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

bool Connection::make_room(size_t bytes) {
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
           " bytes (max_server_buffer_bytes) with " + std::to_string(in_end_) +
           " bytes of this connection's pending");
    return false;
  }
  in_.resize(want);
  return true;
}

void Connection::process() {
  while (!closed_ && !close_after_write_ && !parked_ &&
         out_.size() < kOutputHighWaterBytes && handle_next()) {
  }
  // Rewind (and shrink) a drained buffer, unless a read in flight is
  // filling it at in_end_.
  if (!closed_ && !reading_ && in_begin_ == in_end_) {
    in_begin_ = in_end_ = 0;
    if (in_.size() > kShrinkAboveBytes) {
      server_.release(in_.size() - kInitialBufferBytes);
      in_.resize(kInitialBufferBytes);
    }
  }
  // Part of a request waits for the client: its idle deadline runs.
  if (!closed_ && handshaken_ && !parked_ && in_end_ > in_begin_ &&
      !deadline_armed_) {
    arm_deadline(server_.options().request_idle_timeout);
  }
  flush();
}

bool Connection::handle_next() {
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

bool Connection::authenticate(const wire::Request& r) {
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
    server_.admitted(*this);
  }
  wire::Response ok;
  ok.type = MsgType::kOk;
  wire::encode_response(ok, out_);
  return true;
}

void Connection::refuse(const std::string& why) {
  spdlog::warn("store: closing connection from {}: {}", peer_, why);
  wire::Response error;
  error.type = MsgType::kError;
  error.message = why;
  wire::encode_response(error, out_);
  close_after_write_ = true;
}

void Connection::arm_deadline(std::chrono::milliseconds after) {
  deadline_armed_ = true;
  deadline_.expires_after(after);
  deadline_.async_wait(
      [self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || self->closed_) return;
        self->deadline_armed_ = false;
        self->on_deadline();
      });
}

void Connection::on_deadline() {
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
    return arm_deadline(
        std::max(o.request_idle_timeout - idle, std::chrono::milliseconds(1)));
  }
  reject("incomplete request (" + std::to_string(held) +
         " bytes buffered) and nothing received for " +
         format_duration(o.request_idle_timeout));
}

bool Connection::handshake(const wire::Hello& hello) {
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
    server_.admitted(*this);
  }
  return true;
}

std::string Connection::hex(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

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

void StoreServer::Impl::admitted(Connection& c) {
  c.set_admitted();
  --pending_;
  if (accept_paused_ && !shutting_down_ &&
      pending_ < options_.max_pending_connections) {
    accept_paused_ = false;
    pause_note_.cancel();
    accept();
  }
}

void StoreServer::Impl::accept_ready() {
  // Drains the accept queue (a connect storm arrives in bursts), with
  // accept4 so every connection is close-on-exec from birth.
  while (true) {
    if (pending_ >= options_.max_pending_connections) {
      // Resumed by admitted(). A connect storm pauses briefly (the hellos
      // are on their way): said only when a pause lasts.
      accept_paused_ = true;
      // (A handler already queued when a pause ended must not speak for
      // the next one: each pause has its number.)
      const uint64_t pause = ++pauses_;
      pause_note_.expires_after(kPauseNoteAfter);
      pause_note_.async_wait([this, pause](const boost::system::error_code& e) {
        if (e || !accept_paused_ || pause != pauses_ || shutting_down_) return;
        spdlog::warn(
            "store: {} connections have not completed their hello and "
            "token for {}; accepting no more until one does or its "
            "handshake timeout ({}) closes it (max_pending_connections)",
            pending_, format_duration(kPauseNoteAfter),
            format_duration(options_.handshake_timeout));
      });
      return;
    }
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
      ++pending_;
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
    pause_note_.cancel();
    auto all = std::move(connections_);
    connections_.clear();
    for (auto& [ptr, c] : all) c->close();
    // Runs after the aborted handlers the closes queued.
    asio::post(io_, [this] { io_.stop(); });
  });
  thread_.join();
}

}  // namespace dlaunch::comm::store
