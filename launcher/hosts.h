#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "launcher/hostfile.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// --hosts text: a hostlist (hostlist.h) whose items may end in :SLOTS
// ("node[01-04]:8,gpu7" is four hosts with 8 slots and gpu7 with the
// job's). A host named twice is an error. Throws HostsError.
std::vector<Host> parse_host_list(std::string_view text);

// One entry of --include/--exclude: a host and, when given, GPU indices
// on it (empty: the whole host).
struct HostFilter {
  std::string name;
  std::vector<int> gpus;
  bool operator==(const HostFilter&) const = default;
};

// GPU indices as CUDA_VISIBLE_DEVICES and --include/--exclude write them:
// "0,2".
std::string gpu_list(const std::vector<int>& gpus);

// deepspeed's --include/--exclude syntax: entries separated by '@', each
// NAME or NAME:I,J,... (GPU indices); NAME may be a hostlist
// ("node[01-02]:0,2@gpu7"). Throws HostsError naming the bad part.
std::vector<HostFilter> parse_host_filter(std::string_view text);

// Applies --include (keep only the hosts named, and on a host with
// indices only those GPUs) or --exclude (drop the hosts named, or the
// GPUs named on them) to `hosts`, keeping their order. A host's GPUs are
// 0..slots-1, or 0..default_slots-1 when its slots are not given (0: not
// known, and no index may be named there). A host left with GPU indices
// gets them in Host::gpus and their count as slots. Throws HostsError when
// both filters are given, a filter names a host not in `hosts` or a GPU
// index it lacks or cannot be checked, or nothing is left.
std::vector<Host> select_hosts(std::vector<Host> hosts,
                               const std::vector<HostFilter>& include,
                               const std::vector<HostFilter>& exclude,
                               int default_slots);

}  // namespace dlaunch::launcher
