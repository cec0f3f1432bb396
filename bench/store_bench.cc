// dl-store-bench: load on a store server from C clients, each a TcpStore on
// its own thread (the way ranks use the store).
//
//   dl-store-bench [--addr HOST:PORT] --clients C --requests N --op set|get|add
//     prints "OP: R req/s, p50 X us, p99 Y us" (N requests in all)
//   dl-store-bench [--addr HOST:PORT] --clients C --op barrier [--rounds K]
//     each client adds to a counter, the last one sets a key and all wait
//     for it; prints "barrier: C clients in T ms" (median of K rounds)
//
// Without --addr it serves an in-process StoreServer on 127.0.0.1.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/client.h"
#include "comm/store/server.h"

namespace {

using dlaunch::comm::store::StoreError;
using dlaunch::comm::store::StoreServer;
using dlaunch::comm::store::StoreServerOptions;
using dlaunch::comm::store::TcpStore;
using dlaunch::comm::store::TcpStoreOptions;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string addr;
  int clients = 64;
  int64_t requests = 200000;
  std::string op = "set";
  int value_bytes = 3;  // redis-benchmark's default -d
  int rounds = 5;
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

// Counts finished clients; the main thread waits for all of them.
class Finish {
 public:
  void reset() { done_.store(0); }
  void arrive() {
    done_.fetch_add(1);
    done_.notify_all();
  }
  void wait_for(int n) {
    int now;
    while ((now = done_.load()) < n) done_.wait(now);
  }

 private:
  std::atomic<int> done_{0};
};

double percentile(std::vector<uint32_t>& v, double p) {
  if (v.empty()) return 0;
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i] / 1000.0;
}

int run_ops(const Args& args, std::vector<std::unique_ptr<TcpStore>>& stores,
            const std::string& prefix) {
  const int c = args.clients;
  std::string value(args.value_bytes, 'x');
  std::vector<std::vector<uint32_t>> lat(c);
  std::vector<std::string> errors(c);
  Gate gate;
  Finish finish;
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
          lat[i].push_back(static_cast<uint32_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(
                  Clock::now() - t0)
                  .count()));
        }
      } catch (const StoreError& e) {
        errors[i] = e.what();
      }
      finish.arrive();
    });
  }
  auto start = Clock::now();
  gate.open(1);
  finish.wait_for(c);
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
  std::printf("%s: %.0f req/s, p50 %.1f us, p99 %.1f us\n", args.op.c_str(),
              static_cast<double>(all.size()) / secs, percentile(all, 0.50),
              percentile(all, 0.99));
  return 0;
}

int run_barrier(const Args& args,
                std::vector<std::unique_ptr<TcpStore>>& stores,
                const std::string& prefix) {
  const int c = args.clients;
  std::vector<std::string> errors(c);
  Gate gate;
  Finish finish;
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
    finish.wait_for(c);
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
  app.add_option("--rounds", args.rounds, "barrier rounds (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
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

  try {
    std::vector<std::unique_ptr<TcpStore>> stores;
    stores.reserve(args.clients);
    for (int i = 0; i < args.clients; ++i) {
      stores.push_back(TcpStore::connect(options));
    }
    // Keys unique to this run, so runs against one server do not interfere.
    std::string prefix =
        "bench/" + std::to_string(::getpid()) + "/" +
        std::to_string(Clock::now().time_since_epoch().count()) + "/";
    return args.op == "barrier" ? run_barrier(args, stores, prefix)
                                : run_ops(args, stores, prefix);
  } catch (const StoreError& e) {
    std::cerr << "dl-store-bench: " << e.what() << "\n";
    return 1;
  }
}
