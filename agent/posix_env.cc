#include "agent/posix_env.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/process/v2/posix/vfork_launcher.hpp>
#include <boost/process/v2/process.hpp>
#include <cerrno>
#include <cstring>
#include <optional>

#include "agent/line_buffer.h"
#include "agent/watchdog.h"

namespace dlaunch::agent {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        // A non-blocking console inherited from our parent: wait as a
        // blocking write would, so no line is dropped or torn.
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, -1);
        continue;
      }
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void die_with_parent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have died between fork and prctl: then nobody would send
  // the death signal, so check who our parent is now.
  if (::getppid() != parent) ::raise(SIGKILL);
}

namespace {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

Fd open_log(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw SpawnError("cannot open log file " + path.string() + ": " +
                     std::strerror(errno));
  }
  return Fd(fd);
}

// Runs in the vforked child before execve (async-signal-safe calls only,
// and nothing that allocates: the memory is the agent's):
// stdio, a process group of its own, death with the agent.
struct WorkerInit {
  const char* const* envp;
  int in_fd;  // -1: inherit the agent's stdin
  int out_fd;
  int err_fd;
  pid_t parent;
  rlimit nofile;  // the open-file limit dlaunch itself was started with

  template <typename Launcher, typename Path>
  bp::error_code on_setup(Launcher& launcher, const Path&, const char* const*) {
    launcher.env = envp;
    return {};
  }

  template <typename Launcher, typename Path>
  bp::error_code on_exec_setup(Launcher&, const Path&, const char* const*) {
    if ((in_fd >= 0 && ::dup2(in_fd, STDIN_FILENO) < 0) ||
        ::dup2(out_fd, STDOUT_FILENO) < 0 ||
        ::dup2(err_fd, STDERR_FILENO) < 0) {
      return bp::error_code(errno, boost::system::system_category());
    }
    // The embedded store raises dlaunch's own limit; workers get the user's.
    ::setrlimit(RLIMIT_NOFILE, &nofile);
    ::setpgid(0, 0);
    die_with_parent(parent);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    return {};
  }

  // execve failed. The launcher would call exit(), which in a vfork child
  // runs the agent's atexit handlers in the agent's own memory: leave now.
  // (errno is already in the launcher's error_code.) Boost 1.81 detects the
  // hook through a five-argument form and calls the four-argument one.
  template <typename Launcher, typename Path>
  void on_exec_error(Launcher&, const Path&, const char* const*,
                     const bp::error_code&) {
    ::_exit(127);
  }
  template <typename Launcher, typename Path>
  void on_exec_error(Launcher&, const bp::error_code&, const Path&,
                     const char* const*, const bp::error_code&) {
    ::_exit(127);
  }
};

}  // namespace

struct PosixEnv::Impl {
  asio::io_context io;
  std::optional<asio::signal_set> signals;
  std::function<void(int)> signal_handler;
  Watchdog watchdog;
  std::filesystem::path orphan_dir;  // the watchdog's to remove
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(2)};
  Fd dev_null;      // write end for discarded streams
  Fd null_in;       // stdin for workers when the agent's is a terminal
  rlimit nofile{};  // RLIMIT_NOFILE when the env was made

  void wait_signal() {
    signals->async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      wait_signal();
      signal_handler(sig);
    });
  }
};

namespace {

// One output stream of a worker being pumped: whole prefixed lines to the
// console, raw bytes to the log file (tee).
struct Pump {
  explicit Pump(asio::io_context& io, std::string prefix)
      : pipe(io), lines(std::move(prefix)) {}
  asio::posix::stream_descriptor pipe;
  int console_fd = -1;
  Fd file;
  LineBuffer lines;
  std::array<char, 64 * 1024> buf;
  std::string out;
  bool open = false;
};

// A worker's shared state: kept alive by pending handlers after the
// Process handle is gone.
struct Worker : std::enable_shared_from_this<Worker> {
  Worker(PosixEnv::Impl& env, std::string prefix)
      : env(env),
        pidfd(env.io),
        drain_timer(env.io),
        out(env.io, prefix),
        err(env.io, prefix) {}

  PosixEnv::Impl& env;
  pid_t pid = -1;
  asio::posix::stream_descriptor pidfd;
  asio::steady_timer drain_timer;
  Pump out;
  Pump err;
  Env::ExitCallback on_exit;
  ExitStatus status;
  bool reaped = false;
  bool done = false;  // callback delivered or cancelled

  void read(Pump& p) {
    auto self = shared_from_this();
    p.pipe.async_read_some(
        asio::buffer(p.buf),
        [self, &p](const boost::system::error_code& ec, size_t n) {
          if (n > 0) {
            std::string_view data(p.buf.data(), n);
            if (p.file.get() >= 0) write_all(p.file.get(), data);
            if (p.console_fd >= 0) {
              p.out.clear();
              p.lines.feed(data, p.out);
              if (!p.out.empty()) write_all(p.console_fd, p.out);
            }
          }
          if (ec) {
            if (ec != asio::error::operation_aborted) self->close(p);
            return;
          }
          self->read(p);
        });
  }

  void close(Pump& p) {
    if (!p.open) return;
    p.open = false;
    boost::system::error_code ignored;
    p.pipe.close(ignored);
    if (p.console_fd >= 0) {
      p.out.clear();
      p.lines.flush(p.out);
      if (!p.out.empty()) write_all(p.console_fd, p.out);
    }
    p.file.reset();
    maybe_deliver();
  }

  void watch_exit() {
    auto self = shared_from_this();
    pidfd.async_wait(asio::posix::stream_descriptor::wait_read,
                     [self](const boost::system::error_code& ec) {
                       if (ec) return;
                       self->on_exited();
                     });
  }

  void on_exited() {
    // The reactor can report a pidfd readable while the worker still runs
    // (seen about once in 200 restarts of 8 workers, a fresh pidfd reusing
    // the number of one just closed): confirm the exit without reaping
    // before touching the group, or the kill below hits a live worker.
    siginfo_t info{};
    int wr;
    do {
      wr = ::waitid(P_PID, static_cast<id_t>(pid), &info,
                    WEXITED | WNOHANG | WNOWAIT);
    } while (wr < 0 && errno == EINTR);
    if (wr == 0 && info.si_pid == 0) {
      watch_exit();
      return;
    }
    // Still a zombie here, so its group id cannot have been reused: kill
    // the children it left behind, then reap it.
    ::kill(-pid, SIGKILL);
    int st = 0;
    pid_t r;
    do {
      r = ::waitpid(pid, &st, WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) {  // not reapable after all; wait for the next readiness
      watch_exit();
      return;
    }
    status = r == pid ? ExitStatus::from_wait_status(st) : ExitStatus{255, 0};
    reaped = true;
    env.watchdog.remove_group(pid);
    boost::system::error_code ignored;
    pidfd.close(ignored);
    if (out.open || err.open) {
      auto self = shared_from_this();
      drain_timer.expires_after(env.drain_timeout);
      drain_timer.async_wait([self](const boost::system::error_code& ec) {
        if (ec) return;
        // Someone outside the group still holds the pipes: stop reading.
        self->close(self->out);
        self->close(self->err);
      });
    }
    maybe_deliver();
  }

  void maybe_deliver() {
    if (done || !reaped || out.open || err.open) return;
    done = true;
    drain_timer.cancel();
    auto cb = std::move(on_exit);
    cb(status);
  }

  void cancel() {
    done = true;
    boost::system::error_code ignored;
    pidfd.close(ignored);
    drain_timer.cancel();
    if (out.open) {
      out.open = false;
      out.pipe.close(ignored);
    }
    if (err.open) {
      err.open = false;
      err.pipe.close(ignored);
    }
  }
};

class PosixProcess : public Process {
 public:
  explicit PosixProcess(std::shared_ptr<Worker> w) : w_(std::move(w)) {}
  ~PosixProcess() override { w_->cancel(); }
  int pid() const override { return w_->pid; }
  void signal_group(int sig) override {
    if (w_->reaped) return;  // its group id may be reused now
    ::kill(-w_->pid, sig);
  }

 private:
  std::shared_ptr<Worker> w_;
};

class AsioTimer : public Timer {
 public:
  AsioTimer(asio::io_context& io, std::chrono::milliseconds delay,
            std::function<void()> fn)
      : timer_(io), live_(std::make_shared<bool>(true)) {
    timer_.expires_after(delay);
    timer_.async_wait([live = live_, fn = std::move(fn)](
                          const boost::system::error_code& ec) {
      if (!ec && *live) fn();
    });
  }
  ~AsioTimer() override {
    *live_ = false;
    timer_.cancel();
  }

 private:
  asio::steady_timer timer_;
  std::shared_ptr<bool> live_;
};

}  // namespace

PosixEnv::PosixEnv() : impl_(std::make_unique<Impl>()) {
  ::getrlimit(RLIMIT_NOFILE, &impl_->nofile);
}
PosixEnv::~PosixEnv() = default;

void PosixEnv::set_drain_timeout(std::chrono::milliseconds t) {
  impl_->drain_timeout = t;
}

std::unique_ptr<Process> PosixEnv::spawn(const ProcessSpec& spec,
                                         ExitCallback on_exit) {
  Impl& env = *impl_;
  if (!env.watchdog.started()) {
    try {
      env.watchdog.start(env.orphan_dir);
    } catch (const std::exception& e) {
      throw SpawnError(std::string("cannot start the watchdog: ") + e.what());
    }
  }
  if (env.dev_null.get() < 0) {
    env.dev_null.reset(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  }
  auto w = std::make_shared<Worker>(env, spec.prefix);
  w->on_exit = std::move(on_exit);

  // For each stream, the fd the child gets: a pipe we pump when the console
  // shows it, the log file itself when only a file wants it, or /dev/null.
  Fd child_ends[2];
  Pump* pumps[2] = {&w->out, &w->err};
  const StreamTarget* targets[2] = {&spec.out, &spec.err};
  for (int k = 0; k < 2; ++k) {
    const StreamTarget& t = *targets[k];
    Fd file;
    if (!t.file.empty()) file = open_log(t.file);
    if (t.console_fd >= 0) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) {
        throw SpawnError(std::string("pipe: ") + std::strerror(errno));
      }
      pumps[k]->pipe.assign(p[0]);
      pumps[k]->open = true;
      pumps[k]->console_fd = t.console_fd;
      pumps[k]->file = std::move(file);
      child_ends[k].reset(p[1]);
    } else if (file.get() >= 0) {
      child_ends[k] = std::move(file);
    }
  }

  std::vector<const char*> argv;
  for (const auto& a : spec.argv) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  std::vector<const char*> envp;
  for (const auto& e : spec.env) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  // A worker in a process group of its own is in the terminal's
  // background: reading a terminal stdin would stop it (SIGTTIN) for good.
  // Pipes and files are inherited as they are.
  if (env.null_in.get() < 0 && ::isatty(STDIN_FILENO)) {
    env.null_in.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  WorkerInit init{
      envp.data(),
      env.null_in.get(),
      child_ends[0].get() >= 0 ? child_ends[0].get() : env.dev_null.get(),
      child_ends[1].get() >= 0 ? child_ends[1].get() : env.dev_null.get(),
      ::getpid(),
      env.nofile};

  // vfork: no copy of the agent's page tables, so a spawn costs about what
  // it costs a tiny C program. The launcher calls notify_fork() on the
  // executor's context, in the child too, which would rebuild the live
  // reactor inside the agent's shared memory; a private idle context takes
  // those calls instead (the pidfd we watch is our own, below).
  asio::io_context launch_ctx;
  bp::posix::vfork_launcher launcher;
  bp::error_code ec;
  const char** args = argv.data();
  auto proc =
      launcher(launch_ctx.get_executor(), ec, spec.executable, args, init);
  if (ec) {
    // The child has already _exit()ed (vfork resumes us only then).
    if (launcher.pid > 0) ::waitpid(launcher.pid, nullptr, 0);
    throw SpawnError("cannot execute '" + spec.executable +
                     "': " + ec.message());
  }
  w->pid = proc.id();
  // Our own pidfd, so that we can kill the group between exit and reaping.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, w->pid, 0));
  proc.detach();
  env.watchdog.add_group(w->pid);
  if (pidfd < 0) {
    int e = errno;
    ::kill(-w->pid, SIGKILL);
    throw SpawnError(std::string("pidfd_open: ") + std::strerror(e) +
                     " (dlaunch needs Linux >= 5.3)");
  }
  w->pidfd.assign(pidfd);
  // The child has its copies; ours must go so EOF means "all writers gone".
  child_ends[0].reset();
  child_ends[1].reset();
  w->watch_exit();
  if (w->out.open) w->read(w->out);
  if (w->err.open) w->read(w->err);
  return std::make_unique<PosixProcess>(std::move(w));
}

void PosixEnv::remove_if_orphaned(const std::filesystem::path& dir) {
  impl_->orphan_dir = dir;
}

std::unique_ptr<Timer> PosixEnv::start_timer(std::chrono::milliseconds delay,
                                             std::function<void()> fn) {
  return std::make_unique<AsioTimer>(impl_->io, delay, std::move(fn));
}

void PosixEnv::handle_signals(const std::vector<int>& signals,
                              std::function<void(int)> handler) {
  impl_->signals.emplace(impl_->io);
  for (int s : signals) impl_->signals->add(s);
  impl_->signal_handler = std::move(handler);
  impl_->wait_signal();
}

std::chrono::system_clock::time_point PosixEnv::now() {
  return std::chrono::system_clock::now();
}

int PosixEnv::free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "0", &hints, &res);
  if (rc != 0) {
    throw std::runtime_error("cannot resolve master address '" + host + "': " +
                             ::gai_strerror(rc) + "; check --master-addr");
  }
  std::string why = "no address";
  int port = -1;
  for (addrinfo* a = res; a != nullptr && port < 0; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0));
    if (s.get() < 0 || ::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    port = ss.ss_family == AF_INET6
               ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
               : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  }
  ::freeaddrinfo(res);
  if (port < 0) {
    throw std::runtime_error("cannot bind a free port on master address '" +
                             host + "': " + why + "; check --master-addr");
  }
  return port;
}

void PosixEnv::run() {
  auto guard = asio::make_work_guard(impl_->io);
  impl_->io.restart();
  impl_->io.run();
}

void PosixEnv::stop() { impl_->io.stop(); }

}  // namespace dlaunch::agent
