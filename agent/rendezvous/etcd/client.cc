#include "agent/rendezvous/etcd/client.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

namespace dlaunch::agent::rendezvous::etcd {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_pem(const std::string& what, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw EtcdError("cannot read " + what + " '" + path +
                    "' (--rdzv-conf); check the path and its permissions");
  }
  std::stringstream s;
  s << in.rdbuf();
  // A folder opens and reads nothing: gRPC would then fail the handshake
  // without naming the file.
  if (s.str().empty()) {
    throw EtcdError(what + " '" + path +
                    "' (--rdzv-conf) is empty or a folder; give a PEM file");
  }
  return s.str();
}

std::string seconds_text(milliseconds d) {
  std::ostringstream s;
  s << static_cast<double>(d.count()) / 1000.0 << " s";
  return s.str();
}

// Worth trying another member: this one is down, cut off, without a
// leader or too slow.
bool retryable(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

// gRPC takes deadlines on the system clock.
std::chrono::system_clock::time_point wall(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - Clock::now());
}

bool bad_token(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
         s.error_message().find("auth token") != std::string::npos;
}

// gRPC's target for HOST:PORT: an IP address goes straight to the
// address resolver (no DNS resolver, no c-ares), a name through DNS.
std::string channel_target(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos) return endpoint;
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    in6_addr a6;
    if (::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a6) ==
        1) {
      return "ipv6:" + endpoint;
    }
    return endpoint;
  }
  in_addr a4;
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) return "ipv4:" + endpoint;
  return endpoint;
}

}  // namespace

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// One etcd member: its channel, stubs and (with auth) its token, which
// is valid on that member only.
struct Client::Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  std::string token;  // guarded by Client::mu_
};

Client::Client(ClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) {
    throw EtcdError("no etcd endpoint given; use --rdzv-endpoint HOST:2379");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!options_.cacert.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = read_pem("cacert", options_.cacert);
    if (options_.cert.empty() != options_.key.empty()) {
      throw EtcdError(
          "--rdzv-conf needs cert= and key= together (the client's "
          "certificate and its private key)");
    }
    if (!options_.cert.empty()) {
      ssl.pem_cert_chain = read_pem("cert", options_.cert);
      ssl.pem_private_key = read_pem("key", options_.key);
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    if (!options_.cert.empty() || !options_.key.empty()) {
      throw EtcdError(
          "--rdzv-conf cert= and key= need cacert= too (the CA that signed "
          "the etcd members' certificates)");
    }
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  // A member that comes back is used again soon, not after gRPC's
  // default two-minute backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Less work per start and per message (docs/performance.md, "Rendezvous
  // on etcd"): no flow-control probes (pings) for our small messages, no
  // channelz bookkeeping.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_ENABLE_CHANNELZ, 0);
  for (const std::string& ep : options_.endpoints) {
    auto m = std::make_unique<Member>();
    m->endpoint = ep;
    m->channel = grpc::CreateCustomChannel(channel_target(ep), creds, args);
    m->kv = etcdserverpb::KV::NewStub(m->channel);
    m->lease = etcdserverpb::Lease::NewStub(m->channel);
    m->watch = etcdserverpb::Watch::NewStub(m->channel);
    m->auth = etcdserverpb::Auth::NewStub(m->channel);
    members_.push_back(std::move(m));
  }
}

Client::~Client() = default;

void Client::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  for (grpc::ClientContext* ctx : inflight_) ctx->TryCancel();
}

std::string Client::endpoints_text() const {
  std::string s;
  for (const auto& m : members_) s += (s.empty() ? "" : ", ") + m->endpoint;
  return s;
}

void Client::authenticate(Member& m, grpc::ClientContext& ctx,
                          Clock::time_point deadline) {
  if (options_.user.empty()) return;
  std::string token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    token = m.token;
  }
  if (token.empty()) {
    grpc::ClientContext actx;
    actx.set_deadline(wall(deadline));
    etcdserverpb::AuthenticateRequest req;
    req.set_name(options_.user);
    req.set_password(options_.password);
    etcdserverpb::AuthenticateResponse resp;
    grpc::Status s = m.auth->Authenticate(&actx, req, &resp);
    if (!s.ok()) {
      if (retryable(s)) throw s;
      throw EtcdError("etcd at " + m.endpoint + " refused user '" +
                      options_.user + "': " + s.error_message() +
                      "; check user= and the password in password_file=");
    }
    token = resp.token();
    std::lock_guard<std::mutex> lock(mu_);
    m.token = token;
  }
  ctx.AddMetadata("token", token);
}

void Client::prepare(Member& m, grpc::ClientContext& ctx,
                     Clock::time_point deadline) {
  ctx.set_deadline(wall(deadline));
  authenticate(m, ctx, deadline);
}

template <typename Call>
void Client::call(const char* what, milliseconds timeout, Call&& fn) {
  const auto deadline = Clock::now() + timeout;
  const size_t n = members_.size();
  std::vector<std::string> errors(n);
  size_t start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start = current_;
  }
  bool token_retried = false;
  for (size_t attempt = 0;; ++attempt) {
    const size_t i = (start + attempt) % n;
    Member& m = *members_[i];
    const auto now = Clock::now();
    if (now >= deadline && attempt >= n) break;
    grpc::Status s;
    grpc::ClientContext ctx;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) {
        throw EtcdError(std::string("etcd ") + what +
                        ": the client was stopped");
      }
      inflight_.insert(&ctx);
    }
    struct Forget {  // whatever leaves this attempt, cancel() must not see ctx
      Client* c;
      grpc::ClientContext* ctx;
      ~Forget() {
        std::lock_guard<std::mutex> lock(c->mu_);
        c->inflight_.erase(ctx);
      }
    } forget{this, &ctx};
    try {
      prepare(m, ctx, std::min(deadline, now + options_.attempt_timeout));
      // First pass: a member that refuses fails at once and the next is
      // tried; later passes wait (to the attempt's deadline) for members
      // to come up instead of spinning.
      ctx.set_wait_for_ready(attempt >= n);
      s = fn(m, ctx);
    } catch (const grpc::Status& st) {
      s = st;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) {
        throw EtcdError(std::string("etcd ") + what +
                        ": the client was stopped");
      }
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = i;
      return;
    }
    if (bad_token(s) && !token_retried) {
      // The token expired or belongs to another member: log in again.
      token_retried = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        m.token.clear();
      }
      --attempt;
      continue;
    }
    if (!retryable(s)) {
      throw EtcdError(std::string("etcd ") + what + " at " + m.endpoint +
                      " failed: " + s.error_message());
    }
    errors[i] = s.error_message();
    // The next request starts at the next member rather than waiting
    // on this one again (a caller with a short timeout, the keep-alive,
    // would otherwise never get past a member that hangs).
    std::lock_guard<std::mutex> lock(mu_);
    if (current_ == i) current_ = (i + 1) % n;
  }
  std::string tried;
  for (size_t i = 0; i < n; ++i) {
    tried += (i ? "; " : "") + members_[i]->endpoint + " (" +
             (errors[i].empty() ? "not tried" : errors[i]) + ")";
  }
  throw EtcdError(std::string("no etcd member answered ") + what + " within " +
                  seconds_text(timeout) + "; tried " + tried +
                  ". Start etcd or check --rdzv-endpoint");
}

etcdserverpb::RangeResponse Client::range(const etcdserverpb::RangeRequest& req,
                                          std::optional<milliseconds> timeout) {
  etcdserverpb::RangeResponse resp;
  call("range", timeout.value_or(options_.timeout),
       [&](Member& m, grpc::ClientContext& ctx) {
         return m.kv->Range(&ctx, req, &resp);
       });
  return resp;
}

etcdserverpb::PutResponse Client::put(const etcdserverpb::PutRequest& req) {
  etcdserverpb::PutResponse resp;
  call("put", options_.timeout, [&](Member& m, grpc::ClientContext& ctx) {
    return m.kv->Put(&ctx, req, &resp);
  });
  return resp;
}

etcdserverpb::TxnResponse Client::txn(const etcdserverpb::TxnRequest& req) {
  etcdserverpb::TxnResponse resp;
  call("txn", options_.timeout, [&](Member& m, grpc::ClientContext& ctx) {
    return m.kv->Txn(&ctx, req, &resp);
  });
  return resp;
}

etcdserverpb::LeaseGrantResponse Client::lease_grant(
    std::chrono::seconds ttl, std::optional<milliseconds> timeout,
    Clock::time_point* sent) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  etcdserverpb::LeaseGrantResponse resp;
  call("lease grant", timeout.value_or(options_.timeout),
       [&](Member& m, grpc::ClientContext& ctx) {
         if (sent) *sent = Clock::now();  // the last attempt's is the one
         return m.lease->LeaseGrant(&ctx, req, &resp);
       });
  if (!resp.error().empty()) throw EtcdError("lease grant: " + resp.error());
  return resp;
}

void Client::lease_revoke(int64_t id, milliseconds timeout) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  call("lease revoke", timeout, [&](Member& m, grpc::ClientContext& ctx) {
    grpc::Status s = m.lease->LeaseRevoke(&ctx, req, &resp);
    // Already expired: nothing left to revoke.
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return grpc::Status::OK;
    return s;
  });
}

int64_t Client::lease_keep_alive(int64_t id, milliseconds timeout) {
  int64_t ttl = 0;
  call("lease keep-alive", timeout, [&](Member& m, grpc::ClientContext& ctx) {
    auto stream = m.lease->LeaseKeepAlive(&ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(id);
    etcdserverpb::LeaseKeepAliveResponse resp;
    if (!stream->Write(req) || !stream->Read(&resp)) {
      grpc::Status s = stream->Finish();
      return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "keep-alive stream closed")
                    : s;
    }
    ttl = resp.ttl();
    ctx.TryCancel();  // one round trip is all this call wants
    stream->Finish();
    return grpc::Status::OK;
  });
  return ttl;
}

size_t Client::connect_stream(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const size_t n = members_.size();
  size_t start;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start = current_;
  }
  std::vector<bool> tried(n, false);
  for (size_t attempt = 0;; ++attempt) {
    const size_t i = (start + attempt) % n;
    const auto now = Clock::now();
    if (now >= deadline && attempt >= n) break;
    tried[i] = true;
    Member& m = *members_[i];
    if (m.channel->WaitForConnected(
            wall(std::min(deadline, now + options_.attempt_timeout)))) {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = i;
      return i;
    }
  }
  throw EtcdError("no etcd member accepted a watch within " +
                  seconds_text(timeout) + "; tried " + endpoints_text() +
                  ". Start etcd or check --rdzv-endpoint");
}

std::unique_ptr<Watch> Client::watch(const std::string& key,
                                     const std::string& range_end,
                                     int64_t start_revision) {
  std::unique_ptr<Watch> w(new Watch(*this, key, range_end, start_revision));
  w->thread_ = std::thread([p = w.get()] { p->run(); });
  return w;
}

Watch::Watch(Client& client, std::string key, std::string range_end,
             int64_t start_revision)
    : client_(client),
      key_(std::move(key)),
      range_end_(std::move(range_end)),
      next_revision_(start_revision),
      first_revision_(start_revision) {}

Watch::~Watch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (ctx_) ctx_->TryCancel();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

etcdserverpb::WatchRequest Watch::create_request() const {
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(key_);
  create->set_range_end(range_end_);
  create->set_start_revision(next_revision_);
  create->set_watch_id(watch_id_);
  return req;
}

bool Watch::rewatch(const std::string& key, const std::string& range_end,
                    int64_t start_revision) {
  std::lock_guard<std::mutex> write(write_mu_);
  etcdserverpb::WatchRequest cancel, create;
  bool was_paused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty() || stopping_) return false;
    was_paused = paused_;
    cancel = end_current();
    key_ = key;
    range_end_ = range_end;
    next_revision_ = start_revision;
    first_revision_ = start_revision;
    interrupted_ = false;
    sent_ = false;
    paused_ = false;
    create = create_request();
  }
  // Without an open stream (connecting, or failing over) the thread
  // creates the new watch when it opens one. A write that fails ends the
  // stream's reads too, and the thread resumes on the next member.
  if (stream_ && (was_paused || stream_->Write(cancel)) &&
      stream_->Write(create)) {
    std::lock_guard<std::mutex> lock(mu_);
    sent_ = true;
    cv_.notify_all();
  }
  return true;
}

void Watch::pause() {
  std::lock_guard<std::mutex> write(write_mu_);
  etcdserverpb::WatchRequest cancel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (paused_ || !error_.empty() || stopping_) return;
    paused_ = true;
    cancel = end_current();
  }
  if (stream_) stream_->Write(cancel);
}

etcdserverpb::WatchRequest Watch::end_current() {
  etcdserverpb::WatchRequest cancel;
  cancel.mutable_cancel_request()->set_watch_id(watch_id_);
  ++watch_id_;  // whatever still comes for the old one is dropped
  events_.clear();
  return cancel;
}

void Watch::interrupt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_ = true;
  }
  cv_.notify_all();
}

std::optional<int64_t> Watch::first_revision(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [this] {
    return first_revision_ > 0 || interrupted_ || !error_.empty();
  });
  if (first_revision_ > 0) return first_revision_;
  if (interrupted_) {
    interrupted_ = false;
    return std::nullopt;
  }
  if (!error_.empty()) throw EtcdError(error_);
  return std::nullopt;
}

void Watch::wait_sent(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline,
                 [this] { return sent_ || interrupted_ || !error_.empty(); });
}

std::optional<mvccpb::Event> Watch::next(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [this] {
    return !events_.empty() || interrupted_ || !error_.empty();
  });
  if (!events_.empty()) {
    mvccpb::Event ev = std::move(events_.front());
    events_.pop_front();
    return ev;
  }
  if (interrupted_) {
    interrupted_ = false;
    return std::nullopt;
  }
  if (!error_.empty()) throw EtcdError(error_);
  return std::nullopt;
}

void Watch::run() {
  auto fail = [this](const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = why;
    cv_.notify_all();
  };
  while (true) {
    size_t i;
    try {
      i = client_.connect_stream(client_.options_.timeout);
    } catch (const EtcdError& e) {
      fail(e.what());
      return;
    }
    Client::Member& m = *client_.members_[i];
    grpc::ClientContext ctx;
    try {
      // The login's own request is bounded; the stream is not.
      client_.authenticate(m, ctx,
                           Clock::now() + client_.options_.attempt_timeout);
    } catch (const grpc::Status&) {
      continue;  // that member did not answer: connect_stream picks again
    } catch (const EtcdError& e) {
      fail(e.what());
      return;
    }
    std::unique_ptr<Stream> stream;
    bool sent;
    {
      // The current watch (the latest rewatch()'s) is created once on
      // this stream: a rewatch() from here on writes to it itself.
      std::lock_guard<std::mutex> write(write_mu_);
      etcdserverpb::WatchRequest req;
      bool paused;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
        ctx_ = &ctx;
        paused = paused_;
        req = create_request();
      }
      stream = m.watch->Watch(&ctx);
      sent = paused || stream->Write(req);
      if (sent) {
        stream_ = stream.get();
        std::lock_guard<std::mutex> lock(mu_);
        sent_ = !paused;
        cv_.notify_all();
      }
    }
    etcdserverpb::WatchResponse resp;
    std::string canceled;
    while (sent && stream->Read(&resp)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (resp.watch_id() != watch_id_) continue;  // an earlier watch's
      if (resp.canceled()) {
        canceled = resp.cancel_reason().empty()
                       ? "the watch was canceled by etcd"
                       : resp.cancel_reason();
        break;
      }
      if (resp.created() && next_revision_ == 0) {
        // From now: etcd reports every event after its revision then.
        next_revision_ = resp.header().revision() + 1;
        first_revision_ = next_revision_;
        cv_.notify_all();
      }
      for (const auto& ev : resp.events()) {
        events_.push_back(ev);
        next_revision_ = ev.kv().mod_revision() + 1;
      }
      if (resp.events_size() > 0) cv_.notify_all();
    }
    {
      // No rewatch() writes to the stream once it is finished.
      std::lock_guard<std::mutex> write(write_mu_);
      stream_ = nullptr;
    }
    ctx.TryCancel();
    grpc::Status st = stream->Finish();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx_ = nullptr;
      if (stopping_) return;
    }
    if (!canceled.empty()) {
      std::string key;
      {
        std::lock_guard<std::mutex> lock(mu_);
        key = key_;
      }
      fail("etcd watch on " + key + " at " + m.endpoint + ": " + canceled);
      return;
    }
    if (bad_token(st)) {
      std::lock_guard<std::mutex> lock(client_.mu_);
      m.token.clear();
      continue;
    }
    // The member went away: resume on the next one.
    std::lock_guard<std::mutex> lock(client_.mu_);
    if (client_.current_ == i) {
      client_.current_ = (i + 1) % client_.members_.size();
    }
  }
}

}  // namespace dlaunch::agent::rendezvous::etcd
