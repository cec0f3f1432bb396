#include "tests/testing/net.h"

#include <arpa/inet.h>
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

#include "tests/testing/subprocess.h"

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

SilentNameserver::SilentNameserver(std::string conf) : conf_(std::move(conf)) {
  // At a random address of 127.83.0.0/16, so that tests running at once
  // each get one.
  std::random_device rd;
  std::uniform_int_distribution<int> pick(1, 254);
  std::string address;
  for (int tries = 0; tries < 20 && fd_ < 0; ++tries) {
    address =
        "127.83." + std::to_string(pick(rd)) + "." + std::to_string(pick(rd));
    int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(53);
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    if (fd >= 0 &&
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      fd_ = fd;
      break;
    }
    why_ = std::string("cannot bind a silent nameserver on ") + address +
           ":53: " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
  }
  if (fd_ < 0) return;
  why_.clear();
  std::ofstream(conf_) << "nameserver " << address << "\n";
  CommandOptions probe;
  probe.argv = wrap({"true"});
  if (run_command(probe, std::chrono::seconds(10)).exit_code != 0) {
    why_ = "no private mount namespace here (unshare -m)";
  }
}

SilentNameserver::~SilentNameserver() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> SilentNameserver::wrap(
    const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {
      "unshare",
      "-m",
      "sh",
      "-c",
      "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
      conf_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

}  // namespace dlaunch::testing
