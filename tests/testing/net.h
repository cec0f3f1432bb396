#pragma once

namespace dlaunch::testing {

// A TCP port free on every address right now, for servers a test starts
// that cannot bind port 0 themselves (dlaunch's agents' store, rank 0's
// MASTER_PORT, etcd) and for a port nobody listens on. Chosen at random
// below the kernel's ephemeral range (ip_local_port_range), which the
// kernel never hands out by itself: between this check and the server's
// bind, no other process's bind(0) or outgoing connection can take it,
// only another explicit choice of the same port. Fails the test (and
// returns -1) when none can be had.
int free_port();

}  // namespace dlaunch::testing
