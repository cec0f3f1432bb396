#include "comm/store/resolve.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>

#include "comm/store/text.h"

namespace dlaunch::comm::store {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// One getaddrinfo_a request. Shared by the caller and glibc's completion
// callback, so that whichever finishes last frees it (and its result).
struct Lookup {
  std::string host;
  std::string service;
  addrinfo hints{};
  gaicb cb{};
  std::mutex mu;  // guards done
  std::condition_variable cv;
  bool done = false;

  ~Lookup() {
    if (cb.ar_result != nullptr) ::freeaddrinfo(cb.ar_result);
  }
};

// glibc's completion notification (SIGEV_THREAD), on its own thread.
void lookup_done(sigval v) {
  std::unique_ptr<std::shared_ptr<Lookup>> ref(
      static_cast<std::shared_ptr<Lookup>*>(v.sival_ptr));
  Lookup& l = **ref;
  std::lock_guard lock(l.mu);
  l.done = true;
  l.cv.notify_all();
}

std::string failure(const std::string& host, const std::string& why) {
  return "cannot resolve host '" + host + "': " + why;
}

}  // namespace

AddrInfoList resolve(const std::string& host, const std::string& service,
                     const addrinfo& hints, Clock::time_point deadline,
                     std::string& error, bool* no_answer) {
  if (no_answer) *no_answer = false;
  // A numeric address needs no resolver: answer in the caller.
  addrinfo numeric = hints;
  numeric.ai_flags |= AI_NUMERICHOST;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &numeric, &res);
  if (rc == 0) return AddrInfoList(res, ::freeaddrinfo);
  if (rc != EAI_NONAME) {
    error = failure(host, lower_first(::gai_strerror(rc)));
    return AddrInfoList(nullptr, ::freeaddrinfo);
  }

  auto l = std::make_shared<Lookup>();
  l->host = host;
  l->service = service;
  l->hints = hints;
  l->cb.ar_name = l->host.c_str();
  l->cb.ar_service = l->service.c_str();
  l->cb.ar_request = &l->hints;
  sigevent sev{};
  sev.sigev_notify = SIGEV_THREAD;
  sev.sigev_notify_function = lookup_done;
  auto* ref = new std::shared_ptr<Lookup>(l);
  sev.sigev_value.sival_ptr = ref;
  gaicb* list[1] = {&l->cb};
  rc = ::getaddrinfo_a(GAI_NOWAIT, list, 1, &sev);
  if (rc != 0) {
    delete ref;
    error = failure(host, lower_first(::gai_strerror(rc)));
    return AddrInfoList(nullptr, ::freeaddrinfo);
  }
  std::unique_lock lock(l->mu);
  if (!l->cv.wait_until(lock, deadline, [&] { return l->done; })) {
    // Left to finish on glibc's thread, which frees it.
    error = failure(host, "no answer from the resolver in time");
    if (no_answer) *no_answer = true;
    return AddrInfoList(nullptr, ::freeaddrinfo);
  }
  rc = ::gai_error(&l->cb);
  if (rc != 0) {
    error = failure(host, lower_first(::gai_strerror(rc)));
    return AddrInfoList(nullptr, ::freeaddrinfo);
  }
  res = l->cb.ar_result;
  l->cb.ar_result = nullptr;  // now the caller's
  return AddrInfoList(res, ::freeaddrinfo);
}

int free_port(const std::string& host, Clock::time_point deadline,
              std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  AddrInfoList res = resolve(host, "0", hints, deadline, error);
  if (!res) return -1;
  std::string why = "no address";
  for (addrinfo* a = res.get(); a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0 || ::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = errno_text(errno);
      if (fd >= 0) ::close(fd);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int rc = ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    ::close(fd);
    if (rc != 0) {
      why = errno_text(errno);
      continue;
    }
    return ss.ss_family == AF_INET6
               ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
               : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  }
  error = "cannot bind a free port on '" + host + "': " + why;
  return -1;
}

bool is_loopback(std::string_view host) {
  return host == "localhost" || host.starts_with("127.") || host == "::1";
}

}  // namespace dlaunch::comm::store
