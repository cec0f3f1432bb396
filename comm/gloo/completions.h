#pragma once

#include <gloo/transport/unbound_buffer.h>

namespace dlaunch::comm::gloo {

// Whether `b` holds a completed receive (send) that no wait took yet, read
// without waiting; false for a buffer of another transport than Gloo's TCP.
// Gloo has no such test, and its waits let an abort outrank a completion
// that came before it: a wait aborted because the peer's connection failed
// (the peer may have finished and closed it) returns false even when every
// byte had arrived. Any thread.
bool recv_completed(::gloo::transport::UnboundBuffer& b);
bool send_completed(::gloo::transport::UnboundBuffer& b);

}  // namespace dlaunch::comm::gloo
