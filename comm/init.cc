#include "comm/init.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "comm/file_store.h"
#include "comm/gloo/process_group.h"
#ifdef DLAUNCH_WITH_NCCL
#include "comm/nccl/process_group.h"
#endif
#include "comm/store/client.h"
#include "comm/store/hash_store.h"
#include "comm/store/prefix_store.h"
#include "comm/store/resolve.h"
#include "comm/store/server.h"
#include "comm/store/token.h"
#include "comm/watched_group.h"

namespace dlaunch::comm {

namespace {

using std::chrono::milliseconds;

void check_backend(std::string_view backend) {
  if (backend == "gloo") return;
#ifdef DLAUNCH_WITH_NCCL
  if (backend == "nccl") {
    // Before any store or socket: a machine without a GPU fails at once.
    std::string why;
    if (nccl::visible_devices(&why) == 0) {
      throw CommError("backend 'nccl': no CUDA device is visible (" + why +
                      "); run on a machine with an NVIDIA GPU, one per rank, "
                      "or use backend 'gloo'");
    }
    return;
  }
#else
  if (backend == "nccl") {
    throw CommError(
        "backend 'nccl' is not available in this build (configured with "
        "DLAUNCH_WITH_NCCL=OFF); use backend 'gloo'");
  }
#endif
  throw CommError("unknown backend '" + std::string(backend) +
                  "'; valid backends: gloo, nccl");
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// An integer in [lo, hi] from `text`, or a CommError naming `what`.
int parse_int(std::string_view text, const std::string& what, int lo, int hi) {
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo ||
      v > hi) {
    throw CommError(what + " is '" + std::string(text) +
                    "'; expected an integer in " + std::to_string(lo) + ".." +
                    std::to_string(hi));
  }
  return v;
}

milliseconds resolve_timeout(const InitOptions& o) {
  if (o.timeout) {
    if (o.timeout->count() <= 0 || *o.timeout > kMaxTimeout) {
      throw CommError("InitOptions.timeout is " +
                      std::to_string(o.timeout->count()) +
                      " ms; it must be from " + kTimeoutRangeText);
    }
    return *o.timeout;
  }
  if (const char* t = env("DLAUNCH_COMM_TIMEOUT")) {
    // Seconds, finite, within [1 ms, kMaxTimeout]: NaN, inf and 1e308
    // would otherwise overflow every deadline computed from it.
    const double max_s = std::chrono::duration<double>(kMaxTimeout).count();
    char* end = nullptr;
    double s = std::strtod(t, &end);
    if (end == t || *end != '\0' ||
        std::isspace(static_cast<unsigned char>(*t)) || !std::isfinite(s) ||
        !(s >= 0.001) || s > max_s) {
      throw CommError(std::string("DLAUNCH_COMM_TIMEOUT is '") + t +
                      "'; expected seconds from 0.001 to " +
                      std::to_string(static_cast<int64_t>(max_s)) +
                      " (7 days), e.g. 60 or 0.5");
    }
    return milliseconds(static_cast<int64_t>(s * 1000 + 0.5));
  }
  return std::chrono::minutes(30);
}

// RANK / WORLD_SIZE from the options, else (env:// only) the environment.
void resolve_rank(const InitOptions& o, bool from_env, const std::string& how,
                  int& rank, int& world) {
  rank = o.rank;
  world = o.world_size;
  if (from_env) {
    if (world < 0) {
      const char* w = env("WORLD_SIZE");
      if (!w) {
        throw CommError(how +
                        ": WORLD_SIZE is not set (dlaunch and torchrun "
                        "set it; or pass InitOptions.world_size)");
      }
      world = parse_int(w, "WORLD_SIZE", 1, 1 << 20);
    }
    if (rank < 0) {
      const char* r = env("RANK");
      if (!r) {
        throw CommError(how +
                        ": RANK is not set (dlaunch and torchrun set "
                        "it; or pass InitOptions.rank)");
      }
      rank = parse_int(r, "RANK", 0, 1 << 20);
    }
  } else if (rank < 0 || world < 0) {
    throw CommError(how +
                    " needs an explicit rank and world size: set "
                    "InitOptions.rank and InitOptions.world_size");
  }
  if (world < 1 || rank < 0 || rank >= world) {
    throw CommError(how + ": rank " + std::to_string(rank) +
                    " is out of range for world size " + std::to_string(world) +
                    " (need 0 <= rank < world size)");
  }
}

// The local address on the route to `host`: a connected UDP socket sends
// nothing but lets the kernel pick the source address peers can reach.
// Empty when `host` does not resolve within `timeout`.
std::string local_address_towards(const std::string& host, int port,
                                  milliseconds timeout) {
  addrinfo hints{};
  // An IPv6 literal over IPv6; a name over IPv4 as before (a name with an
  // AAAA record could pick an IPv6 source a dual-stack cluster does not
  // route).
  hints.ai_family = host.find(':') != std::string::npos ? AF_INET6 : AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  std::string error;
  store::AddrInfoList list =
      store::resolve(host, std::to_string(port), hints,
                     std::chrono::steady_clock::now() + timeout, error);
  if (!list) return {};
  addrinfo* res = list.get();
  std::string out;
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd != -1 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char buf[INET6_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* a =
          local.ss_family == AF_INET6
              ? static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
              : &reinterpret_cast<sockaddr_in*>(&local)->sin_addr;
      if (inet_ntop(local.ss_family, a, buf, sizeof(buf)) != nullptr) out = buf;
    }
  }
  if (fd != -1) close(fd);
  return out;
}

// Where Gloo's pairs listen: $GLOO_SOCKET_IFNAME (an interface), else
// $DLAUNCH_GLOO_HOST, else loopback for a loopback master, else the address
// that routes to the master (resolved within g.timeout), else this machine's
// host name.
void pick_gloo_address(gloo::GroupOptions& g, const std::string& master,
                       int port) {
  if (const char* iface = env("GLOO_SOCKET_IFNAME")) {
    g.iface = iface;
    return;
  }
  if (const char* host = env("DLAUNCH_GLOO_HOST")) {
    g.hostname = host;
    return;
  }
  if (!master.empty() && store::is_loopback(master)) {
    g.hostname = "127.0.0.1";
    return;
  }
  if (!master.empty()) {
    std::string a = local_address_towards(master, port, g.timeout);
    if (!a.empty()) {
      g.hostname = a;
      return;
    }
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    g.hostname = name;
  }
}

// The world group of `backend` over the Gloo options `g` (store, rank,
// size, timeout, addresses); nccl's argument check (when on) uses a Gloo
// group made from the same options.
std::unique_ptr<ProcessGroup> create_backend(std::string_view backend,
                                             const gloo::GroupOptions& g) {
#ifdef DLAUNCH_WITH_NCCL
  if (backend == "nccl") {
    nccl::GroupOptions n;
    n.store = g.store;
    n.rank = g.rank;
    n.size = g.size;
    n.timeout = g.timeout;
    n.owned = g.owned;
    n.make_check_group = [g](const std::string& name) {
      gloo::GroupOptions c = g;
      c.name = name;
      return gloo::create_process_group(c);
    };
    return nccl::create_process_group(n);
  }
#endif
  (void)backend;
  return gloo::create_process_group(g);
}

// The world group, watched when the environment asks for progress records
// or faults (comm/watched_group.h).
std::unique_ptr<ProcessGroup> create(std::string_view backend,
                                     const gloo::GroupOptions& g) {
  auto state = watch_state_from_env(g.rank, g.size);
  return watch_group(create_backend(backend, g), std::move(state));
}

}  // namespace

std::unique_ptr<ProcessGroup> make_process_group(
    std::string_view backend, std::shared_ptr<store::Store> store, int rank,
    int world_size, std::chrono::milliseconds timeout) {
  check_backend(backend);
  gloo::GroupOptions o;
  o.store_thread_safe = dynamic_cast<store::HashStore*>(store.get()) ||
                        dynamic_cast<FileStore*>(store.get());
  if (auto* tcp = dynamic_cast<store::TcpStore*>(store.get())) {
    o.store_clone = [tcp] {
      return std::shared_ptr<store::Store>(tcp->clone());
    };
  }
  o.store = std::move(store);
  o.rank = rank;
  o.size = world_size;
  o.timeout = timeout;
  return create(backend, o);
}

std::unique_ptr<ProcessGroup> init_process_group(std::string_view backend,
                                                 const InitOptions& options) {
  check_backend(backend);
  const std::string& method = options.init_method;
  const milliseconds timeout = resolve_timeout(options);
  gloo::GroupOptions g;
  g.timeout = timeout;

  std::string host;
  int port = 0;
  if (method == "env://") {
    resolve_rank(options, true, "init_method env://", g.rank, g.size);
    const char* addr = env("MASTER_ADDR");
    const char* p = env("MASTER_PORT");
    if (!addr || !p) {
      throw CommError(std::string("init_method env://: ") +
                      (!addr ? "MASTER_ADDR" : "MASTER_PORT") +
                      " is not set (dlaunch and torchrun set it; or use "
                      "init_method tcp://HOST:PORT)");
    }
    host = addr;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);  // [v6], as in a URL
    }
    port = parse_int(p, "MASTER_PORT", 1, 65535);
  } else if (method.rfind("tcp://", 0) == 0) {
    std::string rest = method.substr(6);
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      throw CommError("init_method '" + method +
                      "' is not of the form tcp://HOST:PORT");
    }
    host = rest.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);  // [v6]:port
    }
    port = parse_int(rest.substr(colon + 1), "the port of '" + method + "'", 1,
                     65535);
    resolve_rank(options, false, "init_method " + method, g.rank, g.size);
  } else if (method.rfind("file://", 0) == 0) {
    std::string path = method.substr(7);
    if (path.empty() || path[0] != '/') {
      throw CommError("init_method '" + method +
                      "' must name an absolute path: file:///path/to/file");
    }
    resolve_rank(options, false, "init_method " + method, g.rank, g.size);
    try {
      std::shared_ptr<store::Store> fs =
          std::make_shared<FileStore>(path, timeout);
      // Workers killed by a restart leave their keys in the file; each
      // attempt of an elastic job keeps to its own key space.
      if (const char* attempt = env("TORCHELASTIC_RESTART_COUNT")) {
        fs = std::make_shared<store::PrefixStore>(
            std::string("attempt") + attempt, fs);
      }
      fs->set_timeout(timeout);
      g.store = fs;
      g.store_thread_safe = true;
    } catch (const store::StoreError& e) {
      throw CommError("init_method " + method + ": " + e.what());
    }
    pick_gloo_address(g, {}, 0);
    return create(backend, g);
  } else {
    throw CommError("init_method '" + method +
                    "' is not supported; use env://, tcp://HOST:PORT or "
                    "file:///path");
  }

  // env:// and tcp://: rank 0 serves the store, every rank connects to it.
  // dlaunch gives its workers the job's token: then the store takes only
  // clients that present it (torch's TCPStore has no such check).
  std::string token;
  try {
    token = store::token_from_env(env(store::kTokenEnv)).value_or("");
  } catch (const store::TokenError& e) {
    throw CommError(std::string("init_method ") + method + ": " + e.what());
  }
  std::shared_ptr<store::StoreServer> server;
  if (g.rank == 0) {
    try {
      // An IPv6 MASTER_ADDR needs "::" (which serves IPv4 too where
      // net.ipv6.bindv6only is 0, Linux's default).
      const bool v6 = host.find(':') != std::string::npos;
      server = store::StoreServer::start({.host = v6 ? "::" : "0.0.0.0",
                                          .port = static_cast<uint16_t>(port),
                                          .token = token});
    } catch (const std::exception& e) {
      throw CommError("rank 0 cannot serve the store on port " +
                      std::to_string(port) + " (" + e.what() +
                      "); MASTER_PORT must be free on rank 0's host");
    }
  }
  try {
    store::TcpStoreOptions so;
    so.host = host;
    so.port = static_cast<uint16_t>(port);
    so.connect_timeout = timeout;
    so.timeout = timeout;
    so.token = token;
    std::shared_ptr<store::TcpStore> tcp = store::TcpStore::connect(so);
    // Each group created later rendezvous over its own connection.
    g.store_clone = [tcp] {
      return std::shared_ptr<store::Store>(tcp->clone());
    };
    g.store = tcp;
  } catch (const store::StoreError& e) {
    throw CommError("rank " + std::to_string(g.rank) +
                    " cannot reach the store that rank 0 serves at " + host +
                    ":" + std::to_string(port) + ": " + e.what());
  }
  g.owned = server;
  pick_gloo_address(g, host, port);
  return create(backend, g);
}

}  // namespace dlaunch::comm
