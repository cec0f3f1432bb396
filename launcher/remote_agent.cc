#include "launcher/remote_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <variant>

#include "agent/posix_env.h"
#include "launcher/cli.h"
#include "launcher/error_file.h"
#include "launcher/launcher.h"
#include "launcher/multi_host.h"
#include "launcher/read_text.h"
#include "launcher/remote_job.h"
#include "launcher/ship.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;

void write_stderr(const std::string& s) { agent::write_all(STDERR_FILENO, s); }

// The value after `flag` in `args`, or "" when absent.
std::string option(const std::vector<std::string>& args,
                   const std::string& flag) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) return args[i + 1];
  }
  return "";
}

// This host's entry of a pdsh job file: by `host`, else by the machine's
// name (full or short).
RemoteJob pick_job(const std::vector<RemoteJob>& jobs, const std::string& host,
                   const std::string& file) {
  std::string me = host.empty() ? agent::host_name() : host;
  std::string shortname = me.substr(0, me.find('.'));
  // Over ssh, the address the head reached this host at (SSH_CONNECTION's
  // third field) names it too: one machine may answer for several.
  std::string reached;
  if (const char* c = std::getenv("SSH_CONNECTION"); c && host.empty()) {
    std::istringstream words(c);
    words >> reached >> reached >> reached;
  }
  for (const RemoteJob& j : jobs) {
    if (!reached.empty() && j.host == reached) return j;
  }
  for (const RemoteJob& j : jobs) {
    if (j.host == me || (host.empty() && j.host == shortname)) return j;
  }
  throw RemoteJobError(file + " has no job for host '" + me +
                       "' (this machine's name); list the host as it names "
                       "itself, or give --host");
}

// The first of `args` from which the agent's own arguments start.
RemoteJob load_job(const std::vector<std::string>& args, bool& from_stdin) {
  std::string file = option(args, "--job-file");
  from_stdin = file.empty();
  // The head writes the whole job at once; a minute covers a slow link.
  const std::chrono::seconds bound(60);
  if (from_stdin &&
      std::find(args.begin(), args.end(), "--slurm-task") != args.end()) {
    // srun gives every task the same stdin, every node's job one after
    // another: this node's is the one named by Slurm's name for it. The
    // others are left to watch_head_connection(), which reads to the end.
    const char* node = std::getenv("SLURMD_NODENAME");
    if (node == nullptr || *node == '\0') {
      throw RemoteJobError(
          "--slurm-task: SLURMD_NODENAME is not set; this runs as a task "
          "of `srun`, started by `dlaunch --launcher slurm`");
    }
    const auto deadline = std::chrono::steady_clock::now() + bound;
    std::string seen;
    std::string whole_job;  // written once for a run of jobs alike
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      RemoteJob job;
      try {
        job = read_remote_job(STDIN_FILENO,
                              std::max(left, std::chrono::milliseconds(1)));
      } catch (const RemoteJobError& e) {
        throw RemoteJobError(std::string(e.what()) + "; no job for node '" +
                             node + "' among those read (" + seen + ")");
      }
      if (job.whole_job.empty()) job.whole_job = whole_job;
      whole_job = job.whole_job;
      if (job.host == node) return job;
      seen += (seen.empty() ? "" : ", ") + job.host;
    }
  }
  if (from_stdin) return read_remote_job(STDIN_FILENO, bound);
  std::vector<RemoteJob> jobs = decode_remote_jobs(read_text<RemoteJobError>(
      file, "--job-file",
      "the head writes it (dlaunch --launcher pdsh): run the job from there"));
  // A file of this host's alone goes once read (the token in it should not
  // outlive the need); one shared by several hosts of one machine goes at
  // the head's teardown (--remote-stop).
  if (jobs.size() == 1) {
    std::error_code ec;
    fs::remove(file, ec);
  }
  return pick_job(jobs, option(args, "--host"), file);
}

// Watches stdin after the job: its end means the head (or the ssh
// connection to it) is gone, and the agent stops as if sent SIGTERM.
void watch_head_connection() {
  std::thread([] {
    char buf[256];
    while (true) {
      ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    write_stderr(
        "dlaunch: the connection to the head closed; stopping this host's "
        "workers\n");
    ::kill(::getpid(), SIGTERM);
  }).detach();
}

// Whether `program` can be run from the current folder: a path that is
// executable (or, for .py, readable with python3 in PATH), or a name
// found in PATH.
std::string program_problem(const std::string& program) {
  auto in_path = [](const std::string& name) {
    if (name.find('/') != std::string::npos) {
      return ::access(name.c_str(), X_OK) == 0;
    }
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "");
    for (std::string d; std::getline(dirs, d, ':');) {
      if (::access((fs::path(d.empty() ? "." : d) / name).c_str(), X_OK) == 0) {
        return true;
      }
    }
    return false;
  };
  if (program.ends_with(".py")) {
    if (::access(program.c_str(), R_OK) != 0) {
      return program + ": " + std::strerror(errno) + " (in " +
             fs::current_path().string() + ")";
    }
    const char* python = std::getenv("PYTHON");
    std::string py = python && *python ? python : "python3";
    if (!in_path(py)) return py + " is not in PATH (to run " + program + ")";
    return "";
  }
  if (!in_path(program)) {
    return program + (program.find('/') != std::string::npos
                          ? ": " + std::string(std::strerror(errno)) + " (in " +
                                fs::current_path().string() + ")"
                          : " is not in PATH");
  }
  return "";
}

// A /proc cmdline's arguments.
std::vector<std::string> split_nul(const std::string& text) {
  std::vector<std::string> args;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\0', pos);
    if (end == std::string::npos) end = text.size();
    args.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return args;
}

// Whether `argv` is an agent of job `tag` (processes_with_tag()): its
// first argument --remote-agent (the shim's: the fifth), --job-tag TAG
// after it.
bool is_agent_of(const std::vector<std::string>& argv, const std::string& tag) {
  size_t first = 1;
  if (argv.size() > 4 && argv[1] == "-c") first = 4;  // sh -c SCRIPT $0 ...
  if (argv.size() <= first || argv[first] != "--remote-agent") return false;
  for (size_t i = first + 1; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--job-tag" && argv[i + 1] == tag) return true;
  }
  return false;
}

}  // namespace

int remote_agent_main(const std::vector<std::string>& args) {
  RemoteJob job;
  bool from_stdin = false;
  try {
    job = load_job(args, from_stdin);
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: --remote-agent: ") + e.what() + "\n");
    return 1;
  }
  // The job's faults are in its arguments (--fault); the ones this process
  // inherited (the head's own, with local, pdsh's exec module or srun)
  // would be given twice.
  ::unsetenv("DLAUNCH_FAULTS");
  ::unsetenv("PET_FAULTS");
  try {
    settle_host(job.env, job.chdir, job.host);
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
    return 1;
  }
  // The head's own error file (TORCH* travels, and settle_host set it) is
  // the head's to write: this agent writes its own to a file in memory (no
  // file left if killed), which launch() hands to the head's store with
  // its status (the head sets kErrorKeyEnv).
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  if (const char* key = std::getenv(kErrorKeyEnv); key && *key) {
    const int fd = ::memfd_create("dlaunch-error-file", MFD_CLOEXEC);
    if (fd >= 0) {
      const std::string path = "/proc/self/fd/" + std::to_string(fd);
      ::setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
    }
  }
  ParseResult parsed =
      parse_command_line(job.args, agent::current_environment(), write_stderr);
  if (auto* e = std::get_if<UsageError>(&parsed)) {
    write_stderr(e->message + "\n");
    return e->exit_code;
  }
  if (!std::holds_alternative<LaunchOptions>(parsed)) {
    write_stderr("dlaunch: --remote-agent: the job is not a run\n");
    return 2;
  }
  LaunchOptions options = std::get<LaunchOptions>(std::move(parsed));
  options.agent.hostname = job.host;
  options.whole_job = job.whole_job;
  if (from_stdin) watch_head_connection();
  int code = 1;
  agent::RunResult result;
  try {
    code = launch(options, &result);
  } catch (const std::exception& e) {
    write_stderr(std::string("dlaunch: ") + e.what() + "\n");
  }
  // A job file shared by several hosts (pdsh over a network) goes once a
  // round formed: every node of it had read the file. This covers a
  // success (the head then skips its clean-up round) and a head that died
  // (the store gone) and can clean up nothing.
  if (!from_stdin && !result.attempts.empty()) {
    if (std::string file = option(args, "--job-file"); !file.empty()) {
      std::error_code ec;
      fs::remove(file, ec);
    }
  }
  return code;
}

int remote_check_main(const std::vector<std::string>& args) {
  std::string program = args.size() > 1 ? args[1] : "";
  std::string line_kind = " program-missing: ";
  std::string dir = option(args, "--chdir");
  std::string problem;
  if (!dir.empty() && ::chdir(dir.c_str()) != 0) {
    line_kind = " chdir-missing: ";
    problem = "--chdir: cannot enter " + dir + ": " + std::strerror(errno) +
              "; give a folder that exists on every host (default: the "
              "head's current folder)";
  } else if (!program.empty()) {
    problem = program_problem(program);
  }
  // A shipped copy checks that it arrived whole.
  if (std::string want = option(args, "--checksum");
      problem.empty() && !want.empty()) {
    std::string have;
    try {
      have = file_checksum("/proc/self/exe");
    } catch (const std::exception& e) {
      have = e.what();
    }
    if (have != want) {
      line_kind = " damaged: ";
      problem = "the shipped dlaunch's checksum is " + have + ", not " + want +
                " (a broken copy: the head replaces it; if this persists, run "
                "the job again)";
    }
  }
  std::string line = "dlaunch-check " DLAUNCH_VERSION;
  line += problem.empty() ? " ok\n" : line_kind + problem + "\n";
  agent::write_all(STDOUT_FILENO, line);
  return 0;
}

std::vector<int> processes_with_tag(const std::string& tag) {
  std::vector<int> out;
  const std::string want = "DLAUNCH_JOB_TAG=" + tag;
  const uid_t me = ::getuid();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    int pid = std::stoi(name);
    if (pid == ::getpid()) continue;
    struct ::stat st;
    if (::stat(entry.path().c_str(), &st) != 0 || st.st_uid != me) continue;
    // Workers carry the tag in their environment; an agent, which set it
    // after it started, carries it in its command line (--job-tag).
    std::ifstream cmd(entry.path() / "cmdline", std::ios::binary);
    std::string args((std::istreambuf_iterator<char>(cmd)),
                     std::istreambuf_iterator<char>());
    if (is_agent_of(split_nul(args), tag)) {
      out.push_back(pid);
      continue;
    }
    if (agent::environ_has(pid, want)) out.push_back(pid);
  }
  return out;
}

int remote_stop_main(const std::vector<std::string>& args) {
  std::string tag = args.size() > 1 ? args[1] : "";
  if (tag.size() < 8) {
    write_stderr("dlaunch: --remote-stop needs the job's tag\n");
    return 2;
  }
  if (std::string file = option(args, "--job-file"); !file.empty()) {
    std::error_code ec;
    fs::remove(file, ec);
  }
  std::vector<int> pids = processes_with_tag(tag);
  // Wait on pidfds, not a sleep loop: each becomes readable at its exit.
  std::vector<pollfd> fds;
  for (int pid : pids) {
    int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    ::kill(pid, SIGTERM);
    if (fd >= 0) fds.push_back({fd, POLLIN, 0});
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t left = fds.size();
  while (left > 0) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
    if (ms <= 0) break;
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(ms));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (pollfd& p : fds) {
      if (p.fd >= 0 && p.revents != 0) {
        ::close(p.fd);
        p.fd = -1;  // poll ignores negative fds
        --left;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  size_t killed = 0;
  for (int pid : processes_with_tag(tag)) {
    ::kill(pid, SIGKILL);
    ++killed;
  }
  agent::write_all(
      STDOUT_FILENO,
      "dlaunch-stop " + std::to_string(pids.size()) + " process(es) stopped" +
          (killed ? ", " + std::to_string(killed) + " killed" : std::string()) +
          "\n");
  return 0;
}

}  // namespace dlaunch::launcher
