#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dlaunch::comm::gloo {

// Ranks of `ctx` whose connection has failed. Gloo's errors name the socket
// address, which for accepted connections is the peer's ephemeral port, so
// ask each pair instead: posting on a failed pair throws at once. (A posted
// probe on a healthy pair is harmless: it matches nothing.)
std::vector<int> failed_peers(::gloo::rendezvous::Context& ctx, int rank,
                              int size);

// Notices a failed connection of a group at once. Gloo tells only the
// operations still queued on a pair when its connection fails, not one
// whose bytes are in transfer (a receive whose sender died mid-payload
// would wait out the whole timeout): a 1-byte receive from every peer on a
// slot nobody sends to stays queued on every pair, and a thread waits on
// it. Owned by a group's state; the destructor stops and joins the thread.
class ConnectionWatch {
 public:
  // Called on the watch thread with the ranks whose connection just failed
  // and Gloo's message.
  using OnLost = std::function<void(const std::vector<int>& ranks,
                                    const std::string& what)>;

  // Watches every peer of rank `rank` of `size` in `ctx`, with receives on
  // `slot`.
  ConnectionWatch(std::shared_ptr<::gloo::rendezvous::Context> ctx, int rank,
                  int size, uint64_t slot, OnLost on_lost);
  ~ConnectionWatch();
  ConnectionWatch(const ConnectionWatch&) = delete;
  ConnectionWatch& operator=(const ConnectionWatch&) = delete;

 private:
  void loop();

  const std::shared_ptr<::gloo::rendezvous::Context> ctx_;
  const int rank_;
  const int size_;
  const uint64_t slot_;
  const OnLost on_lost_;
  char byte_ = 0;  // what a (never sent) watch message would land in

  std::mutex mu_;  // guards the members below
  bool stop_ = false;
  // The receive the thread waits on; replaced after each failure, so that
  // the remaining peers stay watched.
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace dlaunch::comm::gloo
