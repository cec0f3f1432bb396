#pragma once

#include <cstddef>
#include <cstdint>
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
  // listen() backlog: room for a connect storm of many ranks. Default 4096
  // (the kernel caps it at net.core.somaxconn).
  int backlog = 4096;
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
  // it cannot bind.
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
