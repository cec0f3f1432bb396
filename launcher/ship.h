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

// The per-user cache of shipped copies on every host, as its shell
// expands it: ${XDG_CACHE_HOME:-$HOME/.cache}/dlaunch/VERSION-SUM/ holds
// dlaunch, dlaunch-cuda-devices and dlaunch-watchdog of one build (`name`,
// cache_name()).
// Copies stay there for the next job; a folder of it that is not the
// user's alone (another owner, group- or world-writable, a link) is
// refused before anything there runs.
std::string cache_name(const std::string& checksum);
std::string cached_path(const std::string& name);

// The argv that runs the cached dlaunch of `name` (arguments follow):
// `sh -c` checks the cache's folders, then execs it (exit 127 when it is
// not there).
std::vector<std::string> cached_dlaunch_argv(const std::string& name);

// What ship_commands() copies to `host` (a host of plan.shipped): each
// local file of the head's with its file name in the cache (dlaunch, and
// dlaunch-cuda-devices and dlaunch-watchdog beside it when the head has
// them; a dlaunch without its watchdog program forks itself instead).
std::vector<std::pair<std::filesystem::path, std::string>> shipped_files(
    const LaunchPlan& plan, const std::string& host);

// The remote shell command that stores its stdin as `file` in the cache
// folder `name`: made 0700 if missing (and refused as above), written to
// a temporary file (removed when the copy fails or is interrupted), mode
// 0700, renamed into place: two jobs racing never run a half copy.
std::string ship_script(const std::string& name, const std::string& file);

// The pre-flight checker: runs the backend's checks for plan.jobs.
using PreflightCheck =
    std::function<std::vector<PreflightFailure>(const LaunchPlan&)>;

// dlaunch ships itself: for the hosts in `failures` whose dlaunch is
// unusable, runs the copy in their cache (cached_path()) when its check
// (`check`, with the checksum) passes; else copies the head's
// (plan.ship_*; `self` is its path) there through the backend and checks
// it again. plan.shipped records these hosts. Returns the failures left, each
// naming its fix (a non-shippable build, a backend that cannot ship, a failed
// copy). `note` receives one line per host: shipped, or found in the cache.
std::vector<PreflightFailure> ship_where_missing(
    const AgentLauncher& backend, LaunchPlan& plan,
    std::vector<PreflightFailure> failures, const std::filesystem::path& self,
    const PreflightCheck& check,
    const std::function<void(const std::string&)>& note);

}  // namespace dlaunch::launcher
