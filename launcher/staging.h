#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>

namespace dlaunch::launcher {

// The head's private (0700) folder for files its backends hand to its
// hosts (pdsh's job file): TMP/TAG.d, with a `head` record of this
// process's pid and start time. The destructor removes it; a SIGKILLed
// head cannot, so the next head of the same user does
// (remove_stale_staging()). Owned by the head's main thread; not copyable.
class StagingDir {
 public:
  // Removes the stale folders in `tmp`, then makes `tmp`/`tag`.d. Never
  // throws: a folder that cannot be made fails the backend that writes
  // into it, which names the path.
  StagingDir(const std::filesystem::path& tmp, const std::string& tag);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Removes the heads' staging folders in `tmp` (dlaunch-job-HEX.d: real
// folders, this user's) whose head is gone: no process runs under the
// recorded pid, or one that started at another time (the pid was
// reused). A folder without a readable record (one being made, or one of
// a dlaunch before the record) goes only when it was last changed over an
// hour ago and no process of this user names its tag in its command line
// or environment (an older head's ssh, pdsh or srun, its workers); else
// it stays. Returns how many it removed.
size_t remove_stale_staging(const std::filesystem::path& tmp);

// When process `pid` started (clock ticks after boot, /proc/PID/stat's
// 22nd field); nullopt when it does not run.
std::optional<unsigned long long> process_start_time(pid_t pid);

}  // namespace dlaunch::launcher
