#include "launcher/command_runner.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/readable_pipe.hpp>
#include <boost/asio/writable_pipe.hpp>
#include <boost/asio/write.hpp>
#include <boost/process/v2/environment.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <functional>
#include <optional>

#include "agent/line_buffer.h"
#include "agent/posix_env.h"
#include "agent/worker_env.h"

namespace dlaunch::launcher {
namespace {

namespace asio = boost::asio;
namespace bp = boost::process::v2;

// Boost.Process initializer: the command dies with the runner's thread
// (a killed head leaves no ssh behind, and the remote agents then see
// their stdin end).
struct DieWithParent {
  pid_t parent = ::getpid();
  bool own_group = false;  // AgentCommand::own_process_group
  template <typename Launcher, typename Path>
  boost::system::error_code on_exec_setup(Launcher&, const Path&,
                                          const char* const*) {
    if (own_group) ::setpgid(0, 0);
    // The head's store raised its limit; agents (and their workers) get
    // the user's.
    ::setrlimit(RLIMIT_NOFILE, &agent::user_fd_limit());
    agent::die_with_parent(parent);
    return {};
  }
};

// pdsh's "pdsh@HEAD: HOST: CMD exited with exit code N" (or "killed by
// signal N": 128+N): sets `host` (one of `cmd`'s as given, else the name
// pdsh wrote) and `code`.
bool pdsh_host_end(const AgentCommand& cmd, std::string_view line,
                   std::string& host, int& code) {
  static constexpr std::string_view kExited = " exited with exit code ";
  static constexpr std::string_view kKilled = " killed by signal ";
  const size_t colon = line.find(": ");
  if (!line.starts_with("pdsh@") || colon == std::string_view::npos) {
    return false;
  }
  size_t at = line.rfind(kExited);
  const bool killed = at == std::string_view::npos;
  if (killed) at = line.rfind(kKilled);
  if (at == std::string_view::npos || at < colon) return false;
  std::string_view digits =
      line.substr(at + (killed ? kKilled : kExited).size());
  auto [end, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), code);
  if (ec != std::errc() || end != digits.data() + digits.size()) return false;
  if (killed) code += 128;
  std::string_view rest = line.substr(colon + 2);
  if (pdsh_host_prefix(cmd.hosts, rest, host) == 0) {
    const size_t name_end = rest.find(": ");
    if (name_end == std::string_view::npos) return false;
    host = rest.substr(0, name_end);
  }
  return true;
}

}  // namespace

struct CommandRunner::Impl {
  // One running command and its pipes.
  struct Child {
    const AgentCommand* cmd = nullptr;
    std::unique_ptr<bp::process> proc;
    std::unique_ptr<asio::writable_pipe> in;
    std::unique_ptr<asio::readable_pipe> out, err;
    // Live redraws only where one host's lines come as they are (pdsh and
    // srun label whole lines: a redraw would lose its host).
    std::optional<agent::LineBuffer> out_lines, err_lines;
    std::array<char, 65536> out_buf{}, err_buf{};
    int open_streams = 0;
    bool reaped = false;
    CommandResult result;
    std::string exe;  // empty: argv[0] is not in PATH
  };

  asio::io_context io;
  CommandOutput output;
  // The head's environment, every command's, taken by the constructor
  // (see there).
  std::vector<std::string> env_list;
  std::vector<std::unique_ptr<Child>> children;
  mutable std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;           // commands that ended (or never started)
  int failed = -1;           // the first command to exit non-zero
  bool interrupted = false;  // interrupt() was called
  std::thread thread;

  // `text` (whole lines and redraws, from `lines`) of `c` to the head's fd,
  // each with its host.
  void show(Child& c, int fd, const agent::LineBuffer& lines,
            const std::string& text) {
    if (text.empty()) return;
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t end = lines.unit_end(text, pos);
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      if (c.cmd->task_labelled_lines) {
        // srun's "N: line" (or "  N: line") becomes "HOST line".
        int task = -1;
        std::string_view rest = task_label(line, task);
        if (task >= 0 && static_cast<size_t>(task) < c.cmd->hosts.size()) {
          out += c.cmd->hosts[static_cast<size_t>(task)] + " ";
        }
        out += rest;
      } else if (c.cmd->host_prefixed_lines) {
        // pdsh's "HOST: line" becomes "HOST line".
        std::string host;
        if (const size_t n = pdsh_host_prefix(c.cmd->hosts, line, host);
            n > 0) {
          out += host + " ";
          out += line.substr(n);
        } else {
          out += line;
          // pdsh reports each host's end on stderr: a failed one fails the
          // job before pdsh itself ends.
          int code = 0;
          if (fd == STDERR_FILENO && pdsh_host_end(*c.cmd, line, host, code) &&
              code != 0) {
            std::lock_guard lock(mu);
            c.result.failed_hosts.emplace_back(std::move(host), code);
            if (failed < 0) failed = index(c);
            cv.notify_all();
          }
        }
      } else {
        out += c.cmd->hosts.empty() ? "" : c.cmd->hosts[0] + " ";
        out += line;
      }
      out += text[end];
    }
    agent::write_all(fd, out);
  }

  void read(Child& c, asio::readable_pipe& pipe, std::array<char, 65536>& buf,
            agent::LineBuffer& lines, std::string& captured, int fd) {
    pipe.async_read_some(asio::buffer(buf),
                         [this, &c, &pipe, &buf, &lines, &captured, fd](
                             const boost::system::error_code& ec, size_t n) {
                           std::string whole;
                           if (output == CommandOutput::kCapture) {
                             captured.append(buf.data(), n);
                           } else {
                             lines.feed(std::string_view(buf.data(), n), whole);
                           }
                           if (ec) {
                             if (output == CommandOutput::kShow)
                               lines.flush(whole);
                             show(c, fd, lines, whole);
                             if (--c.open_streams == 0) reap(c);
                             return;
                           }
                           show(c, fd, lines, whole);
                           read(c, pipe, buf, lines, captured, fd);
                         });
  }

  // After both streams end: the exit.
  void reap(Child& c) {
    c.proc->async_wait(
        [this, &c](const boost::system::error_code& ec, int code) {
          std::lock_guard lock(mu);
          c.reaped = true;
          c.result.exited = !ec;
          c.result.exit_code = ec ? -1 : code;
          // Boost gives a signal's number as the code: a shell's 128+N.
          if (!ec && WIFSIGNALED(c.proc->native_exit_code())) {
            c.result.exit_code = 128 + WTERMSIG(c.proc->native_exit_code());
          }
          if (!ec && code != 0 && failed < 0) {
            failed = index(c);
          }
          ++done;
          cv.notify_all();
        });
  }

  int index(const Child& c) const {
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].get() == &c) return static_cast<int>(i);
    }
    return -1;
  }

  void start(Child& c) {
    const AgentCommand& cmd = *c.cmd;
    for (const auto& [path, text] : cmd.local_files) {
      int fd =
          ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0 || !agent::write_all(fd, text)) {
        c.result.out =
            "cannot write " + path.string() + ": " + std::strerror(errno);
        if (fd >= 0) ::close(fd);
        ++done;
        return;
      }
      ::close(fd);
    }
    const std::string& exe = c.exe;
    if (exe.empty()) {
      c.result.out = "'" + cmd.argv[0] + "' is not in PATH";
      ++done;
      return;
    }
    if (cmd.argv[0].find('/') != std::string::npos &&
        ::access(exe.c_str(), X_OK) != 0) {
      c.result.out = "cannot start " + exe + ": " + std::strerror(errno);
      ++done;
      return;
    }
    // A file's bytes go to stdin as the file itself: the child reads it
    // from disk, so a copy of tens of MB is never held in the head's
    // memory (once per host, at that).
    int file_fd = -1;
    if (!cmd.stdin_file.empty()) {
      file_fd = ::open(cmd.stdin_file.c_str(), O_RDONLY | O_CLOEXEC);
      if (file_fd < 0) {
        c.result.out = "cannot read " + cmd.stdin_file.string() + ": " +
                       std::strerror(errno);
        ++done;
        return;
      }
    }
    struct CloseFile {
      int fd;
      ~CloseFile() {
        if (fd >= 0) ::close(fd);
      }
    } close_file{file_fd};
    c.out = std::make_unique<asio::readable_pipe>(io);
    c.err = std::make_unique<asio::readable_pipe>(io);
    if (!cmd.stdin_data.empty())
      c.in = std::make_unique<asio::writable_pipe>(io);
    try {
      std::vector<std::string> args(cmd.argv.begin() + 1, cmd.argv.end());
      auto spawn = [&](auto&& in) {
        c.proc = std::make_unique<bp::process>(
            io, exe, args, bp::process_stdio{in, *c.out, *c.err},
            bp::process_environment(env_list),
            DieWithParent{.own_group = cmd.own_process_group});
      };
      if (c.in) {
        spawn(*c.in);
      } else if (file_fd >= 0) {
        spawn(file_fd);
      } else {
        spawn(nullptr);
      }
    } catch (const std::exception& e) {
      c.result.out = "cannot start " + exe + ": " + e.what();
      ++done;
      return;
    }
    c.result.started = true;
    c.open_streams = 2;
    const bool live =
        !c.cmd->task_labelled_lines && !c.cmd->host_prefixed_lines;
    c.out_lines.emplace("", live);
    c.err_lines.emplace("", live);
    read(c, *c.out, c.out_buf, *c.out_lines, c.result.out, STDOUT_FILENO);
    read(c, *c.err, c.err_buf, *c.err_lines, c.result.err, STDERR_FILENO);
    if (c.in) {
      asio::async_write(*c.in, asio::buffer(cmd.stdin_data),
                        [](const boost::system::error_code&, size_t) {});
    }
  }
};

std::string_view task_label(std::string_view line, int& task) {
  task = -1;
  size_t start = line.find_first_not_of(' ');
  size_t colon = line.find(": ");
  if (start == std::string_view::npos || colon == std::string_view::npos ||
      colon <= start || colon - start > 9) {
    return line;
  }
  int n = 0;
  auto [p, ec] = std::from_chars(line.data() + start, line.data() + colon, n);
  if (ec != std::errc() || p != line.data() + colon) return line;
  task = n;
  return line.substr(colon + 2);
}

CommandRunner::CommandRunner(std::vector<AgentCommand> commands,
                             CommandOutput output)
    : commands_(std::move(commands)), impl_(std::make_unique<Impl>()) {
  impl_->output = output;
  // ssh (a ControlPersist master), pdsh and srun may leave children that
  // this process, the agent's, adopts: not the workers' strays.
  agent::commands_may_orphan();
  // The environment is read here, on the caller's thread, never on the
  // runner's: the head's own agent setenv()s while the runner may still be
  // starting the others, and glibc's setenv frees the array a reader on
  // another thread walks (the head died of SIGSEGV in strlen that way).
  // Built once, not once per host (ssh runs a command per host).
  for (const auto& [k, v] : agent::current_environment()) {
    impl_->env_list.push_back(k + "=" + v);
  }
  for (const AgentCommand& c : commands_) {
    auto child = std::make_unique<Impl::Child>();
    child->cmd = &c;
    child->exe = c.argv[0];
    if (child->exe.find('/') == std::string::npos) {
      child->exe = bp::environment::find_executable(child->exe).string();
    }
    impl_->children.push_back(std::move(child));
  }
  // The children are forked by the runner's thread: they die with it.
  impl_->thread = std::thread([this] {
    {
      std::lock_guard lock(impl_->mu);
      for (auto& c : impl_->children) impl_->start(*c);
      impl_->cv.notify_all();
    }
    auto guard = asio::make_work_guard(impl_->io);
    impl_->io.run();
  });
}

CommandRunner::~CommandRunner() {
  signal_all(SIGKILL);
  wait(std::chrono::seconds(10));
  impl_->io.stop();
  impl_->thread.join();
}

bool CommandRunner::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  return impl_->cv.wait_for(
      lock, timeout, [&] { return impl_->done == impl_->children.size(); });
}

int CommandRunner::wait_failure_or_end(std::chrono::milliseconds timeout) {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait_for(lock, timeout, [&] {
    return impl_->failed >= 0 || impl_->interrupted ||
           impl_->done == impl_->children.size();
  });
  return impl_->failed;
}

void CommandRunner::interrupt() {
  std::lock_guard lock(impl_->mu);
  impl_->interrupted = true;
  impl_->cv.notify_all();
}

void CommandRunner::close_stdins() {
  asio::post(impl_->io, [this] {
    for (auto& c : impl_->children) {
      if (c->in) {
        boost::system::error_code ignored;
        c->in->close(ignored);
      }
    }
  });
}

void CommandRunner::signal_all(int sig) {
  std::lock_guard lock(impl_->mu);
  for (auto& c : impl_->children) {
    if (c->proc && !c->reaped) ::kill(c->proc->id(), sig);
  }
}

std::vector<CommandResult> CommandRunner::results() const {
  std::lock_guard lock(impl_->mu);
  std::vector<CommandResult> out;
  for (const auto& c : impl_->children) out.push_back(c->result);
  return out;
}

std::vector<std::pair<std::string, int>> lost_hosts(
    const AgentCommand& command, const CommandResult& result) {
  if (!result.failed_hosts.empty()) return result.failed_hosts;
  std::vector<std::pair<std::string, int>> out;
  // (Not started and saying why: it could not be spawned.)
  if ((result.exited && result.exit_code != 0) ||
      (!result.started && !result.out.empty())) {
    for (const std::string& h : command.hosts) {
      out.emplace_back(h, result.started ? result.exit_code : 1);
    }
  }
  return out;
}

std::string pdsh_short_name(const std::string& host) {
  const size_t dot = host.find('.');
  if (dot == std::string::npos || host.empty() ||
      std::isdigit(static_cast<unsigned char>(host[0]))) {
    return host;
  }
  return host.substr(0, dot);
}

size_t pdsh_host_prefix(const std::vector<std::string>& hosts,
                        std::string_view line, std::string& host) {
  for (bool shortened : {false, true}) {
    for (const std::string& h : hosts) {
      const std::string name = shortened ? pdsh_short_name(h) : h;
      if (shortened && name == h) continue;
      if (line.starts_with(name) &&
          line.substr(name.size()).starts_with(": ")) {
        host = h;
        return name.size() + 2;
      }
    }
  }
  return 0;
}

}  // namespace dlaunch::launcher
