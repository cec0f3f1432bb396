#pragma once

#include <cstddef>
#include <string>

namespace dlaunch::comm::gloo {

// A POSIX shared-memory segment (/dev/shm) mapped into this process: ranks
// on one host exchange bulk data through these instead of loopback TCP.
// The creator unlinks the name once every peer has mapped it, so nothing is
// left behind after the mappings go. Owned by one group; not thread-safe.
class ShmSegment {
 public:
  // Creates and maps a new segment of `bytes` (the name must not exist).
  // Returns an empty segment (ok() false) and sets `error` on failure.
  static ShmSegment create(const std::string& name, size_t bytes,
                           std::string& error);
  // Maps an existing segment of at least `bytes`.
  static ShmSegment open(const std::string& name, size_t bytes,
                         std::string& error);

  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  bool ok() const { return data_ != nullptr; }
  char* data() const { return data_; }
  size_t size() const { return size_; }
  // Removes the name (the mapping stays); idempotent.
  void unlink();

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;  // set while this process still owns the name
};

}  // namespace dlaunch::comm::gloo
