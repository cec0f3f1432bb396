#pragma once

namespace dlaunch::testing {

// A TCP port free on 127.0.0.1 right now (bind port 0, read it back,
// close): for servers a test starts that cannot bind port 0 themselves
// (dlaunch's agents' store, etcd). Fails the test (and returns -1) when
// none can be had.
int free_port();

}  // namespace dlaunch::testing
