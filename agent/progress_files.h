#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dlaunch::agent {

// How far one worker has got, as its agent reads it.
struct ProgressSample {
  // Operations entered and left (comm) plus heartbeat-file touches seen:
  // grows while the worker makes progress; 0 before it shows any.
  uint64_t count = 0;
  // "all_reduce" while inside an operation; "between operations (last:
  // barrier)" outside; "heartbeat" for programs that only touch the file;
  // "no operation yet" before any.
  std::string operation;
};

// A DLAUNCH_COMM_FAULTS fault that fired inside a worker, as comm recorded
// it: its spec as written, what it did ("raising SIGKILL") and when.
struct CommFaultNote {
  std::string spec;
  std::string action;
  std::chrono::system_clock::time_point fired;
};

// The per-worker files of hang detection and comm's fault notes, in the
// run folder: comm's shared progress record (DLAUNCH_PROGRESS_FILE, mapped
// here) and the heartbeat file programs without comm touch
// (DLAUNCH_HEARTBEAT_FILE, its mtime read). One pair per local rank, zeroed
// and reused by every group start, so restarts add no files. Owned by the
// agent; one thread.
class ProgressFiles {
 public:
  // Throws std::system_error when a file cannot be made or mapped.
  ProgressFiles(const std::filesystem::path& dir, int nproc);
  ~ProgressFiles();
  ProgressFiles(const ProgressFiles&) = delete;
  ProgressFiles& operator=(const ProgressFiles&) = delete;

  // Zeroes local rank `i`'s record and forgets its heartbeat; returns the
  // "NAME=VALUE" entries for its environment.
  std::vector<std::string> reset(int i);
  ProgressSample sample(int i);
  // The last comm fault that fired in local rank `i` since its reset;
  // nullopt when none did.
  std::optional<CommFaultNote> fired_fault(int i) const;

 private:
  struct Slot {
    std::filesystem::path record_path;
    std::filesystem::path heartbeat_path;
    void* map = nullptr;
    int64_t last_mtime_ns = 0;
    uint64_t beats = 0;
  };
  std::vector<Slot> slots_;
};

}  // namespace dlaunch::agent
