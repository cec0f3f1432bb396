#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

namespace dlaunch::launcher {

// Which loopback addresses stand for this machine.
enum class Loopback {
  // Every one: an address of 127.0.0.0/8 or ::1 is reached here (where
  // the rendezvous store is hosted).
  kAny,
  // 127.0.0.1 and ::1 only: in a hosts list, 127.0.0.2, 127.0.0.3, ...
  // stand for other hosts, so that one machine can play many.
  kDefaultOnly,
};

// Whether `host` names this machine: `local_addr` (--local-addr, "" for
// none), its host name (full or short), its canonical name (FQDN),
// localhost, a loopback address as `loopback` says, an address of one of
// its interfaces, or a name that resolves to one of these addresses.
// May resolve names, each lookup bounded by `lookup_timeout` (the head's
// --connect-timeout); no other I/O. A name that does not resolve is
// another machine's; a lookup the resolver does not answer in time throws
// LookupTimeout, naming the host and the fix.
bool names_this_machine(
    const std::string& host, const std::string& local_addr, Loopback loopback,
    std::chrono::milliseconds lookup_timeout = std::chrono::seconds(10));

// A name lookup got no answer from the resolver within its bound.
class LookupTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dlaunch::launcher
