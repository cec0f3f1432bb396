// The store server (StoreServer): the key-value map and what each request
// does to it, clients parked until their keys exist, a closed connection's
// appends, and start-up. Sockets and connections: server_connections.cc.

#include "comm/store/server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/check.h"
#include "comm/store/server_internal.h"
#include "comm/store/store.h"
#include "comm/store/text.h"

namespace dlaunch::comm::store {

namespace {

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

// Why the values of `keys` (all present) cannot go in one response, or
// "" when they can: a response over wire::kMaxResponseBytes would be
// refused by the client, and one over 4 GiB cannot be encoded at all.
// The body counted as wire.cc encodes it: a get's value after its 4-byte
// length; a multi_get's count, then each value after its length.
template <class Keys, class Find>
std::string oversized(const char* op, const Keys& keys, Find&& find) {
  const bool list = std::string_view(op) == "multi_get";
  uint64_t bytes = list ? 4 : 0;
  for (const auto& k : keys) bytes += 4 + find(k)->size();
  if (bytes <= wire::kMaxResponseBytes) return "";
  return std::string(op) + ": the answer would hold " + std::to_string(bytes) +
         " bytes, over the " + std::to_string(wire::kMaxResponseBytes >> 20) +
         " MiB a response may carry; ask for fewer keys per call";
}

// Why a write leaving `key` `bytes` long is refused, or "" when it fits
// in `max` (StoreServerOptions::max_value_bytes).
std::string too_big(const char* op, std::string_view key, uint64_t bytes,
                    uint64_t max) {
  if (bytes <= max) return "";
  return std::string(op) + ": key '" + std::string(key) + "' would hold " +
         std::to_string(bytes) + " bytes, over the " + std::to_string(max) +
         " a value may hold; the key is unchanged (split the value over "
         "several keys)";
}

}  // namespace

void StoreServer::Impl::on_closed(Connection& c) {
  if (c.pending()) admitted(c);
  if (c.parked()) unpark(c);
  // A peer that died (or went silent) is announced to whoever waits on the
  // keys it named; a server shutting down announces nothing.
  if (!shutting_down_) {
    for (const auto& [key, value] : c.on_close()) {
      if (std::string e = append_refused("append_on_close", key, value);
          !e.empty()) {
        spdlog::warn("store: a closed connection's {}", e);
        continue;
      }
      append(key, value);
    }
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
  const size_t max = options_.max_value_bytes;
  switch (r.type) {
    case MsgType::kSet: {
      if (std::string e = too_big("set", r.keys[0], r.values[0].size(), max);
          !e.empty()) {
        return respond_error(c, std::move(e));
      }
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
      if (std::string e = oversized("get", r.keys, finder()); !e.empty()) {
        return respond_error(c, std::move(e));
      }
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
      if (std::string e =
              too_big("compare_set", r.keys[0], r.values[1].size(), max);
          !e.empty()) {
        return respond_error(c, std::move(e));
      }
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
      } else if (std::string e = oversized("multi_get", r.keys, finder());
                 !e.empty()) {
        return respond_error(c, std::move(e));
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
        if (std::string e =
                too_big("multi_set", r.keys[i], r.values[i].size(), max);
            !e.empty()) {
          return respond_error(c, std::move(e) + "; no key was set");
        }
      }
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
    case MsgType::kAppend: {
      if (std::string e = append_refused("append", r.keys[0], r.values[0]);
          !e.empty()) {
        return respond_error(c, std::move(e));
      }
      out.type = MsgType::kInteger;
      out.integer = static_cast<int64_t>(append(r.keys[0], r.values[0]).size());
      break;
    }
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

std::string StoreServer::Impl::append_refused(const char* op,
                                              std::string_view key,
                                              std::string_view value) {
  const std::string* v = find(key);
  return too_big(op, key, (v ? v->size() : 0) + value.size(),
                 options_.max_value_bytes);
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
    // A key named twice is waited for once: `c` registers all its keys in
    // this one call, so an earlier entry for `k` is the list's last (N
    // copies cost every unpark() a scan per copy: N^2 with N in millions).
    if (!it->second.empty() && it->second.back() == &c) continue;
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
  std::string too_big;
  if (p.type != MsgType::kWait) {
    too_big = oversized(p.type == MsgType::kGet ? "get" : "multi_get", p.keys,
                        finder());
  }
  if (p.type == MsgType::kWait) {
    wake_response_.type = MsgType::kOk;
  } else if (!too_big.empty()) {
    wake_response_.type = MsgType::kError;
    wake_response_.message = std::move(too_big);
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
  if (options.max_value_bytes > wire::kMaxResponseBytes - 4) {
    throw StoreError(
        "max_value_bytes (" + std::to_string(options.max_value_bytes) +
        ") must be at most " + std::to_string(wire::kMaxResponseBytes - 4) +
        ", the longest value one get can return");
  }
  if (options.max_server_buffer_bytes < options.max_connection_buffer_bytes) {
    throw StoreError("max_server_buffer_bytes (" +
                     std::to_string(options.max_server_buffer_bytes) +
                     ") must be at least max_connection_buffer_bytes (" +
                     std::to_string(options.max_connection_buffer_bytes) + ")");
  }
  if (options.max_pending_connections == 0) {
    throw StoreError(
        "max_pending_connections must be at least 1 (0 would accept no "
        "connection)");
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
std::map<std::string, size_t> StoreServer::peer_hosts() const {
  return impl_->peer_hosts();
}

std::map<std::string, size_t> StoreServer::Impl::peer_hosts() {
  auto answer = std::make_shared<std::promise<std::map<std::string, size_t>>>();
  auto got = answer->get_future();
  asio::post(io_, [this, answer] {
    std::map<std::string, size_t> hosts;
    for (const auto& [ptr, c] : connections_) ++hosts[ptr->peer_host()];
    answer->set_value(std::move(hosts));
  });
  if (got.wait_for(std::chrono::seconds(1)) != std::future_status::ready) {
    return {};
  }
  return got.get();
}

bool StoreServer::wait_idle(std::chrono::milliseconds timeout) const {
  return impl_->wait_idle(timeout);
}

}  // namespace dlaunch::comm::store
