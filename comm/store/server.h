#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "comm/store/wire.h"

namespace dlaunch::comm::store {

struct StoreServerOptions {
  // Address to bind. Default "0.0.0.0": every IPv4 interface.
  std::string host = "0.0.0.0";
  // Port to bind. Default 0: the kernel picks a free port; read it back with
  // StoreServer::port().
  uint16_t port = 0;
  // Largest frame body a client may send; a longer frame closes that
  // client's connection. Default 64 MiB.
  size_t max_frame_bytes = wire::kDefaultMaxFrameBytes;
  // Largest value a key may hold: a write (set, multi_set, compare_set,
  // append) that would leave one longer is answered with an error and
  // changes nothing. At most, and by default, what one get can return:
  // wire::kMaxResponseBytes less the value's 4-byte length.
  size_t max_value_bytes = wire::kMaxResponseBytes - 4;
  // listen() backlog: room for a connect storm of many ranks. Default 4096
  // (the kernel caps it at net.core.somaxconn).
  int backlog = 4096;
  // Request bytes one connection may have buffered (received, not yet
  // handled); at the limit the server stops reading it until its requests
  // are served. At least max_frame_bytes plus its 5-byte header. Default
  // 65 MiB (one largest frame and room to read around it).
  size_t max_connection_buffer_bytes =
      wire::kDefaultMaxFrameBytes + (size_t{1} << 20);
  // Request bytes all connections together may have buffered beyond each
  // one's first 64 KiB; a connection whose data would go over it is closed
  // with a log line. At least max_connection_buffer_bytes. Default 1 GiB.
  size_t max_server_buffer_bytes = size_t{1} << 30;
  // Connections accepted that have not yet completed their hello (and the
  // token, when one is required): at this many the server accepts no more,
  // leaving new ones in the listen backlog, until one completes or its
  // handshake_timeout closes it (a pause that lasts a second is logged).
  // Strangers that connect and say nothing so hold at most this many
  // descriptors, and admitted clients are served meanwhile. At least 1.
  // Default 16384: a connect storm of 10000 ranks never reaches it (a pause
  // mid-storm fills the backlog, and dropped SYNs cost a 1 s retry).
  size_t max_pending_connections = 16384;
  // A connection that has not completed its hello this long after it was
  // accepted is closed with a log line. Default 10 s.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  // A connection holding part of a request (a frame header, part of a body)
  // that receives nothing for this long is closed with a log line. Default
  // 30 s.
  std::chrono::milliseconds request_idle_timeout{std::chrono::seconds(30)};
  // The job's token (comm/store/token.h). When set, a connection must
  // present it (kAuth) before any other request and within
  // handshake_timeout; one without it or with another is answered with an
  // error and closed, having seen no key. Default empty: no token needed.
  std::string token{};
};

// The TCP store server (torch's TCPStore master). start() binds and runs one
// Boost.Asio event loop on a thread the server owns; every connection and
// every client blocked in get/wait/multi_get is served by that one thread, so
// a waiting client costs no thread. Malformed input closes only the offending
// connection, with one log line. Methods may be called from any thread
// except the server's own.
class StoreServer {
 public:
  // Binds host:port and starts serving. Raises the RLIMIT_NOFILE soft limit
  // to the hard limit. Throws StoreError naming host:port and the reason when
  // it cannot bind, or naming the option when the budgets are inconsistent.
  static std::unique_ptr<StoreServer> start(const StoreServerOptions& options);

  // Stops (see stop()) and joins the event-loop thread.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // The bound port (the real one when options.port was 0).
  uint16_t port() const;

  // Client connections open right now, and how many of them are blocked in
  // get/wait/multi_get (diagnostics and tests; a snapshot from the event
  // loop).
  size_t num_connections() const;
  size_t num_waiting() const;
  // Bytes of request buffers all connections hold beyond their first
  // 64 KiB (what max_server_buffer_bytes bounds).
  size_t buffered_bytes() const;
  // The open connections per client address (diagnostics: whom a
  // wait_idle() that timed out still waits for). Asked of the event loop;
  // empty when it does not answer within a second or has stopped.
  std::map<std::string, size_t> peer_hosts() const;

  // Blocks until no client is connected, or `timeout` passes (false). An
  // agent hosting the store waits so before it stops it, letting the
  // others read the last answers.
  bool wait_idle(std::chrono::milliseconds timeout) const;

  // Closes the listening socket and every connection, then joins the event
  // loop. Clients blocked in get/wait see their connection close and throw
  // StoreError. Idempotent.
  void stop();

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlaunch::comm::store
