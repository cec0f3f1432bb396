// Unit tests of names_this_machine(): which host names and addresses are
// this machine, for the rendezvous store (every loopback address) and for
// a hosts list (127.0.0.2, ... stand for other hosts).
#include "launcher/this_machine.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <set>
#include <string>
#include <vector>

#include "agent/posix_env.h"

namespace dlaunch::launcher {
namespace {

// This machine's interface addresses outside loopback (IPv4 and IPv6).
std::set<std::string> own_addresses() {
  std::set<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    const int fam = i->ifa_addr->sa_family;
    if (fam == AF_INET) {
      ::inet_ntop(fam, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr,
                  buf, sizeof buf);
    } else if (fam == AF_INET6) {
      ::inet_ntop(fam, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                  buf, sizeof buf);
    } else {
      continue;
    }
    const std::string a = buf;
    if (a != "::1" && !a.starts_with("127.")) out.insert(a);
  }
  ::freeifaddrs(ifs);
  return out;
}

TEST(ThisMachineTest, BothUsesShareOneRuleButForOtherLoopbackAddresses) {
  const std::string me = agent::host_name();
  struct Case {
    std::string host;
    bool any;           // Loopback::kAny (the rendezvous store)
    bool default_only;  // Loopback::kDefaultOnly (a hosts list)
  };
  std::vector<Case> cases = {
      {"localhost", true, true},
      {"127.0.0.1", true, true},
      {"::1", true, true},
      {"0:0:0:0:0:0:0:1", true, true},  // ::1 written out
      {"127.0.0.2", true, false},       // one machine playing many hosts
      {"127.1.2.3", true, false},
      {me, true, true},
      {me.substr(0, me.find('.')), true, true},
      {"198.51.100.7", false, false},  // TEST-NET-2: another host
      {"no-such-host.invalid", false, false},
  };
  // Its FQDN, where it has one (`hostname -f`).
  addrinfo hints{};
  hints.ai_flags = AI_CANONNAME;
  addrinfo* res = nullptr;
  if (::getaddrinfo(me.c_str(), nullptr, &hints, &res) == 0) {
    if (res->ai_canonname) cases.push_back({res->ai_canonname, true, true});
    ::freeaddrinfo(res);
  }
  const std::set<std::string> own = own_addresses();
  ASSERT_FALSE(own.contains("198.51.100.7"));
  for (const std::string& a : own) cases.push_back({a, true, true});
  for (const Case& c : cases) {
    EXPECT_EQ(names_this_machine(c.host, "", Loopback::kAny), c.any)
        << c.host << " (any loopback)";
    EXPECT_EQ(names_this_machine(c.host, "", Loopback::kDefaultOnly),
              c.default_only)
        << c.host << " (127.0.0.1 and ::1 only)";
  }
}

// --local-addr names this machine, whatever it is; "" names nothing.
TEST(ThisMachineTest, TheLocalAddressIsThisMachine) {
  for (Loopback l : {Loopback::kAny, Loopback::kDefaultOnly}) {
    EXPECT_TRUE(names_this_machine("198.51.100.7", "198.51.100.7", l));
    EXPECT_TRUE(names_this_machine("127.0.0.3", "127.0.0.3", l));
    EXPECT_FALSE(names_this_machine("198.51.100.7", "198.51.100.8", l));
    EXPECT_FALSE(names_this_machine("", "", l));
  }
}

}  // namespace
}  // namespace dlaunch::launcher
