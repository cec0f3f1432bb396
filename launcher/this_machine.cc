#include "launcher/this_machine.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <set>
#include <vector>

#include "agent/posix_env.h"
#include "comm/store/resolve.h"
#include "comm/store/text.h"

namespace dlaunch::launcher {
namespace {

// `a`'s address as inet_ntop writes it ("" for a family other than IPv4
// and IPv6), so that "0:0::1" and "::1" compare equal.
std::string address_text(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void* src = nullptr;
  if (a->sa_family == AF_INET) {
    src = &reinterpret_cast<const sockaddr_in*>(a)->sin_addr;
  } else if (a->sa_family == AF_INET6) {
    src = &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  }
  if (!src || !::inet_ntop(a->sa_family, src, buf, sizeof buf)) return "";
  return buf;
}

// The lookup of `name` (`host` itself, or this machine's name for `host`),
// giving up after `timeout`: empty when it does not resolve; throws
// LookupTimeout when the resolver does not answer in time.
comm::store::AddrInfoList look_up(const std::string& host,
                                  const std::string& name, int flags,
                                  std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  std::string error;
  bool no_answer = false;
  comm::store::AddrInfoList res = comm::store::resolve(
      name, "0", hints, std::chrono::steady_clock::now() + timeout, error,
      &no_answer);
  if (no_answer) {
    throw LookupTimeout(
        "cannot tell whether host '" + host + "' is this machine: " +
        (name == host ? "its name lookup"
                      : "the lookup of this machine's name '" + name + "'") +
        " got no answer from the resolver within " +
        comm::store::format_duration(timeout) +
        " (--connect-timeout); check the nameservers in /etc/resolv.conf, "
        "or give the host by its address");
  }
  return res;
}

// The addresses `host` (a name or an address) stands for; none when it
// does not resolve. An address written as one is parsed, not looked up: a
// hosts list of addresses costs no DNS query, however slow the resolver.
std::vector<std::string> addresses_of(const std::string& host,
                                      std::chrono::milliseconds timeout) {
  std::vector<std::string> out;
  comm::store::AddrInfoList res = look_up(host, host, 0, timeout);
  for (addrinfo* a = res.get(); a; a = a->ai_next) {
    std::string text = address_text(a->ai_addr);
    if (!text.empty()) out.push_back(std::move(text));
  }
  return out;
}

// Whether `host` is written as an IPv4 or IPv6 address.
bool is_address(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

std::set<std::string> interface_addresses() {
  std::set<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    std::string text = address_text(i->ifa_addr);
    if (!text.empty()) out.insert(std::move(text));
  }
  ::freeifaddrs(ifs);
  return out;
}

// This machine's name `me`'s canonical name (what `hostname -f` prints),
// "" when it does not resolve; asked about `host`.
std::string canonical_name(const std::string& host, const std::string& me,
                           std::chrono::milliseconds timeout) {
  comm::store::AddrInfoList res = look_up(host, me, AI_CANONNAME, timeout);
  return res && res->ai_canonname ? res->ai_canonname : "";
}

}  // namespace

bool names_this_machine(const std::string& host, const std::string& local_addr,
                        Loopback loopback,
                        std::chrono::milliseconds lookup_timeout) {
  const std::string me = agent::host_name();
  if ((!local_addr.empty() && host == local_addr) || host == me ||
      host == me.substr(0, me.find('.')) || host == "localhost") {
    return true;
  }
  const std::vector<std::string> addresses = addresses_of(host, lookup_timeout);
  std::set<std::string> mine;  // read once, when first needed
  bool elsewhere = false;      // an address that is not loopback nor ours
  for (const std::string& a : addresses) {
    // A loopback address is decided by `loopback` alone, never by the
    // interfaces: 127.0.0.2 stays another host however lo is set up.
    if (comm::store::is_loopback(a)) {
      if (loopback == Loopback::kAny || a == "127.0.0.1" || a == "::1") {
        return true;
      }
      continue;
    }
    if (mine.empty()) mine = interface_addresses();
    if (mine.contains(a)) return true;
    elsewhere = true;
  }
  // This machine's FQDN where it resolves to loopback only (Debian maps
  // its own name to 127.0.1.1) or not at all. A name that reaches another
  // machine's address is that machine, even if a search domain made our
  // own name's canonical form the same.
  // (An address is never a name: no lookup for it.)
  return !elsewhere && host.find('.') != std::string::npos &&
         !is_address(host) && host == canonical_name(host, me, lookup_timeout);
}

}  // namespace dlaunch::launcher
