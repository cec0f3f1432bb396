// Compiled with comm/gloo/compat first on the include path (see
// compat/gloo/common/memory.h): the TCP buffer's counts are protected, so
// they are named through a class derived from it, never instantiated.
#include "comm/gloo/completions.h"

#include <gloo/transport/tcp/unbound_buffer.h>

#include <mutex>

namespace dlaunch::comm::gloo {
namespace {

namespace tcp = ::gloo::transport::tcp;

struct Counts : tcp::UnboundBuffer {
  static bool recv(::gloo::transport::UnboundBuffer& b) {
    return any(b, &Counts::recvCompletions_);
  }
  static bool send(::gloo::transport::UnboundBuffer& b) {
    return any(b, &Counts::sendCompletions_);
  }
  static bool any(::gloo::transport::UnboundBuffer& b,
                  int tcp::UnboundBuffer::*count) {
    auto* t = dynamic_cast<tcp::UnboundBuffer*>(&b);
    if (t == nullptr) return false;
    std::lock_guard lock(t->*(&Counts::m_));
    return t->*count > 0;
  }
};

}  // namespace

bool recv_completed(::gloo::transport::UnboundBuffer& b) {
  return Counts::recv(b);
}

bool send_completed(::gloo::transport::UnboundBuffer& b) {
  return Counts::send(b);
}

}  // namespace dlaunch::comm::gloo
