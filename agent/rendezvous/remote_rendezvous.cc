#include "agent/rendezvous/remote_rendezvous.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "agent/posix_env.h"
#include "agent/rendezvous/remote_wire.h"
#include "comm/store/text.h"

extern char** environ;

namespace dlaunch::agent::rendezvous {

using comm::store::format_duration;
using std::chrono::milliseconds;

RemoteRendezvous::RemoteRendezvous(Params params) : p_(std::move(params)) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw RendezvousError(std::string("cannot start ") + p_.program +
                          ": socketpair: " + std::strerror(errno));
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, sv[1], STDIN_FILENO);
  ::posix_spawn_file_actions_adddup2(&fa, sv[1], STDOUT_FILENO);
  ::posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setpgroup(&attr, 0);
  ::posix_spawnattr_setflags(&attr,
                             POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  char* argv[] = {const_cast<char*>(p_.program.c_str()), nullptr};
  int rc = ::posix_spawn(&pid_, p_.program.c_str(), &fa, &attr, argv, environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::posix_spawnattr_destroy(&attr);
  ::close(sv[1]);
  if (rc != 0) {
    ::close(sv[0]);
    throw RendezvousError("cannot start the rendezvous helper " + p_.program +
                          ": " + std::strerror(rc) +
                          " (build or install it beside dlaunch)");
  }
  helper_started(pid_);
  fd_ = sv[0];
  reader_ = std::thread([this] { read_loop(); });
  auto settings = p_.settings;
  settings["protocol"] = std::to_string(remote::kProtocolVersion);
  std::vector<std::string> open = {"open"};
  for (std::string& kv : remote::encode_settings(settings)) open.push_back(kv);
  // Its answer is read by the first next_round(): the helper starts and
  // connects while the agent gets ready.
  send(open);
  if (p_.ping_every.count() > 0) pinger_ = std::thread([this] { ping_loop(); });
}

void RemoteRendezvous::await_open() {
  if (opened_) return;
  auto a = answer(p_.open_timeout, "to connect");
  if (a[0] != "ready") {
    throw RendezvousError("the rendezvous helper " + p_.program +
                          " answered '" + a[0] + "' to open");
  }
  opened_ = true;
}

RemoteRendezvous::~RemoteRendezvous() { close(); }

void RemoteRendezvous::ping_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, p_.ping_every, [this] { return stop_pinging_; })) {
    lock.unlock();
    send({"alive"});
    lock.lock();
  }
}

void RemoteRendezvous::close() {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_pinging_ = true;
    cv_.notify_all();
  }
  if (pinger_.joinable()) pinger_.join();
  ::shutdown(fd_, SHUT_WR);  // the helper leaves and exits
  {
    std::unique_lock<std::mutex> lock(mu_);
    on_event_ = nullptr;  // its receiver may be gone already
    if (!cv_.wait_for(lock, p_.close_timeout, [this] { return gone_; })) {
      p_.log("dlaunch: the rendezvous helper " + p_.program +
             " did not leave within " + format_duration(p_.close_timeout) +
             " (close_timeout); killing it\n");
      ::kill(pid_, SIGKILL);
    }
  }
  if (reader_.joinable()) reader_.join();
  flush_logs();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  helper_gone(pid_);
  ::close(fd_);
  fd_ = -1;
}

void RemoteRendezvous::send(const std::vector<std::string>& fields) {
  const std::string line = remote::encode_line(fields);
  std::lock_guard<std::mutex> lock(send_mu_);
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the helper is gone: answer() or the reader says so
    off += static_cast<size_t>(n);
  }
}

void RemoteRendezvous::flush_logs() {
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lines.swap(logs_);
  }
  for (const std::string& l : lines) p_.log(l);
}

std::vector<std::string> RemoteRendezvous::answer(milliseconds timeout,
                                                  const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const bool woke = cv_.wait_until(lock, deadline, [this] {
      return answer_ || gone_ || interrupted_ || !logs_.empty();
    });
    if (interrupted_) {
      // The helper is left mid-round; closing its socket makes it leave.
      throw RendezvousInterrupted("interrupted while waiting " + what);
    }
    if (!logs_.empty()) {
      // Progress lines go out from this thread (the agent's, or its Env's
      // background thread), never from the reader's.
      lock.unlock();
      flush_logs();
      lock.lock();
      continue;
    }
    if (!woke) {
      throw RendezvousError(
          "the rendezvous helper " + p_.program + " did not answer within " +
          format_duration(timeout) + " while waiting " + what);
    }
    break;
  }
  if (!answer_) {
    throw RendezvousError("the rendezvous helper " + p_.program +
                          " exited while waiting " + what +
                          " (its message is above)");
  }
  std::vector<std::string> a = std::move(*answer_);
  answer_.reset();
  if (a[0] == "error") {
    const std::string text = a.size() > 2 ? a[2] : "unknown error";
    if (a.size() > 1 && a[1] == "closed") throw RendezvousClosed(text);
    throw RendezvousError(text);
  }
  return a;
}

void RemoteRendezvous::interrupt() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    interrupted_ = true;
  }
  cv_.notify_all();
}

RendezvousResult RemoteRendezvous::next_round(int local_world_size,
                                              RoundReason reason,
                                              milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_event_ = nullptr;  // the old round's event no longer matters
    watched_round_ = -1;
  }
  await_open();
  send({"next", std::to_string(local_world_size),
        std::to_string(remote::to_wire(reason)),
        std::to_string(timeout.count())});
  auto a = answer(timeout + p_.grace, "for a rendezvous round");
  try {
    if (a[0] != "round")
      throw std::invalid_argument("unexpected '" + a[0] + "'");
    RendezvousResult r = remote::decode_result({a.begin() + 1, a.end()});
    std::lock_guard<std::mutex> lock(mu_);
    watched_round_ = r.round;
    return r;
  } catch (const std::invalid_argument& e) {
    throw RendezvousError("the rendezvous helper " + p_.program +
                          " sent a bad round: " + e.what());
  }
}

void RemoteRendezvous::watch(EventCallback on_event) {
  flush_logs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    on_event_ = std::move(on_event);
  }
  send({"watch"});
}

void RemoteRendezvous::report(NodeOutcome outcome) {
  flush_logs();
  send({"report", std::to_string(remote::to_wire(outcome))});
}

std::vector<std::string> RemoteRendezvous::unfinished_nodes() {
  if (!opened_) return {};
  {
    std::lock_guard<std::mutex> lock(mu_);
    want_unfinished_ = true;
  }
  send({"unfinished"});
  std::vector<std::string> out;
  try {
    // Short: the agent's event loop (its signals) waits meanwhile.
    std::vector<std::string> a = answer(
        std::chrono::seconds(2), "for the nodes the exit barrier waits for");
    if (a[0] == "unfinished") out.assign(a.begin() + 1, a.end());
  } catch (const std::exception&) {
    // The message then says "the other nodes".
  }
  std::lock_guard<std::mutex> lock(mu_);
  want_unfinished_ = false;  // a late answer is dropped, not taken later
  return out;
}

bool RemoteRendezvous::cut_off(milliseconds d) {
  send({"cut", std::to_string(d.count())});
  return true;
}

void RemoteRendezvous::read_loop() {
  std::string buf;
  char chunk[4096];
  while (true) {
    ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::vector<std::string> f;
      try {
        f = remote::decode_line(buf.substr(0, nl));
      } catch (const std::invalid_argument& e) {
        p_.log(std::string("dlaunch: bad line from the rendezvous helper: ") +
               e.what() + "\n");
      }
      buf.erase(0, nl + 1);
      if (f.empty()) continue;
      if (f[0] == "log" && f.size() > 1) {
        std::lock_guard<std::mutex> lock(mu_);
        logs_.push_back(f[1]);
        cv_.notify_all();
      } else if (f[0] == "event" && f.size() > 3) {
        RoundEvent ev;
        EventCallback cb;
        try {
          ev.kind = remote::kind_from_wire(remote::wire_int(f[1]));
          ev.round = remote::wire_int(f[2]);
          ev.detail = f[3];
        } catch (const std::invalid_argument& e) {
          ev = {
              RoundEvent::Kind::kFatal, watched_round_,
              std::string("bad event from the rendezvous helper: ") + e.what()};
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (ev.round == watched_round_) std::swap(cb, on_event_);
        }
        if (cb) cb(ev);
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        if (f[0] == "unfinished" && !want_unfinished_) continue;
        answer_ = std::move(f);
        cv_.notify_all();
      }
    }
  }
  EventCallback cb;
  RoundEvent ev{RoundEvent::Kind::kFatal, -1,
                "the rendezvous helper " + p_.program +
                    " exited (its message is above); this node cannot tell "
                    "whether the others go on"};
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone_ = true;
    std::swap(cb, on_event_);
    ev.round = watched_round_;
    cv_.notify_all();
  }
  if (cb) cb(ev);
}

}  // namespace dlaunch::agent::rendezvous
