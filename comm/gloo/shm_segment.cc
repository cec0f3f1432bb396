#include "comm/gloo/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace dlaunch::comm::gloo {
namespace {

char* map_fd(int fd, size_t bytes, std::string& error, const std::string& n) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    error = "mmap of shared memory '" + n + "' (" + std::to_string(bytes) +
            " bytes): " + std::strerror(errno);
    return nullptr;
  }
  return static_cast<char*>(p);
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes,
                              std::string& error) {
  ShmSegment s;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd == -1) {
    error = "shm_open('" + name + "'): " + std::strerror(errno);
    return s;
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) == -1) {
    error = "ftruncate of shared memory '" + name + "' to " +
            std::to_string(bytes) + " bytes: " + std::strerror(errno);
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  // Reserve the pages now: tmpfs hands them out lazily, and touching one
  // past a full /dev/shm (64 MiB in a default container) raises SIGBUS.
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    error = "reserving " + std::to_string(bytes) +
            " bytes of shared memory for '" + name + "': " + std::strerror(rc);
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  s.data_ = map_fd(fd, bytes, error, name);
  close(fd);
  if (!s.data_) {
    shm_unlink(name.c_str());
    return s;
  }
  s.size_ = bytes;
  s.name_ = name;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes,
                            std::string& error) {
  ShmSegment s;
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd == -1) {
    error = "shm_open('" + name + "'): " + std::strerror(errno);
    return s;
  }
  struct stat st {};
  if (fstat(fd, &st) == -1 || static_cast<size_t>(st.st_size) < bytes) {
    error = "shared memory '" + name + "' is smaller than " +
            std::to_string(bytes) + " bytes";
    close(fd);
    return s;
  }
  s.data_ = map_fd(fd, bytes, error, name);
  close(fd);
  if (s.data_) s.size_ = bytes;
  return s;
}

ShmSegment::~ShmSegment() {
  unlink();
  if (data_) munmap(data_, size_);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      name_(std::move(o.name_)) {
  o.name_.clear();
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    unlink();
    if (data_) munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    o.name_.clear();
  }
  return *this;
}

void ShmSegment::unlink() {
  if (!name_.empty()) {
    shm_unlink(name_.c_str());
    name_.clear();
  }
}

}  // namespace dlaunch::comm::gloo
