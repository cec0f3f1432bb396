#include "tests/testing/net.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

namespace dlaunch::testing {
namespace {

// The first port of the kernel's ephemeral range (32768 by default).
int ephemeral_low() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(f >> low) || low <= 0) low = 32768;
  return low;
}

// Whether `port` can be bound on every IPv4 address now (and is released).
bool bindable(int port, std::string& why) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::strerror(errno);
    return false;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (!ok) why = std::strerror(errno);
  ::close(fd);
  return ok;
}

}  // namespace

int free_port() {
  const int high = ephemeral_low() - 1;
  const int low = std::max(1024, high - 16383);
  std::string why = "the ephemeral range starts at " + std::to_string(high + 1);
  if (high - low >= 1023) {
    std::random_device rd;
    std::uniform_int_distribution<int> pick(low, high);
    for (int tries = 0; tries < 200; ++tries) {
      const int port = pick(rd);
      if (bindable(port, why)) return port;
    }
  }
  ADD_FAILURE() << "no free port in " << low << ".." << high
                << " after 200 tries: " << why;
  return -1;
}

}  // namespace dlaunch::testing
