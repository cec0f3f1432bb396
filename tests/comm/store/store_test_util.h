#pragma once

// Helpers for the store's socket tests: a server on 127.0.0.1 port 0,
// clients connected to it, and a raw TCP socket for speaking (or breaking)
// the protocol by hand.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/client.h"
#include "comm/store/resolve.h"
#include "comm/store/server.h"
#include "comm/store/wire.h"
#include "tests/testing/bin.h"
#include "tests/testing/net.h"
#include "tests/testing/subprocess.h"

namespace dlaunch::comm::store::testing {

using namespace std::chrono_literals;

inline std::unique_ptr<StoreServer> start_local_server() {
  StoreServerOptions o;
  o.host = "127.0.0.1";
  return StoreServer::start(o);
}

inline std::unique_ptr<TcpStore> connect_to(
    uint16_t port, std::chrono::milliseconds timeout = 10s) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = 10s;
  o.timeout = timeout;
  return TcpStore::connect(o);
}

// Sends the default logger's lines (the server's log) to a string while
// it lives, then puts the previous logger back. Declare it before the
// server it listens to, so that the server stops first.
class LogCapture {
 public:
  LogCapture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("t", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::string text() const { return out_.str(); }
  void clear() { out_.str(""); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

// Milliseconds since `start`.
inline int64_t ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now() - start)
      .count();
}

// dlaunch::testing::eventually, checking every 5 ms (a store answers in
// microseconds).
inline bool eventually(const std::function<bool()>& cond,
                       std::chrono::milliseconds timeout) {
  return ::dlaunch::testing::eventually(cond, timeout,
                                        std::chrono::milliseconds(5));
}

// A blocking TCP socket on 127.0.0.1; every operation fails the test rather
// than hanging (receive waits at most 5 s).
class RawSocket {
 public:
  // Connects to 127.0.0.1:port.
  explicit RawSocket(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0)
        << "connect to 127.0.0.1:" << port;
  }
  explicit RawSocket(int fd, bool /*adopt*/) : fd_(fd) {}
  ~RawSocket() { close(); }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send(std::string_view bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // Reads exactly n bytes; fewer when the peer closes or 5 s pass.
  std::string recv_n(size_t n) {
    std::string out;
    while (out.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, static_cast<size_t>(got));
    }
    return out;
  }

  // True when the peer closed the connection (EOF or reset) within 5 s,
  // discarding anything it sent before.
  bool closed_by_peer() {
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, sizeof(buf), 0);
      if (got <= 0) return true;
    }
  }

  int fd() const { return fd_; }

  // Bytes this socket sent that the server has not read yet (the rx queue
  // of its end in /proc/net/tcp); -1 when that end is not found.
  long unread_by_server() const {
    sockaddr_in self{}, peer{};
    socklen_t len = sizeof self;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&self), &len);
    len = sizeof peer;
    ::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &len);
    std::ifstream in("/proc/net/tcp");
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // "sl local rem st tx_queue:rx_queue ...", addresses as HEX:PORT.
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues;
      fields >> sl >> local >> remote >> state >> queues;
      auto port_of = [](const std::string& a) {
        return std::stoul(a.substr(a.find(':') + 1), nullptr, 16);
      };
      if (port_of(local) == ntohs(peer.sin_port) &&
          port_of(remote) == ntohs(self.sin_port)) {
        return std::stol(queues.substr(queues.find(':') + 1), nullptr, 16);
      }
    }
    return -1;
  }

  // True once the server has read everything sent on this socket (5 s).
  bool read_by_server() const {
    return eventually([&] { return unread_by_server() == 0; }, 5s);
  }

 private:
  int fd_ = -1;
};

// What a store answered a raw connection: its hello's flags, the first
// response (type 0 when none came) with every byte of it, and whether the
// server closed the connection afterwards.
struct RawAnswer {
  uint16_t hello_flags = 0;
  wire::MsgType type{};
  std::string message;  // kError's
  std::string bytes;    // the whole response frame
  bool closed = false;
};

// Sends the hello, `token` as kAuth (nothing when empty), then `request`,
// on a fresh connection to 127.0.0.1:port, and reads what comes back: the
// answer to the token is skipped when it is ok.
inline RawAnswer raw_request(uint16_t port, const std::string& token,
                             const wire::Request& request) {
  RawAnswer a;
  RawSocket s(port);
  std::string out;
  wire::encode_hello(wire::Hello{}, out);
  if (!token.empty()) {
    wire::Request auth;
    auth.type = wire::MsgType::kAuth;
    auth.values.assign(1, token);
    wire::encode_request(auth, out);
  }
  wire::encode_request(request, out);
  s.send(out);
  wire::Hello h;
  if (wire::decode_hello(s.recv_n(wire::kHelloBytes), h) !=
      wire::DecodeStatus::kOk) {
    a.closed = true;
    return a;
  }
  a.hello_flags = h.flags;
  for (int answers = token.empty() ? 1 : 2; answers > 0; --answers) {
    a.bytes = s.recv_n(wire::kFrameHeaderBytes);
    if (a.bytes.size() < wire::kFrameHeaderBytes) break;
    uint32_t body = 0;
    for (int i = 3; i >= 0; --i)
      body = body << 8 | static_cast<unsigned char>(a.bytes[i]);
    a.bytes += s.recv_n(body);
    wire::Frame f;
    wire::Response r;
    std::string err;
    if (wire::next_frame(a.bytes, size_t{1} << 30, f, err) !=
            wire::DecodeStatus::kOk ||
        wire::decode_response(f, r, err) != wire::DecodeStatus::kOk) {
      ADD_FAILURE() << "bad response from the store: " << err;
      break;
    }
    a.type = r.type;
    a.message = std::string(r.message);
    // The token's ok is not the answer asked for.
    if (!(answers == 2 && r.type == wire::MsgType::kOk)) break;
  }
  a.closed = s.closed_by_peer();
  return a;
}

// A listening socket on 127.0.0.1 port 0 that plays a misbehaving server.
class RawListener {
 public:
  RawListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RawListener() { ::close(fd_); }
  uint16_t port() const { return port_; }
  // Accepts one connection (waits at most 5 s).
  std::unique_ptr<RawSocket> accept() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return nullptr;
    return std::make_unique<RawSocket>(::accept(fd_, nullptr, nullptr), true);
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A port on 127.0.0.1 that nothing listens on (see testing::free_port).
inline uint16_t unused_port() {
  return static_cast<uint16_t>(::dlaunch::testing::free_port());
}

using ::dlaunch::testing::bin;

// Runs a program to its end (tests/testing/subprocess.h).
inline ::dlaunch::testing::CommandResult run(
    std::vector<std::string> argv, std::chrono::milliseconds timeout = 60s) {
  ::dlaunch::testing::CommandOptions o;
  o.argv = std::move(argv);
  return ::dlaunch::testing::run_command(o, timeout);
}

// Starts a program that keeps running (dl-store).
inline std::unique_ptr<::dlaunch::testing::Subprocess> spawn(
    std::vector<std::string> argv) {
  ::dlaunch::testing::CommandOptions o;
  o.argv = std::move(argv);
  return std::make_unique<::dlaunch::testing::Subprocess>(o);
}

// The port dl-store announced ("dl-store listening on 127.0.0.1:P"), 0 when
// it did not within 5 s.
inline uint16_t announced_port(::dlaunch::testing::Subprocess& p) {
  if (!p.wait_for_output("dl-store listening on", 5s)) return 0;
  p.wait_for_output("\n", 1s);
  std::smatch m;
  if (!std::regex_search(
          p.out(), m,
          std::regex("dl-store listening on 127\\.0\\.0\\.1:([0-9]+)\n"))) {
    return 0;
  }
  return static_cast<uint16_t>(std::stoi(m[1]));
}

}  // namespace dlaunch::comm::store::testing
