// dl-store-bench: load on a store server from C clients, each a TcpStore on
// its own thread (the way ranks use the store).
//
//   dl-store-bench [--addr HOST:PORT] --clients C --requests N --op set|get|add
//     prints "OP: R req/s, p50 X us, p99 Y us" (N requests in all)
//   dl-store-bench [--addr HOST:PORT] --clients C --op barrier [--rounds K]
//     each client adds to a counter, the last one sets a key and all wait
//     for it; prints "barrier: C clients in T ms" (median of K rounds)
//
// --driver loop drives all C connections from one epoll thread instead
// (redis-benchmark's model; set/get/add). Without --addr it serves an
// in-process StoreServer on 127.0.0.1.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "comm/cli_checks.h"
#include "comm/store/client.h"
#include "comm/store/server.h"
#include "comm/store/wire.h"

namespace {

using dlaunch::comm::store::StoreError;
using dlaunch::comm::store::StoreServer;
using dlaunch::comm::store::StoreServerOptions;
using dlaunch::comm::store::TcpStore;
using dlaunch::comm::store::TcpStoreOptions;
using Clock = std::chrono::steady_clock;
namespace wire = dlaunch::comm::store::wire;

struct Args {
  std::string addr;
  int clients = 64;
  int64_t requests = 200000;
  std::string op = "set";
  int value_bytes = 3;  // redis-benchmark's default -d
  int rounds = 5;
  std::string driver = "threads";
};

// A start line all client threads wait behind, released at once.
class Gate {
 public:
  void wait_for(int generation) {
    int now;
    while ((now = gen_.load()) < generation) gen_.wait(now);
  }
  void open(int generation) {
    gen_.store(generation);
    gen_.notify_all();
  }

 private:
  std::atomic<int> gen_{0};
};

// Counts finished clients; the main thread waits for all `n` of them. Only
// the last arrival wakes it, so counting costs the clients no syscalls.
class Finish {
 public:
  explicit Finish(int n) : n_(n) {}
  void reset() { done_.store(0); }
  void arrive() {
    if (done_.fetch_add(1) + 1 == n_) done_.notify_one();
  }
  void wait() {
    int now;
    while ((now = done_.load()) < n_) done_.wait(now);
  }

 private:
  const int n_;
  std::atomic<int> done_{0};
};

double percentile(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i] / 1000.0;
}

// Prints "OP: R req/s, p50 X us, p99 Y us" from per-request latencies (ns).
void report(const std::string& op, std::vector<uint32_t>& all, double secs) {
  std::printf("%s: %.0f req/s, p50 %.1f us, p99 %.1f us\n", op.c_str(),
              static_cast<double>(all.size()) / secs, percentile(all, 0.50),
              percentile(all, 0.99));
}

uint32_t ns_since(Clock::time_point t0) {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0)
          .count());
}

// One request of `op` on `key`, encoded once and resent as is.
std::string encode_op(const std::string& op, const std::string& key,
                      const std::string& value) {
  wire::Request r;
  r.keys = {key};
  if (op == "set") {
    r.type = wire::MsgType::kSet;
    r.values = {value};
  } else if (op == "get") {
    r.type = wire::MsgType::kGet;
    r.timeout_ms = 60000;
  } else {
    r.type = wire::MsgType::kAdd;
    r.delta = 1;
  }
  std::string out;
  wire::encode_request(r, out);
  return out;
}

// A connected, handshaken socket to the store (blocking), for the loop
// driver, which speaks the wire protocol itself.
int raw_connect(const TcpStoreOptions& where) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port = std::to_string(where.port);
  if (::getaddrinfo(where.host.c_str(), port.c_str(), &hints, &res) != 0) {
    throw StoreError("cannot resolve " + where.host);
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  ::freeaddrinfo(res);
  std::string hello;
  wire::encode_hello(wire::Hello{}, hello);
  char reply[wire::kHelloBytes];
  ok = ok && ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) ==
                 static_cast<ssize_t>(hello.size());
  ok = ok && ::recv(fd, reply, sizeof(reply), MSG_WAITALL) ==
                 static_cast<ssize_t>(sizeof(reply));
  if (!ok) {
    if (fd >= 0) ::close(fd);
    throw StoreError("cannot connect to store " + where.host + ":" + port +
                     ": " + std::strerror(errno));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// The --driver loop load: one thread and epoll drive all C connections, one
// request in flight on each (redis-benchmark's model, so the two servers are
// measured the same way). Requests are pre-encoded frames sent as raw bytes.
int run_loop(const Args& args, const TcpStoreOptions& where,
             const std::string& prefix) {
  struct Conn {
    int fd = -1;
    std::string request;
    std::string in;
    int64_t left = 0;
    Clock::time_point sent;
  };
  const int c = args.clients;
  std::string value(args.value_bytes, 'x');
  if (args.op == "get") {
    auto s = TcpStore::connect(where);
    for (int i = 0; i < c; ++i) s->set(prefix + std::to_string(i), value);
  }
  std::vector<Conn> conns(c);
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  for (int i = 0; i < c; ++i) {
    conns[i].fd = raw_connect(where);
    conns[i].request = encode_op(args.op, prefix + std::to_string(i), value);
    conns[i].left = args.requests / c + (i < args.requests % c ? 1 : 0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(i);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev);
  }
  auto send = [&](Conn& k) {
    k.sent = Clock::now();
    if (::send(k.fd, k.request.data(), k.request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(k.request.size())) {
      throw StoreError("send failed: " + std::string(std::strerror(errno)));
    }
  };
  std::vector<uint32_t> all;
  all.reserve(args.requests);
  int active = 0;
  auto start = Clock::now();
  for (Conn& k : conns) {
    if (k.left > 0) {
      send(k);
      ++active;
    }
  }
  std::vector<epoll_event> events(256);
  char buf[64 * 1024];
  std::string error;
  while (active > 0) {
    int n =
        ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), 60000);
    if (n <= 0) throw StoreError("no answer from the store for 60 s");
    for (int e = 0; e < n; ++e) {
      Conn& k = conns[events[e].data.u32];
      ssize_t got = ::recv(k.fd, buf, sizeof(buf), 0);
      if (got <= 0) throw StoreError("the store closed a connection");
      k.in.append(buf, static_cast<size_t>(got));
      wire::Frame f;
      while (wire::next_frame(k.in, wire::kDefaultMaxFrameBytes, f, error) ==
             wire::DecodeStatus::kOk) {
        if (f.type == wire::MsgType::kError ||
            f.type == wire::MsgType::kTimedOut) {
          throw StoreError("the store answered " + wire::msg_type_name(f.type));
        }
        all.push_back(ns_since(k.sent));
        k.in.erase(0, f.size);
        if (--k.left > 0) {
          send(k);
        } else {
          --active;
        }
      }
    }
  }
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (Conn& k : conns) ::close(k.fd);
  ::close(ep);
  report(args.op, all, secs);
  return 0;
}

int run_ops(const Args& args, std::vector<std::unique_ptr<TcpStore>>& stores,
            const std::string& prefix) {
  const int c = args.clients;
  std::string value(args.value_bytes, 'x');
  std::vector<std::vector<uint32_t>> lat(c);
  std::vector<std::string> errors(c);
  Gate gate;
  Finish finish(c);
  std::vector<std::thread> threads;
  for (int i = 0; i < c; ++i) {
    int64_t n = args.requests / c + (i < args.requests % c ? 1 : 0);
    lat[i].reserve(n);
    threads.emplace_back([&, i, n] {
      TcpStore& s = *stores[i];
      std::string key = prefix + std::to_string(i);
      try {
        if (args.op == "get") s.set(key, value);
        gate.wait_for(1);
        for (int64_t r = 0; r < n; ++r) {
          auto t0 = Clock::now();
          if (args.op == "set") {
            s.set(key, value);
          } else if (args.op == "get") {
            s.get(key);
          } else {
            s.add(key, 1);
          }
          lat[i].push_back(ns_since(t0));
        }
      } catch (const StoreError& e) {
        errors[i] = e.what();
      }
      finish.arrive();
    });
  }
  auto start = Clock::now();
  gate.open(1);
  finish.wait();
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.empty()) {
      std::cerr << "dl-store-bench: " << e << "\n";
      return 1;
    }
  }
  std::vector<uint32_t> all;
  all.reserve(args.requests);
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  report(args.op, all, secs);
  return 0;
}

int run_barrier(const Args& args,
                std::vector<std::unique_ptr<TcpStore>>& stores,
                const std::string& prefix) {
  const int c = args.clients;
  std::vector<std::string> errors(c);
  Gate gate;
  Finish finish(c);
  std::vector<std::thread> threads;
  for (int i = 0; i < c; ++i) {
    threads.emplace_back([&, i] {
      TcpStore& s = *stores[i];
      for (int round = 1; round <= args.rounds; ++round) {
        gate.wait_for(round);
        std::string base = prefix + std::to_string(round) + "/";
        try {
          if (errors[i].empty()) {
            if (s.add(base + "count", 1) == c) s.set(base + "done", "");
            s.wait({base + "done"});
          }
        } catch (const StoreError& e) {
          errors[i] = e.what();
        }
        finish.arrive();
      }
    });
  }
  std::vector<double> ms;
  for (int round = 1; round <= args.rounds; ++round) {
    finish.reset();
    auto start = Clock::now();
    gate.open(round);
    finish.wait();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start)
                     .count());
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e.empty()) {
      std::cerr << "dl-store-bench: " << e << "\n";
      return 1;
    }
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "barrier: %d clients in %.1f ms (median of %d rounds, max %.1f "
      "ms)\n",
      c, ms[ms.size() / 2], args.rounds, ms.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"Measures a dlaunch store server under load.", "dl-store-bench"};
  app.add_option("--addr", args.addr,
                 "HOST:PORT of a running store; default: an in-process "
                 "server on 127.0.0.1");
  app.add_option("--clients", args.clients, "concurrent clients (threads)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--requests", args.requests,
                 "requests in all, split across clients (set/get/add)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--op", args.op, "set, get, add or barrier")
      ->capture_default_str()
      ->check(CLI::IsMember({"set", "get", "add", "barrier"}));
  app.add_option("--value-bytes", args.value_bytes, "value size for set/get")
      ->capture_default_str()
      ->check(CLI::Range(0, 64 << 20));
  app.add_option("--driver", args.driver,
                 "threads: one TcpStore per client thread; loop: one epoll "
                 "thread drives every connection (redis-benchmark's model; "
                 "set/get/add only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"threads", "loop"}));
  app.add_option("--rounds", args.rounds, "barrier rounds (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  if (auto status = dlaunch::comm::parse_or_exit(app, argc, argv)) {
    return *status;
  }

  if (args.driver == "loop" && args.op == "barrier") {
    std::cerr << "dl-store-bench: --op barrier needs --driver threads\n";
    return 2;
  }

  TcpStoreOptions options;
  std::unique_ptr<StoreServer> server;
  if (args.addr.empty()) {
    StoreServerOptions so;
    so.host = "127.0.0.1";
    server = StoreServer::start(so);
    options.host = "127.0.0.1";
    options.port = server->port();
    std::cerr << "dl-store-bench: in-process server on 127.0.0.1:"
              << server->port() << "\n";
  } else {
    auto colon = args.addr.rfind(':');
    int port = -1;
    if (colon != std::string::npos && colon > 0) {
      try {
        size_t used = 0;
        port = std::stoi(args.addr.substr(colon + 1), &used);
        if (used != args.addr.size() - colon - 1) port = -1;
      } catch (const std::exception&) {
        port = -1;
      }
    }
    if (port < 1 || port > 65535) {
      std::cerr << "dl-store-bench: --addr '" << args.addr
                << "' is not HOST:PORT with a port in 1..65535\n";
      return 2;
    }
    options.host = args.addr.substr(0, colon);
    options.port = static_cast<uint16_t>(port);
  }
  options.connect_timeout = std::chrono::seconds(10);

  // Keys unique to this run, so runs against one server do not interfere.
  std::string prefix = "bench/" + std::to_string(::getpid()) + "/" +
                       std::to_string(Clock::now().time_since_epoch().count()) +
                       "/";
  try {
    if (args.driver == "loop") return run_loop(args, options, prefix);
    std::vector<std::unique_ptr<TcpStore>> stores;
    stores.reserve(args.clients);
    for (int i = 0; i < args.clients; ++i) {
      stores.push_back(TcpStore::connect(options));
    }
    return args.op == "barrier" ? run_barrier(args, stores, prefix)
                                : run_ops(args, stores, prefix);
  } catch (const StoreError& e) {
    std::cerr << "dl-store-bench: " << e.what() << "\n";
    return 1;
  }
}
