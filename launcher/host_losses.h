#pragma once

// The hosts a multi-host job loses while it runs (their agents ended in
// failure), told to the agents' rendezvous through the head's store.

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "launcher/command_runner.h"

namespace dlaunch::launcher {

// Watches `remote`'s agent commands (every 200 ms, on a thread of its own)
// until stop(). Each time it counts more lost hosts it calls
// `tell(key, value)`, the key relative to the job's rendezvous prefix:
// - ("hosts_left", N) while at least `min_nodes` of the job's `hosts` are
//   left: a first round closes once N live nodes joined, without waiting
//   out its last call for hosts already gone;
// - ("aborted", WHY) once fewer are left, a second later (a Ctrl-C reaches
//   the hosts' ssh too: the head's own agent leaves on the signal first);
//   then it watches no more. `tell` returns whether the store took it.
class HostLosses {
 public:
  using Tell =
      std::function<bool(const std::string& key, const std::string& value)>;
  HostLosses(CommandRunner& remote, size_t hosts, int min_nodes, Tell tell);
  ~HostLosses();
  HostLosses(const HostLosses&) = delete;
  HostLosses& operator=(const HostLosses&) = delete;

  // Counts a host whose agent did not run under `remote` (the head's own,
  // in-process) as lost with `code`; it is told within 200 ms.
  void lose(const std::string& host, int code);
  void stop();

  // The hosts lost so far with their status, in the order they were seen.
  std::vector<std::pair<std::string, int>> lost() const;
  // Once the job was told it cannot go on: WHY as told, and the first
  // lost host's status. Waits while an abort is being told: its reader may
  // have seen the key.
  struct Abort {
    std::string text;
    int code = 0;
  };
  std::optional<Abort> abort() const;
  bool aborted() const { return abort().has_value(); }

 private:
  void run(const std::stop_token& stop);

  CommandRunner& remote_;
  const size_t hosts_;
  const int min_nodes_;
  const Tell tell_;
  // Held while the abort is told and its fields set.
  mutable std::mutex tell_mu_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, int>> gone_;
  std::optional<Abort> abort_;
  std::jthread thread_;  // last: started once the rest is set
};

}  // namespace dlaunch::launcher
