#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "etcd/etcdserverpb/rpc.grpc.pb.h"

namespace dlaunch::agent::rendezvous::etcd {

// How to reach an etcd cluster (--rdzv-endpoint and --rdzv-conf).
struct ClientOptions {
  // HOST:PORT of each member, tried in this order. Required.
  std::vector<std::string> endpoints;
  // TLS (cacert=, cert=, key=): PEM file paths. Empty cacert (default):
  // plain TCP. cert and key, both or neither: the client's certificate.
  std::string cacert;
  std::string cert;
  std::string key;
  // etcd user (user=) and its password (read from password_file=). Empty
  // user (default): no authentication.
  std::string user;
  std::string password;
  // Bound on one request, over every endpoint tried (read_timeout).
  // Default 60 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // How long a member may take to answer before the next one is tried.
  // Default 5 s.
  std::chrono::milliseconds attempt_timeout{std::chrono::seconds(5)};
};

// etcd failed or no member answered; the message names the request and
// every endpoint tried with its error.
class EtcdError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Client;

// A watch on the keys [key, range_end) from a revision on (or from
// "now"), on a stream of its own: events come in revision order; after a
// member fails it resumes on another from the revision after the last
// seen. rewatch() moves it to other keys on the same stream and thread
// (a new stream and thread cost each agent's helper more than the move).
// Owned by its user; next(), first_revision(), wait_sent() and
// interrupt() may be called from different threads, rewatch() from one
// at a time.
class Watch {
 public:
  ~Watch();
  // Watches [key, range_end) from `start_revision` (0: from now) instead:
  // the earlier keys' events, queued or to come, are dropped (etcd is told
  // to stop them), and first_revision() and wait_sent() start over. False
  // once the watch failed for good (next() threw): make a new one.
  bool rewatch(const std::string& key, const std::string& range_end,
               int64_t start_revision);
  // Stops watching (etcd is told) but keeps the stream for a later
  // rewatch(): no events come until then.
  void pause();
  // The next event, or nullopt at `deadline` or after interrupt(). Throws
  // EtcdError once no member could serve the watch within the client's
  // timeout.
  std::optional<mvccpb::Event> next(
      std::chrono::steady_clock::time_point deadline);
  // The first revision whose events this watch reports: its start
  // revision, or for a watch from now the one after etcd's revision when
  // it took the watch (waited for). nullopt at `deadline` or after
  // interrupt(); throws EtcdError as next() does.
  std::optional<int64_t> first_revision(
      std::chrono::steady_clock::time_point deadline);
  // Waits (at most to `deadline`, or until interrupt() or a failure) for
  // the watch's request to be sent to etcd: a write sent after that
  // nearly always lands after etcd took the watch, so a watch from now
  // sees it rather than needing a read (first_revision() says for sure).
  void wait_sent(std::chrono::steady_clock::time_point deadline);
  // Wakes a next() in progress (and the next one) with nullopt.
  void interrupt();

 private:
  friend class Client;
  using Stream = grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                          etcdserverpb::WatchResponse>;
  Watch(Client& client, std::string key, std::string range_end,
        int64_t start_revision);
  void run();
  // The request that creates the current watch on a stream (mu_ held).
  etcdserverpb::WatchRequest create_request() const;
  // The request that cancels the current watch, whose queued and later
  // events are dropped from now on (mu_ held).
  etcdserverpb::WatchRequest end_current();

  Client& client_;
  std::thread thread_;
  // Serialises the requests written to the stream, so that a watch is
  // created on it once, before rewatch() cancels it. Taken before mu_.
  std::mutex write_mu_;
  Stream* stream_ = nullptr;  // the open stream, if any (write_mu_)
  std::mutex mu_;             // guards everything below
  std::string key_, range_end_;
  int64_t next_revision_;       // 0: from now, until etcd took the watch
  int64_t first_revision_ = 0;  // 0 until etcd took the watch
  // The current watch's id on the stream (etcd 3.4 takes the client's):
  // responses for the earlier ones are dropped.
  int64_t watch_id_ = 1;
  std::condition_variable cv_;
  std::deque<mvccpb::Event> events_;
  std::string error_;  // set once the watch failed for good
  bool interrupted_ = false;
  bool sent_ = false;    // the request went out (on some member)
  bool paused_ = false;  // no watch on the stream (pause())
  bool stopping_ = false;
  grpc::ClientContext* ctx_ = nullptr;  // the stream's, for stopping it
};

// A client of etcd's v3 gRPC API that fails over among the listed members:
// a request that a member does not answer (refused, unreachable, no
// leader, silent for attempt_timeout) is retried on the next, until the
// client's timeout. Thread-safe.
class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();

  // Unary requests; `timeout` overrides the client's for this request.
  etcdserverpb::RangeResponse range(
      const etcdserverpb::RangeRequest& req,
      std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  etcdserverpb::PutResponse put(const etcdserverpb::PutRequest& req);
  etcdserverpb::TxnResponse txn(const etcdserverpb::TxnRequest& req);
  // A lease of about `ttl` (etcd may round it up): its id and granted TTL.
  // `sent`, if given, gets when the request that was granted went out:
  // etcd expires the lease no earlier than the TTL from then.
  etcdserverpb::LeaseGrantResponse lease_grant(
      std::chrono::seconds ttl,
      std::optional<std::chrono::milliseconds> timeout = std::nullopt,
      std::chrono::steady_clock::time_point* sent = nullptr);
  void lease_revoke(int64_t id, std::chrono::milliseconds timeout);
  // One keep-alive of lease `id`; returns the TTL etcd granted (<= 0: the
  // lease is gone). Throws EtcdError when no member answered in `timeout`.
  int64_t lease_keep_alive(int64_t id, std::chrono::milliseconds timeout);
  // Events of [key, range_end) from `start_revision` on; 0: from when
  // etcd takes the watch (Watch::first_revision() says which). etcd serves
  // a watch from a past revision through a loop that runs every 100 ms
  // once writes came since, so its events may come that much later; a
  // watch from now gets them at once.
  std::unique_ptr<Watch> watch(const std::string& key,
                               const std::string& range_end,
                               int64_t start_revision);

  // Cancels the requests in flight and fails every later one at once
  // (the rendezvous is over: its lease expired). Any thread.
  void cancel();

  // "127.0.0.1:2379, 127.0.0.1:22379": for messages.
  std::string endpoints_text() const;

 private:
  friend class Watch;
  struct Member;
  template <typename Call>
  void call(const char* what, std::chrono::milliseconds timeout, Call&& fn);
  // Connects to a member for a stream, failing over; returns its index.
  size_t connect_stream(std::chrono::milliseconds timeout);
  // Adds member m's token to ctx, logging in first (bounded by
  // `deadline`) when there is none. Throws grpc::Status when m did not
  // answer, EtcdError when it refused the user.
  void authenticate(Member& m, grpc::ClientContext& ctx,
                    std::chrono::steady_clock::time_point deadline);
  void prepare(Member& m, grpc::ClientContext& ctx,
               std::chrono::steady_clock::time_point deadline);

  ClientOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  mutable std::mutex mu_;  // guards the members' tokens and below
  size_t current_ = 0;     // the member requests go to first
  std::set<grpc::ClientContext*> inflight_;  // unary requests, for cancel()
  bool cancelled_ = false;
};

// The first key after every key that starts with `prefix` (etcd's
// range_end for a prefix).
std::string prefix_end(const std::string& prefix);

}  // namespace dlaunch::agent::rendezvous::etcd
