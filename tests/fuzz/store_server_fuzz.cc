// libFuzzer harness for the store server (comm/store/server.h): a client
// that completed the handshake sends arbitrary bytes; the server must answer
// or close, never crash, hang or corrupt memory. One in-process server
// serves every input over loopback TCP. Built twice: store_server_fuzz
// (no token) and store_auth_fuzz (DLAUNCH_FUZZ_TOKEN: the server requires
// the job's token, so the bytes are a stranger's until a kAuth frame with
// "fuzz-token" comes first).
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "comm/store/server.h"
#include "comm/store/wire.h"

namespace store = dlaunch::comm::store;
using namespace std::chrono_literals;

namespace {

store::StoreServer& server() {
  // Short deadlines: a partial frame must not hold an input for 30 s.
  // Its log lines (a closed connection) would drown libFuzzer's.
  static bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  static std::unique_ptr<store::StoreServer> s = [] {
    store::StoreServerOptions o;
    o.host = "127.0.0.1";
    o.max_frame_bytes = size_t{1} << 20;
    o.max_connection_buffer_bytes = size_t{2} << 20;
    o.max_server_buffer_bytes = size_t{64} << 20;
    o.handshake_timeout = 1s;
    o.request_idle_timeout = 1s;
#ifdef DLAUNCH_FUZZ_TOKEN
    o.token = DLAUNCH_FUZZ_TOKEN;
#endif
    return store::StoreServer::start(o);
  }();
  return *s;
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

// Every input is a new connection that the harness closes first, so each
// leaves a TIME_WAIT behind for a minute: well over the 28000 ephemeral
// ports of one source address at a few thousand inputs a second (connect
// failed with the range used up, and other programs on 127.0.0.1 would
// starve too). Each connection comes from the next address of 127.1.0.1 to
// 127.254.255.254 instead, its port picked at connect (no bind conflict).
void bind_next_source(int fd) {
  static uint32_t next = 0;
  const uint32_t n = next++ % (254u * 256u * 254u);
  const uint32_t ip = (127u << 24) | ((1 + n / (256u * 254u)) << 16) |
                      ((n / 254u % 256u) << 8) | (1 + n % 254u);
  int one = 1;
  ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(ip);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
    std::fprintf(stderr, "store fuzz: bind to a loopback source failed: %s\n",
                 std::strerror(errno));
    std::abort();
  }
}

int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) std::abort();
  bind_next_source(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  int err =
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  if (err == EINTR) {
    // libFuzzer's timeout alarm (SIGALRM) interrupted it; the connection
    // goes on in the background: wait for it and take its result.
    pollfd p{fd, POLLOUT, 0};
    while (::poll(&p, 1, 10000) < 0 && errno == EINTR) {
    }
    socklen_t len = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  }
  if (err != 0) {
    // Says why, with the process's open descriptors (the server's
    // connections are among them): a leak shows as a large count.
    std::fprintf(
        stderr,
        "store fuzz: connect to 127.0.0.1:%u failed: %s; %zu open fds\n", port,
        std::strerror(err), open_fds());
    std::abort();
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = connect_to(server().port());
  std::string out;
  store::wire::encode_hello({}, out);
  out.append(reinterpret_cast<const char*>(data), size);
  size_t sent = 0;
  // Reads what the server answers while sending: it may stop reading a
  // client that does not take its answers.
  auto deadline = std::chrono::steady_clock::now() + 2s;
  char buf[65536];
  bool eof = false;
  while (!eof && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, static_cast<short>(POLLIN | (sent < out.size() ? POLLOUT : 0)),
             0};
    if (::poll(&p, 1, 50) < 0) break;
    if (p.revents & POLLIN) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) eof = true;
    }
    if (!eof && (p.revents & POLLOUT) && sent < out.size()) {
      ssize_t n = ::send(fd, out.data() + sent, out.size() - sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) eof = true;
      if (n > 0) sent += static_cast<size_t>(n);
      if (sent == out.size()) ::shutdown(fd, SHUT_WR);
    }
    if (p.revents & (POLLERR | POLLHUP)) eof = true;
  }
  ::close(fd);
  return 0;
}
