#pragma once

#include <string>
#include <vector>

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

// A nameserver that never answers (a bound, silent UDP socket on port 53
// of a random 127.83.x.y) and a resolv.conf naming it, which wrap() gives a
// command through a private mount of /etc/resolv.conf (unshare -m): that
// command's name lookups wait for the resolver's own timeouts, 30 s a try
// and 5 tries with RES_OPTIONS=kResOptions in its environment (the caller
// sets it). ok() false, with why(), where the port or a private mount
// namespace cannot be had (the test skips).
class SilentNameserver {
 public:
  // `conf`: where to write its resolv.conf (a test's temporary folder).
  explicit SilentNameserver(std::string conf);
  ~SilentNameserver();
  SilentNameserver(const SilentNameserver&) = delete;
  SilentNameserver& operator=(const SilentNameserver&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  // `argv` run with this nameserver alone.
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const;
  static constexpr char kResOptions[] = "timeout:30 attempts:5";

 private:
  std::string conf_;
  int fd_ = -1;
  std::string why_;
};

}  // namespace dlaunch::testing
