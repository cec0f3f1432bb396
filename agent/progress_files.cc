#include "agent/progress_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "comm/progress.h"

namespace dlaunch::agent {

using comm::ProgressRecord;

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

ProgressRecord& record(void* map) { return *static_cast<ProgressRecord*>(map); }

}  // namespace

ProgressFiles::ProgressFiles(const std::filesystem::path& dir, int nproc)
    : slots_(static_cast<size_t>(nproc)) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.record_path = dir / ("progress_" + std::to_string(i));
    s.heartbeat_path = dir / ("heartbeat_" + std::to_string(i));
    int fd = ::open(s.record_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("cannot create " + s.record_path.string());
    if (::ftruncate(fd, comm::kProgressFileSize) != 0) {
      ::close(fd);
      fail("cannot size " + s.record_path.string());
    }
    void* m = ::mmap(nullptr, comm::kProgressFileSize, PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) fail("cannot map " + s.record_path.string());
    s.map = m;
  }
}

ProgressFiles::~ProgressFiles() {
  for (Slot& s : slots_) {
    if (s.map != nullptr) ::munmap(s.map, comm::kProgressFileSize);
  }
}

std::vector<std::string> ProgressFiles::reset(int i) {
  Slot& s = slots_[static_cast<size_t>(i)];
  ProgressRecord& r = record(s.map);
  r.entered.store(0);
  r.left.store(0);
  r.op.store(0);
  r.fault_time_ns.store(0);
  s.beats = 0;
  // The heartbeat counts from its first touch by this worker: an mtime
  // that changes from "absent" or from the previous worker's is a beat.
  std::error_code ec;
  std::filesystem::remove(s.heartbeat_path, ec);
  s.last_mtime_ns = 0;
  return {"DLAUNCH_PROGRESS_FILE=" + s.record_path.string(),
          "DLAUNCH_HEARTBEAT_FILE=" + s.heartbeat_path.string()};
}

std::optional<CommFaultNote> ProgressFiles::fired_fault(int i) const {
  const ProgressRecord& r = record(slots_[static_cast<size_t>(i)].map);
  const int64_t ns = r.fault_time_ns.load(std::memory_order_acquire);
  if (ns == 0) return std::nullopt;
  // The worker wrote the texts NUL-terminated; strnlen bounds a torn one.
  auto text = [](const char* p) {
    return std::string(p, ::strnlen(p, comm::kProgressFaultBytes));
  };
  return CommFaultNote{
      text(r.fault_spec), text(r.fault_action),
      std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(ns)))};
}

ProgressSample ProgressFiles::sample(int i) {
  Slot& s = slots_[static_cast<size_t>(i)];
  struct stat st {};
  if (::stat(s.heartbeat_path.c_str(), &st) == 0) {
    int64_t ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    if (ns != s.last_mtime_ns) {
      s.last_mtime_ns = ns;
      ++s.beats;
    }
  }
  const ProgressRecord& r = record(s.map);
  const uint64_t entered = r.entered.load(std::memory_order_relaxed);
  const uint64_t left = r.left.load(std::memory_order_relaxed);
  const uint32_t op = r.op.load(std::memory_order_relaxed);
  ProgressSample out;
  out.count = entered + left + s.beats;
  if (entered == 0) {
    out.operation = s.beats > 0 ? "heartbeat" : "no operation yet";
  } else if (entered != left) {
    out.operation = std::string(comm::op_name(op));
  } else {
    out.operation =
        "between operations (last: " + std::string(comm::op_name(op)) + ")";
  }
  return out;
}

}  // namespace dlaunch::agent
