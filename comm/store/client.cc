#include "comm/store/client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <stdexcept>
#include <thread>

#include "comm/store/resolve.h"
#include "comm/store/text.h"

namespace dlaunch::comm::store {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using wire::MsgType;

namespace {

// How long past a blocking request's own timeout the client waits for the
// server's kTimedOut answer (which says how many keys were present) before
// it gives up on the server itself.
constexpr milliseconds kServerGrace{500};
// Connect retries back off from 10 ms to at most 1 s between attempts.
constexpr milliseconds kFirstBackoff{10};
constexpr milliseconds kMaxBackoff{1000};
constexpr size_t kReadChunk = 64 * 1024;
// Missing keys named in a timeout message; the rest are counted.
constexpr size_t kKeysListed = 10;
// How a refused client gets the job's token (docs/store.md).
constexpr char kTokenFix[] =
    "give it the job's token (DLAUNCH_RDZV_TOKEN, or --rdzv-conf "
    "token_file=PATH for an agent, --token-file for dl-store)";

// Waits until `fd` is ready for `events`. False when `deadline` passes first.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1,
                   static_cast<int>(std::min<int64_t>(
                       left.count(), std::numeric_limits<int>::max())));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the I/O call report it
  }
}

// Reads exactly `n` bytes into `buf` within the deadline; otherwise false
// with a retryable reason in `error` (`what` names what was expected).
bool read_exact(int fd, char* buf, size_t n, Clock::time_point deadline,
                const char* what, std::string& error) {
  size_t got = 0;
  while (got < n) {
    if (!wait_fd(fd, POLLIN, deadline)) {
      error = std::string("no ") + what + " from the server";
      return false;
    }
    ssize_t r = ::recv(fd, buf + got, n - got, 0);
    if (r == 0) {
      error = std::string("server closed the connection during the ") + what;
      return false;
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      error = errno_text(errno);
      return false;
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

// The server's answer to kAuth: nothing when it accepted the token;
// otherwise throws StoreAuthError with its reason (a lost or silent server
// is a retryable reason in `error`, false).
bool read_auth_answer(int fd, const std::string& address,
                      Clock::time_point deadline, std::string& error) {
  char header[wire::kFrameHeaderBytes];
  if (!read_exact(fd, header, sizeof header, deadline, "answer to the token",
                  error)) {
    return false;
  }
  std::string bytes(header, sizeof header);
  wire::Frame frame;
  if (wire::next_frame(bytes, wire::kMaxTokenBytes, frame, error) ==
      wire::DecodeStatus::kBad) {
    throw StoreError("protocol error from store " + address + ": " + error);
  }
  // The header says how long the body is (bounded just above).
  uint32_t body = static_cast<unsigned char>(header[0]) |
                  static_cast<unsigned char>(header[1]) << 8 |
                  static_cast<unsigned char>(header[2]) << 16 |
                  static_cast<uint32_t>(static_cast<unsigned char>(header[3]))
                      << 24;
  bytes.resize(sizeof header + body);
  if (!read_exact(fd, bytes.data() + sizeof header, body, deadline,
                  "answer to the token", error)) {
    return false;
  }
  wire::Response response;
  if (wire::next_frame(bytes, wire::kMaxTokenBytes, frame, error) !=
          wire::DecodeStatus::kOk ||
      wire::decode_response(frame, response, error) !=
          wire::DecodeStatus::kOk) {
    throw StoreError("protocol error from store " + address + ": " + error);
  }
  if (response.type == MsgType::kError) {
    throw StoreAuthError("store " + address + " refused this client: " +
                         std::string(response.message) + "; " + kTokenFix);
  }
  if (response.type != MsgType::kOk) {
    throw StoreError("protocol error from store " + address + ": " +
                     wire::msg_type_name(response.type) +
                     " answer to the token");
  }
  return true;
}

// One connection attempt to every address of host:port. Returns the
// connected, handshaken socket, or -1 with a retryable reason in `error`.
// A server that is not a dlaunch store, or speaks another protocol version,
// throws: retrying cannot help.
int try_connect(const TcpStoreOptions& o, const std::string& address,
                Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  AddrInfoList res =
      resolve(o.host, std::to_string(o.port), hints, deadline, error);
  if (!res) return -1;
  for (addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                 ai->ai_protocol);
    if (fd < 0) {
      error = errno_text(errno);
      continue;
    }
    auto give_up = [&](std::string why) {
      error = std::move(why);
      ::close(fd);
    };
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        give_up(errno_text(errno));
        continue;
      }
      if (!wait_fd(fd, POLLOUT, deadline)) {
        give_up("connection timed out");
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        give_up(errno_text(err));
        continue;
      }
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // The token follows the hello at once (one round trip for both).
    std::string hello_bytes;
    wire::encode_hello(wire::Hello{}, hello_bytes);
    if (!o.token.empty()) {
      wire::Request auth;
      auth.type = MsgType::kAuth;
      auth.values.assign(1, o.token);
      wire::encode_request(auth, hello_bytes);
    }
    if (::send(fd, hello_bytes.data(), hello_bytes.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(hello_bytes.size())) {
      give_up(errno_text(errno));
      continue;
    }
    char hello_in[wire::kHelloBytes];
    std::string why;
    if (!read_exact(fd, hello_in, sizeof hello_in, deadline, "handshake",
                    why)) {
      give_up(why);
      continue;
    }
    wire::Hello hello;
    wire::decode_hello(std::string_view(hello_in, sizeof hello_in), hello);
    if (hello.magic != wire::kMagic) {
      ::close(fd);
      throw StoreError("store " + address +
                       " is not a dlaunch store (bad handshake); check the "
                       "host and port");
    }
    if (hello.version != wire::kVersion) {
      ::close(fd);
      throw StoreError("store " + address + " speaks protocol version " +
                       std::to_string(hello.version) +
                       "; this client speaks version " +
                       std::to_string(wire::kVersion) +
                       ": run the same dlaunch build on every node");
    }
    if (o.token.empty()) {
      if (hello.flags & wire::kAuthRequired) {
        ::close(fd);
        throw StoreAuthError("store " + address +
                             " requires the job's token and this client has "
                             "none; " +
                             kTokenFix);
      }
      return fd;
    }
    try {
      if (!read_auth_answer(fd, address, deadline, why)) {
        give_up(why);
        continue;
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    return fd;
  }
  return -1;
}

}  // namespace

std::unique_ptr<TcpStore> TcpStore::connect(
    const TcpStoreOptions& options, const std::function<bool()>& cancelled) {
  std::string address = options.host + ":" + std::to_string(options.port);
  if (options.host.empty() || options.port == 0) {
    throw std::invalid_argument(
        "TcpStore::connect: store address '" + address +
        "' needs a host and a port in 1..65535 (set TcpStoreOptions.host and "
        ".port)");
  }
  auto deadline = Clock::now() + options.connect_timeout;
  auto backoff = kFirstBackoff;
  std::string error = "no attempt made";
  auto give_up_if_cancelled = [&] {
    if (cancelled && cancelled()) {
      throw StoreError("connecting to store " + address + " interrupted (" +
                       error + ")");
    }
  };
  while (true) {
    int fd = try_connect(options, address, deadline, error);
    if (fd >= 0) return std::unique_ptr<TcpStore>(new TcpStore(options, fd));
    auto now = Clock::now();
    if (now >= deadline) break;
    give_up_if_cancelled();
    std::this_thread::sleep_for(
        std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
    give_up_if_cancelled();
    // An attempt started at the deadline could only time out; the last real
    // reason (say, "connection refused") is the one worth reporting.
    if (Clock::now() >= deadline) break;
  }
  throw StoreError("store " + address + " unreachable after " +
                   format_duration(options.connect_timeout) + " (" + error +
                   ")");
}

TcpStore::TcpStore(const TcpStoreOptions& options, int fd)
    : options_(options),
      address_(options.host + ":" + std::to_string(options.port)),
      fd_(fd),
      live_fd_(fd),
      in_(kReadChunk) {
  timeout_ = options.timeout;
}

TcpStore::~TcpStore() {
  live_fd_.store(-1);
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<TcpStore> TcpStore::clone() const {
  TcpStoreOptions o = options_;
  o.timeout = timeout_;
  return connect(o);
}

void TcpStore::interrupt() {
  int fd = live_fd_.load();
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

void TcpStore::fail(const std::string& why) {
  live_fd_.store(-1);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  broken_ = why;
  throw StoreError(why);
}

void TcpStore::send_all(Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < out_.size()) {
    ssize_t n =
        ::send(fd_, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {
      fail("lost connection to store " + address_ + " during " +
           wire::msg_type_name(request_.type) + ": " + errno_text(errno));
    }
    if (!wait_fd(fd_, POLLOUT, deadline)) {
      fail("store " + address_ + " did not accept a " +
           wire::msg_type_name(request_.type) + " request within " +
           format_duration(timeout_));
    }
  }
}

bool TcpStore::read_frame(Clock::time_point deadline, wire::Frame& frame) {
  while (true) {
    std::string_view avail(in_.data() + in_begin_, in_end_ - in_begin_);
    switch (wire::next_frame(avail, wire::kMaxResponseBytes, frame, error_)) {
      case wire::DecodeStatus::kOk:
        return true;
      case wire::DecodeStatus::kBad:
        fail("protocol error from store " + address_ + ": " + error_);
      case wire::DecodeStatus::kNeedMore:
        break;
    }
    // Make room: drop consumed bytes, then grow for a large frame.
    if (in_begin_ > 0) {
      std::copy(in_.begin() + in_begin_, in_.begin() + in_end_, in_.begin());
      in_end_ -= in_begin_;
      in_begin_ = 0;
    }
    if (in_.size() - in_end_ < kReadChunk / 4) in_.resize(in_.size() * 2);
    if (!wait_fd(fd_, POLLIN, deadline)) return false;
    ssize_t n = ::recv(fd_, in_.data() + in_end_, in_.size() - in_end_, 0);
    if (n > 0) {
      in_end_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    fail("lost connection to store " + address_ + " during " +
         wire::msg_type_name(request_.type) + ": " +
         (n == 0 ? std::string("the server closed the connection")
                 : errno_text(errno)));
  }
}

const wire::Response& TcpStore::call(MsgType expected, milliseconds wait) {
  if (fd_ < 0) {
    throw StoreError("connection to store " + address_ +
                     " is closed after an earlier error (" + broken_ +
                     "); clone() opens a new one");
  }
  in_begin_ += consumed_;
  consumed_ = 0;
  if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  out_.clear();
  wire::encode_request(request_, out_);
  bool blocking = request_.type == MsgType::kGet ||
                  request_.type == MsgType::kWait ||
                  request_.type == MsgType::kMultiGet;
  auto deadline = Clock::now() + (blocking ? wait + kServerGrace : timeout_);
  send_all(deadline);
  wire::Frame frame;
  if (!read_frame(deadline, frame)) {
    if (blocking) throw_timed_out(wait, nullptr);
    fail("store " + address_ + " did not answer " +
         wire::msg_type_name(request_.type) + " within " +
         format_duration(timeout_));
  }
  consumed_ = frame.size;
  if (wire::decode_response(frame, response_, error_) !=
      wire::DecodeStatus::kOk) {
    fail("protocol error from store " + address_ + ": " + error_);
  }
  if (response_.type == MsgType::kError) {
    throw StoreError("store " + address_ + ": " +
                     std::string(response_.message));
  }
  if (response_.type == MsgType::kTimedOut && blocking) {
    throw_timed_out(wait, &response_);
  }
  if (response_.type != expected) {
    fail("protocol error from store " + address_ + ": " +
         wire::msg_type_name(response_.type) + " answer to " +
         wire::msg_type_name(request_.type));
  }
  return response_;
}

void TcpStore::throw_timed_out(milliseconds wait,
                               const wire::Response* response) {
  const auto& keys = request_.keys;
  std::vector<uint32_t> missing;
  if (response) {
    missing = response->missing;
  } else {
    for (uint32_t i = 0; i < keys.size(); ++i) missing.push_back(i);
  }
  std::string msg = "timed out after " + format_duration(wait) +
                    " waiting for " + (keys.size() == 1 ? "key " : "keys ");
  for (size_t i = 0; i < missing.size() && i < kKeysListed; ++i) {
    if (i > 0) msg += ",";
    msg += "'" + std::string(keys[missing[i]]) + "'";
  }
  if (missing.size() > kKeysListed) {
    msg += " and " + std::to_string(missing.size() - kKeysListed) + " more";
  }
  if (response) {
    msg += " (" + std::to_string(keys.size() - missing.size()) + "/" +
           std::to_string(keys.size()) + " present)";
    throw StoreTimeoutError(msg);
  }
  msg += " (store " + address_ + " did not answer)";
  live_fd_.store(-1);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  broken_ = msg;
  throw StoreTimeoutError(msg);
}

void TcpStore::set_keys(const std::vector<std::string>& keys) {
  request_.keys.assign(keys.begin(), keys.end());
  request_.values.clear();
}

void TcpStore::set(std::string_view key, std::string_view value) {
  request_.type = MsgType::kSet;
  request_.keys.assign(1, key);
  request_.values.assign(1, value);
  call(MsgType::kOk, milliseconds(0));
}

std::string TcpStore::get(std::string_view key) {
  request_.type = MsgType::kGet;
  request_.keys.assign(1, key);
  request_.values.clear();
  request_.timeout_ms =
      static_cast<uint64_t>(std::max<int64_t>(0, timeout_.count()));
  return std::string(call(MsgType::kValue, timeout_).values[0]);
}

int64_t TcpStore::add(std::string_view key, int64_t delta) {
  request_.type = MsgType::kAdd;
  request_.keys.assign(1, key);
  request_.values.clear();
  request_.delta = delta;
  return call(MsgType::kInteger, milliseconds(0)).integer;
}

std::string TcpStore::compare_set(std::string_view key,
                                  std::string_view expected,
                                  std::string_view desired) {
  request_.type = MsgType::kCompareSet;
  request_.keys.assign(1, key);
  request_.values.assign({expected, desired});
  return std::string(call(MsgType::kValue, milliseconds(0)).values[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    milliseconds timeout) {
  request_.type = MsgType::kWait;
  set_keys(keys);
  timeout = std::max(timeout, milliseconds(0));
  request_.timeout_ms = static_cast<uint64_t>(timeout.count());
  call(MsgType::kOk, timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  request_.type = MsgType::kCheck;
  set_keys(keys);
  return call(MsgType::kBool, milliseconds(0)).integer != 0;
}

bool TcpStore::delete_key(std::string_view key) {
  request_.type = MsgType::kDeleteKey;
  request_.keys.assign(1, key);
  request_.values.clear();
  return call(MsgType::kBool, milliseconds(0)).integer != 0;
}

int64_t TcpStore::num_keys() {
  request_.type = MsgType::kNumKeys;
  request_.keys.clear();
  request_.values.clear();
  return call(MsgType::kInteger, milliseconds(0)).integer;
}

std::vector<std::string> TcpStore::multi_get(
    const std::vector<std::string>& keys) {
  request_.type = MsgType::kMultiGet;
  set_keys(keys);
  auto timeout = std::max(timeout_, milliseconds(0));
  request_.timeout_ms = static_cast<uint64_t>(timeout.count());
  const wire::Response& r = call(MsgType::kValues, timeout);
  if (r.values.size() != keys.size()) {
    fail("protocol error from store " + address_ + ": multi_get of " +
         std::to_string(keys.size()) + " keys answered with " +
         std::to_string(r.values.size()) + " values");
  }
  return std::vector<std::string>(r.values.begin(), r.values.end());
}

void TcpStore::multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw std::invalid_argument("multi_set: " + std::to_string(keys.size()) +
                                " keys but " + std::to_string(values.size()) +
                                " values; pass one value per key");
  }
  request_.type = MsgType::kMultiSet;
  request_.keys.assign(keys.begin(), keys.end());
  request_.values.assign(values.begin(), values.end());
  call(MsgType::kOk, milliseconds(0));
}

int64_t TcpStore::append(std::string_view key, std::string_view value) {
  request_.type = MsgType::kAppend;
  request_.keys.assign(1, key);
  request_.values.assign(1, value);
  return call(MsgType::kInteger, milliseconds(0)).integer;
}

void TcpStore::append_on_close(std::string_view key, std::string_view value,
                               milliseconds keep_alive) {
  request_.type = MsgType::kAppendOnClose;
  request_.keys.assign(1, key);
  request_.values.assign(1, value);
  request_.timeout_ms =
      static_cast<uint64_t>(std::max(keep_alive, milliseconds(0)).count());
  call(MsgType::kOk, milliseconds(0));
}

}  // namespace dlaunch::comm::store
