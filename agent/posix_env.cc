#include "agent/posix_env.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/process/v2/posix/vfork_launcher.hpp>
#include <boost/process/v2/process.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "agent/console.h"
#include "agent/cpu_cores.h"
#include "agent/line_buffer.h"
#include "agent/watchdog.h"
#include "comm/pidfd.h"
#include "comm/store/resolve.h"
#include "comm/store/text.h"

namespace dlaunch::agent {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

bool write_all(int fd, std::string_view data) {
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
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void die_with_parent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The parent may have died between fork and prctl: then nobody would send
  // the death signal, so check who our parent is now.
  if (::getppid() != parent) ::raise(SIGKILL);
}

namespace {
// Read at load time, before any part of dlaunch raises it.
const rlimit kUserFdLimit = [] {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  return r;
}();
}  // namespace

const rlimit& user_fd_limit() { return kUserFdLimit; }

bool environ_has(pid_t pid, const std::string& entry) {
  return environ_entry(pid, entry) == EnvironEntry::kPresent;
}

EnvironEntry environ_entry(pid_t pid, const std::string& entry) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ",
                   std::ios::binary);
  // Not ours to read (a non-dumpable process of another user) or gone.
  if (!in) return EnvironEntry::kAbsent;
  std::string var;
  bool any = false;
  while (std::getline(in, var, '\0')) {
    if (var == entry) return EnvironEntry::kPresent;
    any = true;
  }
  return any ? EnvironEntry::kAbsent : EnvironEntry::kUnknown;
}

namespace {

// How long end_strays() looks again at adopted children whose environment
// reads empty (in execve: microseconds, more on a loaded machine), before
// taking them for untagged: a job whose workers leave such a child (one
// started with an empty environment) ends this much later, once (the
// child is not waited for again).
constexpr auto kUnreadableFor = std::chrono::milliseconds(200);

// What commands_may_orphan() and helper_started() record, process-wide.
struct OwnChildren {
  std::mutex mu;
  std::set<pid_t> helpers;
  bool commands_may_orphan = false;
};

OwnChildren& own_children() {
  static OwnChildren own;
  return own;
}

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

// Boost.Process initializer for the vforked child (async-signal-safe
// calls only, and nothing that allocates: the memory is the agent's):
// stdio, the user's open-file limit, a process group of its own, an
// optional core, death with the agent, default signal handling.
struct WorkerInit {
  const char* const* envp;
  int in_fd;  // -1: inherit the agent's stdin
  int out_fd;
  int err_fd;
  pid_t parent;
  rlimit nofile;          // the open-file limit dlaunch itself was started with
  const cpu_set_t* cpus;  // the CPUs it may run on; null: the agent's
  // Set by the child (vfork: the agent's memory) to the step that failed.
  const char* failed_step = nullptr;

  template <typename Launcher, typename Path>
  bp::error_code on_setup(Launcher& launcher, const Path&, const char* const*) {
    launcher.env = envp;
    return {};
  }

  template <typename Launcher, typename Path>
  bp::error_code on_exec_setup(Launcher&, const Path&, const char* const*) {
    auto fail = [&](const char* step) {
      failed_step = step;
      return bp::error_code(errno, boost::system::system_category());
    };
    if ((in_fd >= 0 && ::dup2(in_fd, STDIN_FILENO) < 0) ||
        ::dup2(out_fd, STDOUT_FILENO) < 0 ||
        ::dup2(err_fd, STDERR_FILENO) < 0) {
      return fail("redirecting its output");
    }
    // The embedded store raises dlaunch's own limit; workers get the user's.
    if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      return fail("restoring its open-file limit (setrlimit)");
    }
    // A group of its own is what stopping the worker signals; without it
    // the agent could not stop the worker's children. From here no
    // terminal's signal reaches the child.
    if (::setpgid(0, 0) != 0) {
      return fail("giving it a process group (setpgid)");
    }
    if (cpus != nullptr && ::sched_setaffinity(0, sizeof(*cpus), cpus) != 0) {
      return fail("binding it to its core (sched_setaffinity)");
    }
    die_with_parent(parent);
    // The agent ignores SIGPIPE (a vanished console must not kill it);
    // an ignored signal stays ignored across exec, so give workers the
    // default back. Every signal is blocked since before vfork: one that
    // arrived meanwhile must not run the agent's handler here, in the
    // agent's memory, when it is unblocked; it gets its default action, as
    // it would in the worker.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);
    sigset_t pending;
    if (::sigpending(&pending) == 0) {
      for (int sig = 1; sig < NSIG; ++sig) {
        struct sigaction cur {};
        if (::sigismember(&pending, sig) == 1 &&
            ::sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler != SIG_DFL &&
            cur.sa_handler != SIG_IGN) {
          ::sigaction(sig, &dfl, nullptr);
        }
      }
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // Nothing else of the agent's reaches the worker (its fds are
    // close-on-exec; these are the ones dlaunch itself inherited).
    ::close_range(3, ~0U, 0);
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
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(2)};
  Fd dev_null;  // write end for discarded streams
  Fd null_in;   // stdin for workers when the agent's is a terminal
  bool stdin_checked = false;  // whether null_in was decided (first spawn)
  rlimit nofile{};             // RLIMIT_NOFILE when the env was made
  // The cores the agent may run on (read at the first bound spawn).
  std::optional<std::vector<std::vector<int>>> cores;
  // "DLAUNCH_AGENT_TAG=<random>", in every worker's environment and so in
  // their descendants': how strays are found (see end_strays()).
  std::string tag;
  std::optional<asio::signal_set> sigchld;  // reaps adopted strays
  std::set<pid_t> workers;                  // spawned, not yet reaped
  size_t running = 0;      // workers neither reaped nor abandoned
  std::set<pid_t> strays;  // children of ours seen carrying the tag
  // The process groups of the workers spawned (each leads its own), the
  // latest kWorkerGroupsKept: an adopted child still in one is a worker's,
  // even dead (a zombie's environment reads empty, so no tag is seen).
  std::deque<pid_t> worker_groups;
  static constexpr size_t kWorkerGroupsKept = 4096;
  // Adopted children whose environment read empty for all of
  // kUnreadableFor (end_strays()).
  std::set<pid_t> unreadable;
  // The live children the process had when the env was made (a shell's
  // `monitor & exec dlaunch ...`): not strays, and their own orphans may
  // come to the agent, so strays are then known by their tag only.
  std::set<pid_t> inherited;
  bool watchdog_warned = false;
  std::thread background;  // run_in_background()'s, joined before reuse
  // Declared last: destroyed (their writers stopped) before the loop.
  Console console_out{STDOUT_FILENO};
  // Null when stderr is stdout's file (`2>&1 | tee`): one queue for both.
  std::unique_ptr<Console> own_err =
      Console::same_file(STDOUT_FILENO, STDERR_FILENO)
          ? nullptr
          : std::make_unique<Console>(STDERR_FILENO);
  Console& console_err = own_err ? *own_err : console_out;

  Console& console(int fd) {
    return fd == STDERR_FILENO ? console_err : console_out;
  }

  void wait_signal() {
    signals->async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      wait_signal();
      signal_handler(sig);
    });
  }

  // The CPUs of core number `slot` mod the number of cores the agent may
  // run on (--cpu-bind core).
  cpu_set_t core_set(int slot) {
    if (!cores) cores = allowed_cores();
    if (cores->empty()) {
      throw SpawnError(
          "--cpu-bind core: cannot read the CPUs dlaunch may run on "
          "(sched_getaffinity failed); use --cpu-bind none");
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : (*cores)[static_cast<size_t>(slot) % cores->size()]) {
      CPU_SET(cpu, &set);
    }
    return set;
  }

  // Starts the watchdog (once), making the folder from the first of
  // `dir_templates` that works (Watchdog::start).
  std::string start_watchdog(std::vector<std::string> dir_templates = {}) {
    if (watchdog.started()) return "";
    try {
      return watchdog.start(tag, std::move(dir_templates));
    } catch (const std::system_error& e) {
      throw SpawnError(std::string("cannot start the watchdog: ") + e.what());
    }
  }

  // Makes the agent the reaper of its workers' orphans, so a child that
  // leaves its process group (setsid) stays below the agent.
  void become_subreaper() {
    if (sigchld) return;
    if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
      console_err.write(std::string("dlaunch: warning: cannot become the ") +
                        "reaper of the workers' children (" +
                        std::strerror(errno) +
                        "); a child that leaves its process group may "
                        "outlive its worker\n");
    }
    sigchld.emplace(io, SIGCHLD);
    wait_sigchld();
  }

  void wait_sigchld() {
    sigchld->async_wait([this](const boost::system::error_code& ec, int) {
      if (ec) return;
      wait_sigchld();
      note_strays();
      reap_strays();
    });
  }

  void worker_gone(pid_t pid, bool reaped) {
    if (reaped) workers.erase(pid);
    if (--running == 0) end_strays();
  }

  // The agent's children that strays can be among, right now: the thread
  // group leader's. The kernel hands an orphan to the subreaper's first
  // live thread, which is the leader while the agent runs
  // (find_new_reaper); the other threads' lists hold only what they spawned
  // themselves (workers, never strays). One small read: this runs on every
  // SIGCHLD.
  static std::vector<pid_t> adopted_children() {
    std::vector<pid_t> out;
    const std::string path =
        "/proc/self/task/" + std::to_string(::getpid()) + "/children";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    const char* p = text.data();
    const char* end = p + text.size();
    while (p < end) {
      pid_t pid = 0;
      auto [next, ec] = std::from_chars(p, end, pid);
      if (ec == std::errc()) out.push_back(pid);
      p = next < end ? next + 1 : end;  // past the space after each pid
    }
    return out;
  }

  // Every descendant of `root` (not `root` itself), read from /proc.
  static void add_descendants(pid_t root, std::vector<pid_t>& out) {
    std::error_code ec;
    std::string base = "/proc/" + std::to_string(root) + "/task";
    for (const auto& task : std::filesystem::directory_iterator(base, ec)) {
      std::ifstream in(task.path() / "children");
      pid_t pid;
      while (in >> pid) {
        out.push_back(pid);
        add_descendants(pid, out);
      }
    }
  }

  // Workers' descendants adopted after their parent died: every child of
  // ours that is not a worker, the watchdog, a helper or inherited; where
  // others' orphans may come to us too (commands_may_orphan(), inherited
  // children), only those carrying the tag. A stray whose environment
  // cannot be read (another user's non-dumpable daemon) or was overwritten
  // (setproctitle) is then missed. `unsure`, when given, gets the live ones
  // whose environment read empty (one in the middle of execve does for a
  // moment), but for those given up on.
  std::vector<pid_t> stray_children(std::vector<pid_t>* unsure = nullptr) {
    std::vector<pid_t> out;
    OwnChildren& own = own_children();
    std::lock_guard lock(own.mu);
    // As a PID namespace's init (a container's entrypoint) every orphan
    // of the container comes to the agent: a shell's `nohup tensorboard &`
    // from `kubectl exec` is none of its workers'.
    const bool all_adopted =
        !own.commands_may_orphan && inherited.empty() && ::getpid() != 1;
    for (pid_t c : adopted_children()) {
      if (c == watchdog.pid() || workers.contains(c) ||
          own.helpers.contains(c) || inherited.contains(c)) {
        continue;
      }
      if (all_adopted || strays.contains(c)) {
        out.push_back(c);
        continue;
      }
      switch (environ_entry(c, tag)) {
        case EnvironEntry::kPresent:
          out.push_back(c);
          break;
        case EnvironEntry::kUnknown:
          if (unsure && !unreadable.contains(c) && alive(c)) {
            unsure->push_back(c);
          }
          break;
        case EnvironEntry::kAbsent:
          break;
      }
    }
    return out;
  }

  void note_strays() {
    if (workers.empty() && strays.empty()) return;
    for (pid_t c : stray_children()) strays.insert(c);
  }

  // Reaps the strays that have exited (never a worker or another child),
  // and the workers' descendants adopted dead, before their tag was seen:
  // children killed with their worker's group would stay zombies.
  void reap_strays() {
    if (!worker_groups.empty()) {
      for (pid_t c : adopted_children()) {
        if (c == watchdog.pid() || workers.contains(c) || strays.contains(c)) {
          continue;
        }
        pid_t group = 0;
        if (zombie_in_group(c, group) &&
            std::find(worker_groups.begin(), worker_groups.end(), group) !=
                worker_groups.end()) {
          strays.insert(c);  // reaped below
        }
      }
    }
    for (auto it = strays.begin(); it != strays.end();) {
      pid_t r;
      do {
        r = ::waitpid(*it, nullptr, WNOHANG);
      } while (r < 0 && errno == EINTR);
      it = r == 0 ? std::next(it) : strays.erase(it);
    }
  }

  // The group has stopped: SIGKILLs every process that descends from a
  // worker and left its process group (their groups are already killed),
  // found as stray children (stray_children()), with their descendants.
  // Repeated while a pass finds any, for children forked meanwhile, and,
  // where strays are known by their tag, for at most kUnreadableFor while
  // an adopted child's environment reads empty: a stray caught in execve
  // (a shell's `exec sleep`) would otherwise be taken for untagged and
  // outlive the job.
  void end_strays() {
    const auto give_up = std::chrono::steady_clock::now() + kUnreadableFor;
    // Given-up pids that are no longer ours may come back as new children.
    const std::vector<pid_t> adopted = adopted_children();
    std::erase_if(unreadable, [&](pid_t p) {
      return std::find(adopted.begin(), adopted.end(), p) == adopted.end();
    });
    for (int pass = 0; pass < 8;) {
      std::vector<pid_t> unsure;
      std::vector<pid_t> doomed;
      for (pid_t c : stray_children(&unsure)) {
        strays.insert(c);
        if (alive(c)) {
          doomed.push_back(c);
          add_descendants(c, doomed);
        }
      }
      if (doomed.empty() && unsure.empty()) break;
      for (pid_t pid : doomed) ::kill(pid, SIGKILL);
      if (!doomed.empty() && unsure.empty()) {
        ++pass;  // at once: SIGKILLed strays die within the next look
        continue;
      }
      if (std::chrono::steady_clock::now() >= give_up) {
        // Untagged, most likely (an empty environment): not waited for
        // again at the next restart.
        unreadable.insert(unsure.begin(), unsure.end());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    reap_strays();
  }

  // Whether `pid` is a zombie; its process group in `group`.
  static bool zombie_in_group(pid_t pid, pid_t& group) {
    const std::string stat = read_proc_stat(pid);
    const size_t close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size()) return false;
    // ") S PPID PGRP ...": state, parent, group.
    std::istringstream in(stat.substr(close + 2));
    char state = 0;
    pid_t parent = 0;
    return (in >> state >> parent >> group) && state == 'Z';
  }

  static std::string read_proc_stat(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(in, line);
    return line;
  }

  // Whether `pid` runs (a zombie does not).
  static bool alive(pid_t pid) {
    const std::string line = read_proc_stat(pid);
    const size_t close = line.rfind(')');
    return close != std::string::npos && close + 2 < line.size() &&
           line[close + 2] != 'Z' && line[close + 2] != 'X';
  }
};

namespace {

// One output stream of a worker being pumped: whole prefixed lines to the
// console's writer, raw bytes to the log file (tee). While the console has
// `backlog->limit` of this stream's bytes queued, the pipe is not read
// (back-pressure on this worker only).
struct Pump {
  explicit Pump(asio::io_context& io, std::string prefix)
      : pipe(io), lines(std::move(prefix)) {}
  asio::posix::stream_descriptor pipe;
  Console* console = nullptr;
  std::shared_ptr<Backlog> backlog;
  Fd file;
  std::filesystem::path file_path;
  LineBuffer lines;
  std::array<char, 64 * 1024> buf;
  std::string out;
  bool open = false;
  bool paused = false;  // waiting for the console to drain
};

// Console bytes one worker stream may have queued before its pipe is no
// longer read.
constexpr size_t kConsoleBacklogBytes = size_t{1} << 20;
// What is still read from a pipe when it is closed (the worker is gone):
// its capacity and then some, so the log file misses nothing it held.
constexpr size_t kFinalDrainBytes = size_t{4} << 20;

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
  std::string log_error;  // the first failed log write, "" if none
  bool reaped = false;
  bool exit_seen = false;  // exited 0, its group left until its pipes close
  // exit_seen: when its drain time ends, for its group and its pipes both
  // (a holder outside the group gets no second drain time).
  std::chrono::steady_clock::time_point drain_deadline{};
  bool done = false;  // callback delivered or cancelled

  // Tees bytes read from a worker: the log file, then the console.
  void take(Pump& p, std::string_view data) {
    if (p.file.get() >= 0 && !write_all(p.file.get(), data)) {
      // Once per file: say so, stop writing (a log with a hole in it
      // would be worse than one cut short), and tell the report.
      std::string why = std::strerror(errno);
      if (log_error.empty()) log_error = p.file_path.string() + ": " + why;
      env.console_err.write("dlaunch: cannot write " + p.file_path.string() +
                            ": " + why + "; the rest of this log is lost\n");
      p.file.reset();
    }
    if (p.console != nullptr) {
      p.out.clear();
      p.lines.feed(data, p.out);
      if (!p.out.empty()) p.console->write(p.out, p.backlog);
    }
  }

  void read(Pump& p) {
    auto self = shared_from_this();
    p.pipe.async_read_some(
        asio::buffer(p.buf),
        [self, &p](const boost::system::error_code& ec, size_t n) {
          if (n > 0) self->take(p, std::string_view(p.buf.data(), n));
          if (ec) {
            if (ec != asio::error::operation_aborted) self->close(p);
            return;
          }
          if (!p.open) return;
          if (Backlog* b = p.backlog.get(); b && b->queued >= b->limit) {
            // Set before the second look, so the writer cannot drain
            // between the look and the flag without waking us.
            b->waiting = true;
            if (b->queued >= b->limit) {
              p.paused = true;
              return;
            }
            b->waiting = false;
          }
          self->read(p);
        });
  }

  // The console drained this stream's backlog: read on.
  void resume(Pump& p) {
    if (!p.paused || !p.open) return;
    p.paused = false;
    read(p);
  }

  void close(Pump& p) {
    if (!p.open) return;
    p.open = false;
    p.paused = false;
    // What the worker wrote while reading was paused is still in the pipe:
    // the log file gets all of it; the console queue takes it beyond its
    // limit (the worker is gone; nothing more comes).
    int fd = p.pipe.native_handle();
    if (int fl = ::fcntl(fd, F_GETFL); (fl & O_NONBLOCK) == 0) {
      ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    }
    for (size_t got = 0; got < kFinalDrainBytes;) {
      ssize_t n = ::read(fd, p.buf.data(), p.buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      take(p, std::string_view(p.buf.data(), static_cast<size_t>(n)));
      got += static_cast<size_t>(n);
    }
    boost::system::error_code ignored;
    p.pipe.close(ignored);
    if (p.console != nullptr) {
      p.out.clear();
      p.lines.flush(p.out);
      if (!p.out.empty()) p.console->write(p.out, p.backlog);
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
    // A worker that succeeded may have left children writing the last of
    // its output (a `tee` it started): they get the drain time to finish
    // before its group is killed (its exit is told when its pipes close
    // anyway). Only where dlaunch reads the output: a worker writing to
    // its log file alone (--redirects) has no pipe to tell the end by. A
    // failed one's group goes at once: the job restarts.
    if (!exit_seen && info.si_code == CLD_EXITED && info.si_status == 0 &&
        (out.open || err.open)) {
      exit_seen = true;
      drain_deadline = std::chrono::steady_clock::now() + env.drain_timeout;
      auto self = shared_from_this();
      drain_timer.expires_at(drain_deadline);
      drain_timer.async_wait([self](const boost::system::error_code& ec) {
        if (!ec) self->end_group();
      });
      return;
    }
    end_group();
  }

  // Kills the children the worker left in its group and reaps it.
  void end_group() {
    if (reaped || done) return;
    // Still a zombie here, so its group id cannot have been reused.
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
    env.worker_gone(pid, true);
    boost::system::error_code ignored;
    pidfd.close(ignored);
    if (out.open || err.open) {
      auto self = shared_from_this();
      drain_timer.expires_at(exit_seen ? drain_deadline
                                       : std::chrono::steady_clock::now() +
                                             env.drain_timeout);
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
    if (exit_seen && !reaped && !out.open && !err.open) {
      drain_timer.cancel();
      end_group();  // delivers
      return;
    }
    if (done || !reaped || out.open || err.open) return;
    done = true;
    drain_timer.cancel();
    auto cb = std::move(on_exit);
    cb(status);
  }

  void cancel() {
    if (!reaped && !done) env.worker_gone(pid, false);
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
  std::string log_error() const override { return w_->log_error; }
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

void commands_may_orphan() {
  OwnChildren& own = own_children();
  std::lock_guard lock(own.mu);
  own.commands_may_orphan = true;
}

void helper_started(pid_t pid) {
  OwnChildren& own = own_children();
  std::lock_guard lock(own.mu);
  own.helpers.insert(pid);
}

void helper_gone(pid_t pid) {
  OwnChildren& own = own_children();
  std::lock_guard lock(own.mu);
  own.helpers.erase(pid);
}

PosixEnv::PosixEnv() : impl_(std::make_unique<Impl>()) {
  for (pid_t c : Impl::adopted_children()) {
    if (Impl::alive(c)) impl_->inherited.insert(c);
  }
  // The user's, not what the embedded store (a multi-host head's,
  // started before this env) raised it to.
  impl_->nofile = user_fd_limit();
  // Three to five fds a worker (pipes, pidfd, log files): at the common
  // soft limit of 1024 about 200 workers with logs would not start. The
  // agent takes the hard limit; workers get the user's back (spawn).
  if (rlimit raised = impl_->nofile; raised.rlim_cur < raised.rlim_max) {
    // (Raised again when the store did first: no harm.)
    raised.rlim_cur = raised.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &raised);  // failing, the user's limit holds
  }
  // A console that went away (`dlaunch ... | head`) must end console
  // output, not the agent: writes fail with EPIPE instead.
  ::signal(SIGPIPE, SIG_IGN);
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof buf, "DLAUNCH_AGENT_TAG=%d-%08x%08x", ::getpid(),
                rd(), rd());
  impl_->tag = buf;
}

PosixEnv::~PosixEnv() {
  if (impl_->background.joinable()) impl_->background.join();
  // Clean only when every worker was reaped: a worker given up on unreaped
  // (cancelled) still had its children then, so end_strays() could not
  // find those that left its group; the watchdog's sweep by tag must.
  if (impl_->running == 0 && impl_->workers.empty()) {
    impl_->watchdog.stopped_cleanly();
  }
  // Whatever the console has not taken by now is dropped after the bound,
  // so dlaunch exits even when nobody reads its output; said on stderr
  // when it takes it (the log files get their own note).
  Console& out = impl_->console_out;
  Console& err = impl_->console_err;  // finish() a no-op when shared
  const size_t dropped =
      out.finish(impl_->drain_timeout) + err.finish(impl_->drain_timeout);
  if (dropped > 0) {
    const size_t unlogged =
        out.dropped_unlogged() + (&err == &out ? 0 : err.dropped_unlogged());
    err.write_if_taken(
        "dlaunch: " + std::to_string(dropped) +
        " bytes of output never reached the console: it accepted nothing "
        "for " +
        comm::store::format_duration(impl_->drain_timeout) +
        " after the job ended; " +
        (unlogged == 0 ? std::string("the log files have them all")
                       : std::to_string(unlogged) +
                             " of them are in no log file (--log-dir with "
                             "-t/--tee keeps a copy)") +
        "\n");
  }
}

void PosixEnv::set_drain_timeout(std::chrono::milliseconds t) {
  impl_->drain_timeout = t;
}

std::unique_ptr<Process> PosixEnv::spawn(const ProcessSpec& spec,
                                         ExitCallback on_exit) {
  Impl& env = *impl_;
  cpu_set_t cpus;
  if (spec.core_slot >= 0) cpus = env.core_set(spec.core_slot);
  env.start_watchdog();
  env.become_subreaper();
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
      Pump& pump = *pumps[k];
      pump.pipe.assign(p[0]);
      pump.open = true;
      pump.console = &env.console(t.console_fd);
      pump.backlog = std::make_shared<Backlog>();
      pump.backlog->limit = kConsoleBacklogBytes;
      pump.backlog->log = t.file;
      // Called on a console's writer thread.
      pump.backlog->wake = [&io = env.io, weak = std::weak_ptr<Worker>(w),
                            &pump] {
        asio::post(io, [weak, &pump] {
          if (auto self = weak.lock()) self->resume(pump);
        });
      };
      pump.file = std::move(file);
      pump.file_path = t.file;
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
  envp.push_back(env.tag.c_str());
  envp.push_back(nullptr);
  // A worker in a process group of its own is in the terminal's
  // background: reading a terminal stdin would stop it (SIGTTIN) for good.
  // Pipes and files are inherited as they are.
  if (!env.stdin_checked) {
    env.stdin_checked = true;
    if (::isatty(STDIN_FILENO)) {
      env.null_in.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
  }
  WorkerInit init{
      envp.data(),
      env.null_in.get(),
      child_ends[0].get() >= 0 ? child_ends[0].get() : env.dev_null.get(),
      child_ends[1].get() >= 0 ? child_ends[1].get() : env.dev_null.get(),
      ::getpid(),
      env.nofile,
      spec.core_slot >= 0 ? &cpus : nullptr};

  // vfork (Boost.Process's vfork launcher): no copy of the agent's page
  // tables, so a spawn costs about what it costs a tiny C program. The
  // launcher calls notify_fork() on the executor's context, in the child
  // too, which would rebuild the live reactor inside the agent's shared
  // memory; a private idle context takes those calls instead (the pidfd we
  // watch is our own, below). Every signal stays blocked until the child
  // has its own group (WorkerInit).
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  asio::io_context launch_ctx;
  bp::posix::vfork_launcher launcher;
  bp::error_code ec;
  const char** args = argv.data();
  auto proc =
      launcher(launch_ctx.get_executor(), ec, spec.executable, args, init);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (ec) {
    // The child has already _exit()ed (vfork resumes us only then).
    if (launcher.pid > 0) ::waitpid(launcher.pid, nullptr, 0);
    if (init.failed_step != nullptr) {
      throw SpawnError("cannot start '" + spec.executable +
                       "': " + init.failed_step + " failed: " + ec.message());
    }
    throw SpawnError("cannot execute '" + spec.executable +
                     "': " + ec.message());
  }
  const pid_t pid = proc.id();
  proc.detach();
  w->pid = pid;
  env.workers.insert(w->pid);
  env.worker_groups.push_back(w->pid);
  if (env.worker_groups.size() > Impl::kWorkerGroupsKept) {
    env.worker_groups.pop_front();
  }
  ++env.running;
  // Our own pidfd, so that we can kill the group between exit and reaping.
  int pidfd = dlaunch::pidfd_open(w->pid);
  if (!env.watchdog.add_group(w->pid) && !env.watchdog_warned) {
    env.watchdog_warned = true;
    env.console_err.write(
        "dlaunch: warning: the watchdog (pid " +
        std::to_string(env.watchdog.pid()) + ") cannot be told about " +
        "workers (" + std::strerror(errno) +
        "); if dlaunch is killed, workers' children may outlive it\n");
  }
  if (pidfd < 0) {
    int e = errno;
    ::kill(-w->pid, SIGKILL);
    env.worker_gone(w->pid, false);
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

std::filesystem::path PosixEnv::make_temp_dir(
    std::vector<std::string> templates) {
  if (impl_->watchdog.started()) {
    throw std::logic_error("make_temp_dir() after the first spawn");
  }
  // The watchdog starts now, not at the first spawn, knowing the folder's
  // name before the folder exists: a dlaunch killed before its workers
  // start, even as the folder is made, must not leave it behind either.
  return impl_->start_watchdog(std::move(templates));
}

void PosixEnv::write_console(int fd, std::string_view text) {
  impl_->console(fd).write(text);
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
  // A lookup of the master address that hangs (a dead nameserver) must
  // not hold the rendezvous up for good.
  constexpr std::chrono::seconds kLookupTimeout(30);
  std::string error;
  int port = comm::store::free_port(
      host, std::chrono::steady_clock::now() + kLookupTimeout, error);
  if (port < 0) throw std::runtime_error(error + "; check --master-addr");
  return port;
}

void PosixEnv::post(std::function<void()> fn) {
  // io_context::post is thread-safe: it wakes the epoll loop via its
  // eventfd, so the loop sleeps until an event really arrives.
  asio::post(impl_->io, std::move(fn));
}

void PosixEnv::run_in_background(std::function<void()> work,
                                 std::function<void()> done) {
  // The previous one posted its `done` as its last act: this join is short.
  if (impl_->background.joinable()) impl_->background.join();
  impl_->background = std::thread(
      [this, work = std::move(work), done = std::move(done)]() mutable {
        work();
        post(std::move(done));
      });
}

void PosixEnv::run() {
  auto guard = asio::make_work_guard(impl_->io);
  impl_->io.restart();
  impl_->io.run();
}

void PosixEnv::stop() { impl_->io.stop(); }

}  // namespace dlaunch::agent
