#include "launcher/host_losses.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>

namespace dlaunch::launcher {

using std::chrono::milliseconds;

HostLosses::HostLosses(CommandRunner& remote, size_t hosts, int min_nodes,
                       Tell tell)
    : remote_(remote),
      hosts_(hosts),
      min_nodes_(min_nodes),
      tell_(std::move(tell)),
      thread_([this](const std::stop_token& stop) { run(stop); }) {}

HostLosses::~HostLosses() { stop(); }

void HostLosses::stop() {
  thread_.request_stop();
  if (thread_.joinable()) thread_.join();
}

void HostLosses::lose(const std::string& host, int code) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::ranges::find(gone_, host, &std::pair<std::string, int>::first) ==
      gone_.end()) {
    gone_.emplace_back(host, code);
  }
}

std::vector<std::pair<std::string, int>> HostLosses::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

std::optional<HostLosses::Abort> HostLosses::abort() const {
  std::lock_guard<std::mutex> told(tell_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

void HostLosses::run(const std::stop_token& stop) {
  size_t told = 0;
  while (!stop.stop_requested()) {
    // Once every command ended, one last count (hosts that all failed at
    // once leave nothing more to wait for).
    const bool ended = remote_.wait(milliseconds(200));
    const std::vector<CommandResult> rs = remote_.results();
    for (size_t i = 0; i < rs.size(); ++i) {
      for (const auto& [h, c] : lost_hosts(remote_.commands()[i], rs[i])) {
        lose(h, c);
      }
    }
    const std::vector<std::pair<std::string, int>> gone = lost();
    if (gone.size() != told) {
      told = gone.size();
      const size_t left = hosts_ - std::min(hosts_, told);
      if (static_cast<int>(left) >= min_nodes_) {
        tell_("hosts_left", std::to_string(left));
      } else {
        std::mutex m;
        std::unique_lock<std::mutex> lock(m);
        std::condition_variable_any().wait_for(
            lock, stop, std::chrono::seconds(1), [] { return false; });
        if (stop.stop_requested()) return;
        std::string who;
        for (const auto& [h, c] : gone) who += (who.empty() ? "" : ", ") + h;
        const int code = gone.front().second;
        const std::string why =
            (gone.size() == 1
                 ? "the agent on " + who + " ended with exit " +
                       std::to_string(code) + " (its lines above say why)"
                 : "the agents on " + who + " ended, the first with exit " +
                       std::to_string(code) + " (their lines above say why)") +
            ", leaving " + std::to_string(left) + " of " +
            std::to_string(hosts_) + " hosts where the job needs " +
            std::to_string(min_nodes_);
        std::lock_guard<std::mutex> told_lock(tell_mu_);
        if (tell_("aborted", why)) {
          std::lock_guard<std::mutex> l(mu_);
          abort_ = Abort{why, code};
        }
        return;
      }
    }
    if (ended) return;
  }
}

}  // namespace dlaunch::launcher
