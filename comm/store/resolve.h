#pragma once

#include <netdb.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace dlaunch::comm::store {

// A getaddrinfo(3) result list, freed with freeaddrinfo.
using AddrInfoList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// getaddrinfo(host, service, hints) that gives up at `deadline`: the system
// resolver alone may wait 5 s per nameserver and attempt, more than a short
// connect timeout allows. Numeric addresses resolve at once, in the caller;
// names through glibc's getaddrinfo_a, and a lookup abandoned at the
// deadline finishes on glibc's thread and frees itself. On failure returns
// an empty list and sets `error` ("cannot resolve host 'x': ...", or "...:
// no answer from the resolver in time"), and `no_answer` (when given) to
// whether the deadline passed.
AddrInfoList resolve(const std::string& host, const std::string& service,
                     const addrinfo& hints,
                     std::chrono::steady_clock::time_point deadline,
                     std::string& error, bool* no_answer = nullptr);

// Whether `host` is a loopback name or address ("localhost", 127.x.y.z,
// "::1"): reachable from this machine only.
bool is_loopback(std::string_view host);

// A TCP port that is free on `host` right now: resolves it (giving up at
// `deadline`), binds port 0 on its first address that accepts, reads the
// port back and closes. The one free-port lookup (the agent's MASTER_PORT,
// tests). On failure returns -1 and sets `error` ("cannot resolve host 'x':
// ...", "cannot bind a free port on 'x': cannot assign requested address").
int free_port(const std::string& host,
              std::chrono::steady_clock::time_point deadline,
              std::string& error);

}  // namespace dlaunch::comm::store
