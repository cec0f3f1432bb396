#include "launcher/backends/backends.h"

#include <algorithm>
#include <utility>

#include "launcher/ship.h"

namespace dlaunch::launcher {
namespace {

using Factory = std::unique_ptr<AgentLauncher> (*)();

// Every backend --launcher knows, by name.
constexpr std::pair<std::string_view, Factory> kBackends[] = {
    {"ssh", backends::make_ssh},
    {"pdsh", backends::make_pdsh},
    {"slurm", backends::make_slurm},
    {"local", backends::make_local},
};

}  // namespace

std::unique_ptr<AgentLauncher> make_agent_launcher(std::string_view name) {
  for (const auto& [n, make] : kBackends) {
    if (n == name) return make();
  }
  return nullptr;
}

std::vector<std::string_view> agent_launcher_names() {
  std::vector<std::string_view> out;
  for (const auto& [n, make] : kBackends) out.push_back(n);
  return out;
}

const std::string& dlaunch_on(const LaunchPlan& plan, const std::string& host) {
  auto it = plan.shipped.find(host);
  return it == plan.shipped.end() ? plan.remote_dlaunch : it->second;
}

std::vector<std::string> dlaunch_argv(const LaunchPlan& plan,
                                      const std::string& host) {
  if (!plan.shipped.contains(host)) return {plan.remote_dlaunch};
  return cached_dlaunch_argv(plan.ship_cache);
}

std::vector<std::string> check_argv(const LaunchPlan& plan,
                                    const std::string& host) {
  std::vector<std::string> argv = dlaunch_argv(plan, host);
  argv.insert(argv.end(), {"--remote-check", plan.program});
  // Where the agent will run: a relative program is found from there, not
  // from the folder the remote shell starts in.
  auto job = std::find_if(plan.jobs.begin(), plan.jobs.end(),
                          [&](const RemoteJob& j) { return j.host == host; });
  if (job != plan.jobs.end() && !job->chdir.empty()) {
    argv.insert(argv.end(), {"--chdir", job->chdir});
  }
  if (plan.shipped.contains(host)) {
    argv.insert(argv.end(), {"--checksum", plan.ship_checksum});
  }
  return argv;
}

std::string shell_command(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    bool plain = !a.empty() && a.find_first_not_of(
                                   "abcdefghijklmnopqrstuvwxyz"
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   "0123456789_-./=:,+@%") == std::string::npos;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out += c;
      }
    }
    out += '\'';
  }
  return out;
}

}  // namespace dlaunch::launcher
