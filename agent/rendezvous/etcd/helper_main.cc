// dlaunch-rdzv-etcd: the etcd rendezvous backend as a program of its own,
// started by the agent for --rdzv-backend etcd (remote_rendezvous.h). It
// reads the agent's requests on stdin and answers on stdout (one socket
// pair; protocol in remote_wire.h). End-of-file on stdin means the agent
// is gone or done: the helper revokes its lease (its keys vanish, so the
// other nodes see this one leave at once) and exits.

#include <absl/synchronization/mutex.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "agent/rendezvous/etcd/etcd_rendezvous.h"
#include "agent/rendezvous/remote_wire.h"
#include "agent/worker_env.h"
#include "comm/store/resolve.h"
#include "comm/store/text.h"

namespace {

using namespace dlaunch::agent::rendezvous;
namespace remote = dlaunch::agent::rendezvous::remote;
using std::chrono::milliseconds;

std::mutex out_mu;

void send(const std::vector<std::string>& fields) {
  const std::string line = remote::encode_line(fields);
  std::lock_guard<std::mutex> lock(out_mu);
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(STDOUT_FILENO, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the agent is gone: stdin's end-of-file follows
    off += static_cast<size_t>(n);
  }
}

void log_line(const std::string& text) { send({"log", text}); }

std::string setting(const std::map<std::string, std::string>& s,
                    const std::string& key) {
  auto it = s.find(key);
  return it == s.end() ? "" : it->second;
}

// The password: the file's first line (a trailing newline is no part of
// it). The agent passes the path only, so the password is in no argv.
std::string read_password(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw RendezvousError("cannot read password_file '" + path +
                          "' (--rdzv-conf); check the path and permissions");
  }
  std::string line;
  // A folder opens and reads nothing; an empty first line is no password
  // either: both would log in with "" and fail as a wrong password.
  if (!std::getline(in, line) || line.empty() || line == "\r") {
    throw RendezvousError("password_file '" + path +
                          "' (--rdzv-conf) holds no password (a folder, or "
                          "an empty first line); put the password on its "
                          "first line");
  }
  if (line.back() == '\r') line.pop_back();
  return line;
}

etcd::EtcdRendezvous::Params make_params(
    const std::map<std::string, std::string>& s) {
  if (setting(s, "protocol") != std::to_string(remote::kProtocolVersion)) {
    throw RendezvousError("dlaunch-rdzv-etcd speaks protocol " +
                          std::to_string(remote::kProtocolVersion) +
                          ", the agent " + setting(s, "protocol") +
                          "; install matching dlaunch programs");
  }
  etcd::EtcdRendezvous::Params p;
  p.options = remote::decode_options(s);
  const RendezvousOptions& o = p.options;
  p.client.endpoints = o.etcd_endpoints;
  p.client.cacert = o.cacert;
  p.client.cert = o.cert;
  p.client.key = o.key;
  p.client.user = o.user;
  if (!o.password_file.empty()) {
    p.client.password = read_password(o.password_file);
  }
  p.client.timeout = o.read_timeout;
  p.run_id = setting(s, "run_id");
  p.node_addr = setting(s, "node_addr");
  p.master_port = remote::wire_int(setting(s, "master_port"));
  p.pick_port = [](const std::string& host) {
    std::string error;
    int port = dlaunch::comm::store::free_port(
        host, std::chrono::steady_clock::now() + std::chrono::seconds(30),
        error);
    if (port < 0) throw RendezvousError(error + "; check --local-addr");
    return port;
  };
  p.log = log_line;
  p.agent_silence = milliseconds(remote::wire_int(setting(s, "agent_silence")));
  // Test-only: the node (this helper and its agent) dies by SIGKILL as its
  // "done" completes the exit barrier's set, before it puts "end".
  // Only the agent that started this helper: once it is gone, getppid()
  // is whoever adopted the helper (a subreaper, init), never to be killed.
  if (const char* t = std::getenv(dlaunch::agent::kEtcdTestDieBeforeEnd);
      t && *t) {
    p.before_end = [agent = ::getppid()] {
      if (::getppid() == agent) ::kill(agent, SIGKILL);
      ::raise(SIGKILL);
    };
  }
  return p;
}

// Runs the agent's requests in order on one thread, so that the reader
// sees end-of-file even while a round forms.
class Executor {
 public:
  Executor() : thread_([this] { run(); }) {}
  void push(std::vector<std::string> request) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(request));
    cv_.notify_all();
  }
  // The rendezvous once open (for revoking at end-of-file), or null.
  etcd::EtcdRendezvous* rendezvous() {
    std::lock_guard<std::mutex> lock(mu_);
    return rdzv_.get();
  }
  // The agent's close_timeout (30 s until open).
  milliseconds close_timeout() {
    std::lock_guard<std::mutex> lock(mu_);
    return close_timeout_;
  }
  // Waits (at most `timeout`) until every request queued so far ran, so
  // that a report sent just before end-of-file reaches etcd before the
  // lease goes; a round still forming (next, open) or the exit barrier's
  // question (unfinished) is not waited for.
  // Returns the verb of the request still running at `timeout` (etcd did
  // not answer it), or of the first one queued behind a forming round
  // (never started), "" when drained.
  std::string drain(milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto forming = [this] {
      return busy_.empty() || busy_ == "next" || busy_ == "open" ||
             busy_ == "unfinished";
    };
    if (cv_.wait_for(lock, timeout,
                     [&] { return queue_.empty() && forming(); })) {
      return "";
    }
    return forming() ? queue_.front()[0] : busy_;
  }

 private:
  void run() {
    while (true) {
      std::vector<std::string> req;
      {
        std::unique_lock<std::mutex> lock(mu_);
        busy_.clear();
        cv_.notify_all();
        cv_.wait(lock, [this] { return !queue_.empty(); });
        req = std::move(queue_.front());
        queue_.pop_front();
        busy_ = req[0];
      }
      handle(req);
    }
  }

  void handle(const std::vector<std::string>& req) {
    const std::string& verb = req[0];
    try {
      if (verb == "open") {
        auto params =
            make_params(remote::decode_settings({req.begin() + 1, req.end()}));
        const milliseconds close = params.options.close_timeout;
        auto r = std::make_unique<etcd::EtcdRendezvous>(std::move(params));
        std::lock_guard<std::mutex> lock(mu_);
        rdzv_ = std::move(r);
        close_timeout_ = close;
        send({"ready"});
        return;
      }
      if (!rdzv_) throw RendezvousError("'" + verb + "' before open");
      if (verb == "next" && req.size() == 4) {
        RendezvousResult r = rdzv_->next_round(
            remote::wire_int(req[1]),
            remote::reason_from_wire(remote::wire_int(req[2])),
            milliseconds(remote::wire_int(req[3])));
        std::vector<std::string> f = {"round"};
        for (std::string& x : remote::encode_result(r)) f.push_back(x);
        send(f);
      } else if (verb == "watch") {
        rdzv_->watch([](const RoundEvent& e) {
          send({"event", std::to_string(remote::to_wire(e.kind)),
                std::to_string(e.round), e.detail});
        });
      } else if (verb == "cut" && req.size() == 2) {
        rdzv_->cut_off(milliseconds(remote::wire_int(req[1])));
      } else if (verb == "report" && req.size() == 2) {
        rdzv_->report(remote::outcome_from_wire(remote::wire_int(req[1])));
      } else if (verb == "unfinished") {
        std::vector<std::string> f = {"unfinished"};
        for (std::string& n : rdzv_->unfinished_nodes()) f.push_back(n);
        send(f);
      } else {
        throw RendezvousError("unknown request '" + verb + "'");
      }
    } catch (const RendezvousClosed& e) {
      send({"error", "closed", e.what()});
    } catch (const std::exception& e) {
      send({"error", "error", e.what()});
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<std::string>> queue_;
  std::string busy_;  // the verb of the request running now
  milliseconds close_timeout_{std::chrono::seconds(30)};
  std::unique_ptr<etcd::EtcdRendezvous> rdzv_;
  std::thread thread_;
};

}  // namespace

int main(int argc, char**) {
  if (argc > 1 || ::isatty(STDIN_FILENO)) {
    std::cerr << "dlaunch-rdzv-etcd: the etcd rendezvous backend of dlaunch; "
                 "dlaunch starts it for --rdzv-backend etcd (it is not meant "
                 "to be run by hand)\n";
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  // One malloc arena for all threads (gRPC's, the watch's, ours): each
  // arena a thread would make costs mappings and page faults at start,
  // for allocations this small and this rare (docs/performance.md).
  ::mallopt(M_ARENA_MAX, 1);
  // Debian's abseil is built without NDEBUG, so every absl::Mutex of
  // gRPC's kept a lock graph for deadlock detection (a debugging aid
  // that costs each lock and unlock; docs/performance.md).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Executor exec;
  std::string buf;
  char chunk[4096];
  while (true) {
    ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      try {
        auto f = remote::decode_line(buf.substr(0, nl));
        if (f.size() == 1 && f[0] == "alive") {
          // Not queued: a forming round must not hold up the agent's pings.
          if (auto* r = exec.rendezvous()) r->agent_alive();
        } else if (!f.empty() && !f[0].empty()) {
          exec.push(std::move(f));
        }
      } catch (const std::invalid_argument& e) {
        send({"error", "error", std::string("bad request: ") + e.what()});
      }
      buf.erase(0, nl + 1);
    }
  }
  // The agent is gone or done: leave the rendezvous now. The executor may
  // be inside a request; the process ends under it.
  // Both within the agent's close_timeout, after which it SIGKILLs us.
  const milliseconds half = exec.close_timeout() / 2;
  const milliseconds wait =
      std::min<milliseconds>(half, std::chrono::seconds(10));
  if (const std::string left = exec.drain(wait); !left.empty()) {
    // etcd is slow or cut off: the request is abandoned (the process ends
    // under it), not waited for to the client's read_timeout.
    const std::string what =
        left == "report"       ? "report of its workers' outcome (exit barrier)"
        : left == "watch"      ? "watch of its rounds"
        : left == "cut"        ? "cut fault"
        : left == "unfinished" ? "question of whom its exit barrier waits for"
                               : "'" + left + "' request";
    auto* r = exec.rendezvous();
    log_line("dlaunch: etcd" +
             (r != nullptr ? " (" + r->endpoints_text() + ")" : "") +
             " did not complete this node's " + what + " within " +
             dlaunch::comm::store::format_duration(wait) +
             " of the agent closing the rendezvous; leaving without it. The "
             "other nodes see this node leave when its lease is revoked, or, "
             "if etcd cannot be reached for that either, when the lease "
             "expires (its TTL); check that etcd is reachable from this "
             "host\n");
  }
  if (auto* r = exec.rendezvous()) {
    r->abandon(std::min<milliseconds>(half, std::chrono::seconds(5)));
  }
  std::cout.flush();
  std::_Exit(0);
}
