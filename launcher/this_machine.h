#pragma once

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
// May resolve names (getaddrinfo); no other I/O.
bool names_this_machine(const std::string& host, const std::string& local_addr,
                        Loopback loopback);

}  // namespace dlaunch::launcher
