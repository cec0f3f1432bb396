#pragma once

// Helpers for the store's socket tests: a server on 127.0.0.1 port 0,
// clients connected to it, and a raw TCP socket for speaking (or breaking)
// the protocol by hand.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/client.h"
#include "comm/store/server.h"

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

// Milliseconds since `start`.
inline int64_t ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now() - start)
      .count();
}

// Polls `cond` every 5 ms until it holds or `timeout` passes (tests only).
template <typename Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
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

 private:
  int fd_ = -1;
};

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

// A port on 127.0.0.1 that nothing listens on (bound, then released).
inline uint16_t unused_port() {
  RawListener l;
  return l.port();
}

// A child process with stdout and stderr on pipes; killed and reaped by the
// destructor if still running. Waits are bounded (pidfd + poll).
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    // Built before fork: the child of a threaded parent may only make
    // async-signal-safe calls.
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_ = out[0];
    err_ = err[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  ~Child() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
    ::close(err_);
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // One line of stdout without its newline; what was read so far when EOF
  // or `timeout` comes first.
  std::string read_line(std::chrono::milliseconds timeout = 5s) {
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{out_, POLLIN, 0};
      if (left.count() <= 0 ||
          ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        return line;
      char c;
      if (::read(out_, &c, 1) != 1 || c == '\n') return line;
      line.push_back(c);
    }
  }

  // Everything the child wrote to stderr (call after it exited).
  std::string read_stderr() {
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(err_, buf, sizeof(buf))) > 0) all.append(buf, n);
    return all;
  }

  void signal(int sig) { ::kill(pid_, sig); }

  // The exit code, 128 + signal when killed, or -1 when the child is still
  // running after `timeout`.
  int wait(std::chrono::milliseconds timeout = 5s) {
    if (status_ >= 0) return status_;
    pollfd p{pidfd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return -1;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_ = -1;
  int err_ = -1;
  int status_ = -1;
};

// Path of a built executable.
inline std::string bin(const std::string& name) {
  return std::string(DLAUNCH_BIN_DIR) + "/" + name;
}

}  // namespace dlaunch::comm::store::testing
