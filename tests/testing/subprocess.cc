#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "comm/pidfd.h"

extern char** environ;

namespace dlaunch::testing {

Subprocess::Subprocess(const CommandOptions& options) {
  if (options.argv.empty())
    throw std::invalid_argument("Subprocess: empty argv");
  int out[2] = {-1, options.stdout_fd}, err[2] = {-1, options.stderr_fd};
  if ((options.stdout_fd < 0 && ::pipe2(out, O_CLOEXEC) != 0) ||
      (options.stderr_fd < 0 && ::pipe2(err, O_CLOEXEC) != 0)) {
    throw std::system_error(errno, std::generic_category(), "pipe2");
  }
  // Build everything before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    bool drop = options.env.contains(key);
    for (const auto& u : options.unset_env) drop = drop || u == key;
    if (!drop) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : options.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  start_ = std::chrono::steady_clock::now();
  pid_ = ::fork();
  if (pid_ < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid_ == 0) {
    int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) ::_exit(126);
    ::execvpe(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  // The caller's own fds stay the caller's.
  if (options.stdout_fd < 0) ::close(out[1]);
  if (options.stderr_fd < 0) ::close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

Subprocess::~Subprocess() {
  if (!result_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);  // SIGKILLed: returns promptly
  }
  if (out_fd_ >= 0) ::close(out_fd_);
  if (err_fd_ >= 0) ::close(err_fd_);
}

bool Subprocess::pump(std::chrono::milliseconds budget) {
  pollfd fds[2];
  int n = 0;
  if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
  if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
  if (n == 0) return false;
  int rc =
      ::poll(fds, static_cast<nfds_t>(n), static_cast<int>(budget.count()));
  if (rc <= 0) return true;
  for (int i = 0; i < n; ++i) {
    if (fds[i].revents == 0) continue;
    char buf[65536];
    ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
    bool is_out = fds[i].fd == out_fd_;
    if (r > 0) {
      (is_out ? out_ : err_).append(buf, static_cast<size_t>(r));
    } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
      ::close(fds[i].fd);
      (is_out ? out_fd_ : err_fd_) = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

bool Subprocess::wait_for_output(const std::string& text,
                                 std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (out_.find(text) != std::string::npos ||
        err_.find(text) != std::string::npos) {
      return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (!pump(left)) {
      return out_.find(text) != std::string::npos ||
             err_.find(text) != std::string::npos;
    }
  }
}

void Subprocess::signal(int sig) {
  if (!result_ && pid_ > 0) ::kill(pid_, sig);
}

CommandResult Subprocess::wait(std::chrono::milliseconds timeout) {
  if (result_) return *result_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  CommandResult r;
  int pidfd = dlaunch::pidfd_open(pid_);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid_, SIGKILL);
      r.timed_out = true;
      break;
    }
    // Read output while waiting for the exit (a full pipe would block it).
    pollfd fds[3];
    int n = 0;
    fds[n++] = {pidfd, POLLIN, 0};
    if (out_fd_ >= 0) fds[n++] = {out_fd_, POLLIN, 0};
    if (err_fd_ >= 0) fds[n++] = {err_fd_, POLLIN, 0};
    ::poll(fds, static_cast<nfds_t>(n), static_cast<int>(left.count()));
    if (fds[0].revents != 0) break;
    pump(std::chrono::milliseconds(0));
  }
  int status = 0;
  ::waitpid(pid_, &status, 0);
  ::close(pidfd);
  // Drain what is left, bounded: a grandchild may still hold the pipes.
  auto drain_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < drain_deadline &&
         pump(std::chrono::milliseconds(100))) {
  }
  if (WIFSIGNALED(status)) {
    r.signal = WTERMSIG(status);
  } else {
    r.exit_code = WEXITSTATUS(status);
  }
  if (r.timed_out) r.exit_code = -1;
  r.out = out_;
  r.err = err_;
  r.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start_);
  result_ = r;
  return r;
}

CommandResult run_command(const CommandOptions& options,
                          std::chrono::milliseconds timeout) {
  Subprocess p(options);
  return p.wait(timeout);
}

std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout) {
  int pidfd = dlaunch::pidfd_open(pid);
  bool exited = true;
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    exited = ::poll(&p, 1, static_cast<int>(timeout.count())) > 0;
    ::close(pidfd);
  }
  if (!exited) ::kill(pid, SIGKILL);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return std::nullopt;
  if (!exited) return std::nullopt;
  return status;
}

std::string read_proc_file(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end, or the process is gone (ESRCH)
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::vector<pid_t> processes_with_env(const std::string& entry) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = read_proc_file(e.path() / "environ");
    // Zombies keep no environment; a match is a live process.
    if (env.starts_with(entry + '\0') ||
        env.find('\0' + entry + '\0') != std::string::npos || env == entry ||
        env.ends_with('\0' + entry)) {
      out.push_back(std::stoi(name));
    }
  }
  return out;
}

std::string unique_mark(const std::string& prefix) {
  std::random_device rd;
  return prefix + std::to_string(rd()) + std::to_string(::getpid());
}

std::vector<pid_t> marked(const std::string& mark) {
  return processes_with_env("DLT_MARK=" + mark);
}

bool none_marked(const std::string& mark, std::chrono::milliseconds bound) {
  return eventually([&] { return marked(mark).empty(); }, bound);
}

std::string describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout\n" + r.out +
         "\n--- stderr\n" + r.err;
}

bool eventually(const std::function<bool()>& done,
                std::chrono::milliseconds bound,
                std::chrono::milliseconds poll) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(poll);
  }
  return done();
}

char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return '?';
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return '?';
  return line[close + 2];
}

bool process_alive(pid_t pid) {
  const char state = process_state(pid);
  return state != '?' && state != 'Z' && state != 'X';
}

std::vector<pid_t> descendants(pid_t root) {
  // parent of every live process, then a walk from `root`.
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.empty() ||
        name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (state == 'Z' || state == 'X') continue;
    children[ppid].push_back(static_cast<pid_t>(std::stoi(name)));
  }
  std::vector<pid_t> out;
  std::vector<pid_t> todo{root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    for (pid_t c : children[p]) {
      out.push_back(c);
      todo.push_back(c);
    }
  }
  return out;
}

std::set<int> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  for (const auto& e : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >>
          timeout >> inode;
      if (st == "0A" && inodes.contains(inode)) {
        ports.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
      }
    }
  }
  return ports;
}

Gate::Gate(const std::string& path) : path_(path) {
  if (::mkfifo(path.c_str(), 0600) != 0) {
    throw std::system_error(errno, std::generic_category(), "mkfifo " + path);
  }
  fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) {
    throw std::system_error(errno, std::generic_category(), "open " + path);
  }
}

Gate::~Gate() {
  if (fd_ >= 0) ::close(fd_);
}

void Gate::open_once() {
  if (::write(fd_, "go\n", 3) != 3) {
    throw std::system_error(errno, std::generic_category(), "write " + path_);
  }
}

}  // namespace dlaunch::testing
