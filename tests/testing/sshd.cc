#include "tests/testing/sshd.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "comm/store/resolve.h"

namespace dlaunch::testing {
namespace {

using namespace std::chrono_literals;

CommandOptions argv(std::vector<std::string> words) {
  CommandOptions o;
  o.argv = std::move(words);
  return o;
}

}  // namespace

TestSshd::TestSshd(const std::vector<std::string>& addresses) {
  const std::string sshd = "/usr/sbin/sshd";
  if (::access(sshd.c_str(), X_OK) != 0 ||
      run_command(argv({"sh", "-c", "command -v ssh-keygen ssh"})).exit_code !=
          0) {
    why_not_ =
        "sshd or ssh is not installed (scripts/setup installs "
        "openssh-server)";
    return;
  }
  for (const char* key : {"host_key", "user_key"}) {
    CommandResult k =
        run_command(argv({"ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                          (dir_ / key).string()}));
    if (k.exit_code != 0) {
      why_not_ = "ssh-keygen failed: " + k.err;
      return;
    }
  }
  write_file(dir_ / "authorized_keys", read_file(dir_ / "user_key.pub"), 0600);
  std::string error;
  port_ = comm::store::free_port(addresses.at(0),
                                 std::chrono::steady_clock::now() + 5s, error);
  if (port_ <= 0) {
    why_not_ = "no free port: " + error;
    return;
  }
  std::string config = "Port " + std::to_string(port_) + "\n";
  for (const std::string& a : addresses) config += "ListenAddress " + a + "\n";
  config += "HostKey " + (dir_ / "host_key").string() +
            "\nAuthorizedKeysFile " + (dir_ / "authorized_keys").string() +
            "\nPidFile " + (dir_ / "sshd.pid").string() +
            "\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin yes\n"
            "MaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n"
            // A test's own cache of shipped dlaunch copies (ssh -o SetEnv).
            "AcceptEnv XDG_CACHE_HOME\n";
  write_file(dir_ / "sshd_config", config, 0600);
  ::mkdir("/run/sshd", 0755);  // privilege separation's folder
  sshd_ = std::make_unique<Subprocess>(
      argv({sshd, "-D", "-e", "-f", (dir_ / "sshd_config").string()}));
  // Ready once it answers on every address.
  for (const std::string& a : addresses) {
    bool up = false;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!up && std::chrono::steady_clock::now() < deadline) {
      CommandResult probe =
          run_command(argv({"bash", "-c",
                            "exec 3<>/dev/tcp/" + a + "/" +
                                std::to_string(port_) + " && head -c 4 <&3"}),
                      5s);
      up = probe.out == "SSH-";
      if (!up && !process_alive(sshd_->pid())) break;
      if (!up) std::this_thread::sleep_for(50ms);  // polling observed state
    }
    if (!up) {
      why_not_ = "sshd did not answer on " + a + ": " + sshd_->err();
      sshd_.reset();
      return;
    }
  }
}

TestSshd::~TestSshd() {
  if (sshd_) {
    sshd_->signal(SIGTERM);
    sshd_->wait(10s);
  }
}

std::string TestSshd::ssh_args() const {
  return "-i " + (dir_ / "user_key").string() +
         " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
         "-o LogLevel=ERROR";
}

}  // namespace dlaunch::testing
