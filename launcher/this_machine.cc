#include "launcher/this_machine.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <set>
#include <vector>

#include "agent/posix_env.h"
#include "comm/store/resolve.h"

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

// The addresses `host` (a name or an address) stands for; none when it
// does not resolve.
// An address written as one is parsed, not looked up: a hosts list of
// addresses costs no DNS query, however slow the resolver.
std::vector<std::string> addresses_of(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) {
    hints.ai_flags = 0;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return {};
  }
  std::vector<std::string> out;
  for (addrinfo* a = res; a; a = a->ai_next) {
    std::string text = address_text(a->ai_addr);
    if (!text.empty()) out.push_back(std::move(text));
  }
  ::freeaddrinfo(res);
  return out;
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

// The host name's canonical name (what `hostname -f` prints), "" when it
// does not resolve.
std::string canonical_name(const std::string& name) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_CANONNAME;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return "";
  std::string out = res->ai_canonname ? res->ai_canonname : "";
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

bool names_this_machine(const std::string& host, const std::string& local_addr,
                        Loopback loopback) {
  const std::string me = agent::host_name();
  if ((!local_addr.empty() && host == local_addr) || host == me ||
      host == me.substr(0, me.find('.')) || host == "localhost") {
    return true;
  }
  const std::vector<std::string> addresses = addresses_of(host);
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
  return !elsewhere && host.find('.') != std::string::npos &&
         host == canonical_name(me);
}

}  // namespace dlaunch::launcher
