#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "launcher/agent_launcher.h"

namespace dlaunch::launcher {

// One host's pre-flight failure, as the table shows it.
struct PreflightFailure {
  std::string host;
  std::string why;
  // dlaunch itself is missing or another version there: shipping the
  // head's own copy can fix it.
  bool dlaunch_unusable = false;
};

// Why `exe` cannot run on another host as it is: "" for a static binary
// (no ELF interpreter); else the reason and the fix (a sanitizer build,
// or one with DLAUNCH_STATIC_RUNTIME=OFF, loads shared libraries that
// other hosts may lack).
std::string why_not_shippable(const std::filesystem::path& exe);

// A checksum of the file's bytes (64-bit FNV-1a, hex): a shipped copy
// compares its own with the head's. Throws std::runtime_error when the
// file cannot be read.
std::string file_checksum(const std::filesystem::path& file);

// Where the head ships dlaunch on `host` for the job tagged `tag`: a
// private, job-unique file in /tmp (dlaunch-cuda-devices goes beside it,
// at this path + "-cuda-devices"); remote_stop removes both.
std::string shipped_path(const std::string& tag, const std::string& host);

// What ship_commands() copies to `host` (a host of plan.shipped): each
// local file of the head's with its path there (dlaunch, and
// dlaunch-cuda-devices beside it when the head has one).
std::vector<std::pair<std::filesystem::path, std::string>> shipped_files(
    const LaunchPlan& plan, const std::string& host);

// The remote shell command that stores its stdin at `path`: new file
// only (noclobber: never into another's file), mode 0700.
std::string ship_script(const std::string& path);

// Removes this user's shipped copies of the job tagged `tag` in /tmp (all
// hosts of one machine); returns how many.
int remove_shipped(const std::string& tag);

// When this program is a shipped copy of the job tagged `tag`
// (shipped_path()), removes it and its dlaunch-cuda-devices: an agent's
// copy goes when the agent ends.
void remove_own_shipped_copy(const std::string& tag);

// The pre-flight checker: runs the backend's checks for plan.jobs.
using PreflightCheck =
    std::function<std::vector<PreflightFailure>(const LaunchPlan&)>;

// dlaunch ships itself: for the hosts in `failures` whose dlaunch is
// unusable, copies the head's (plan.ship_*; `self` is its path) through
// the backend into shipped_path(), records them in plan.shipped (and
// DLAUNCH_CUDA_DEVICES in their jobs), and checks them again with
// `check`. Returns the failures left, each naming its fix (a
// non-shippable build, a backend that cannot ship, a failed copy).
// `note` receives one line per shipped host.
std::vector<PreflightFailure> ship_where_missing(
    const AgentLauncher& backend, LaunchPlan& plan,
    std::vector<PreflightFailure> failures, const std::filesystem::path& self,
    const PreflightCheck& check,
    const std::function<void(const std::string&)>& note);

}  // namespace dlaunch::launcher
