#include "comm/file_store.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "comm/store/text.h"

namespace dlaunch::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kUsersKey[] = "__dlaunch_file_store_users";
constexpr uint32_t kDeleted = 0xffffffffu;

std::string errno_text() { return store::errno_text(errno); }

// fcntl locks belong to the process, not the descriptor: they do not
// exclude two FileStores of one process, and closing any descriptor of the
// file drops them all. One mutex per process serialises every FileStore
// operation (and close) so that the file lock only has to order processes.
std::mutex& process_mutex() {
  static std::mutex mu;
  return mu;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return v;
}

// One blocking fcntl(F_SETLKW) on a helper thread (see lock_until).
struct LockCall {
  int fd = -1;
  struct flock fl {};
  std::mutex mu;  // guards the members below
  std::condition_variable cv;
  bool done = false;
  int err = 0;  // errno of a failed fcntl, 0 when the lock is held
};

void* lock_thread(void* arg) {
  auto* c = static_cast<LockCall*>(arg);
  // Cancellation (at the caller's deadline) can only act inside fcntl:
  // nothing on this frame needs unwinding there.
  int rc = fcntl(c->fd, F_SETLKW, &c->fl);
  int err = rc == -1 ? errno : 0;
  std::lock_guard lock(c->mu);
  c->done = true;
  c->err = err;
  c->cv.notify_all();
  return nullptr;
}

// Takes the fcntl lock `fl` on `fd`, waiting at most until `deadline`.
// Uncontended, at once; contended, F_SETLKW on a helper thread, which wakes
// as soon as the holder lets go and is cancelled at the deadline (F_SETLKW
// is a cancellation point; fcntl locks belong to the process, so the
// helper's lock is this caller's). Returns 0 with the lock held, ETIMEDOUT,
// or the errno of the failure.
int lock_until(int fd, struct flock fl, Clock::time_point deadline) {
  while (fcntl(fd, F_SETLK, &fl) == -1) {
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EACCES) return errno;
    LockCall call;
    call.fd = fd;
    call.fl = fl;
    pthread_t t;
    if (int rc = pthread_create(&t, nullptr, lock_thread, &call); rc != 0) {
      return rc;
    }
    bool done = false;
    {
      std::unique_lock lock(call.mu);
      done = call.cv.wait_until(lock, deadline, [&] { return call.done; });
    }
    if (!done) pthread_cancel(t);
    pthread_join(t, nullptr);
    std::lock_guard lock(call.mu);
    if (!call.done) {
      // Cancelled; should that have raced with the lock being granted,
      // give it back (no other operation of this process holds it: they
      // are serialised by process_mutex()).
      struct flock un = fl;
      un.l_type = F_UNLCK;
      fcntl(fd, F_SETLK, &un);
      return ETIMEDOUT;
    }
    if (call.err == EINTR) continue;
    return call.err;
  }
  return 0;
}

}  // namespace

// An fcntl record lock on the whole file, held for one operation.
class FileStore::Lock {
 public:
  Lock(const FileStore& s, bool exclusive) : s_(s) {
    struct flock fl {};
    fl.l_type = exclusive ? F_WRLCK : F_RDLCK;
    fl.l_whence = SEEK_SET;
    const auto t = s_.timeout();
    int err = lock_until(s_.fd_, fl, Clock::now() + t);
    if (err == ETIMEDOUT) {
      throw store::StoreTimeoutError(
          "FileStore " + s_.path_ + ": could not lock the file within " +
          std::to_string(t.count()) +
          " ms (another process holds it: a stuck or stopped process, or an "
          "NFS server that does not answer)");
    }
    if (err != 0) {
      throw store::StoreError("FileStore " + s_.path_ +
                              ": cannot lock the file: " + std::strerror(err));
    }
  }
  ~Lock() {
    struct flock fl {};
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    fcntl(s_.fd_, F_SETLK, &fl);
  }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  const FileStore& s_;
};

FileStore::FileStore(std::string path, std::chrono::milliseconds timeout)
    : path_(std::move(path)) {
  set_timeout(timeout);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ == -1) {
    throw store::StoreError("FileStore: cannot open '" + path_ +
                            "': " + errno_text() +
                            " (the directory must exist and be writable)");
  }
  // inotify wakes waiters at once on a local file system; on network file
  // systems, where other machines' writes raise no event, waits also
  // re-read the file every 100 ms.
  inotify_fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ != -1 &&
      inotify_add_watch(inotify_fd_, path_.c_str(), IN_MODIFY) == -1) {
    ::close(inotify_fd_);
    inotify_fd_ = -1;
  }
  std::lock_guard guard(process_mutex());
  try {
    Lock lock(*this, true);
    refresh_locked();
    add_locked(kUsersKey, 1);
  } catch (...) {
    if (inotify_fd_ != -1) ::close(inotify_fd_);
    ::close(fd_);
    throw;
  }
}

FileStore::~FileStore() {
  std::lock_guard guard(process_mutex());
  try {
    Lock lock(*this, true);
    refresh_locked();
    if (add_locked(kUsersKey, -1) == 0) ::unlink(path_.c_str());
  } catch (const std::exception&) {
    // Best effort: a leftover file only matters to a later job on this path.
  }
  if (inotify_fd_ != -1) ::close(inotify_fd_);
  ::close(fd_);
}

void FileStore::refresh_locked() {
  struct stat st {};
  if (fstat(fd_, &st) == -1) {
    throw store::StoreError("FileStore " + path_ + ": stat: " + errno_text());
  }
  if (st.st_size < offset_) {
    // Someone deleted and recreated the file: start over.
    offset_ = 0;
    cache_.clear();
  }
  if (st.st_size == offset_) return;
  std::string data(static_cast<size_t>(st.st_size - offset_), '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::pread(fd_, data.data() + got, data.size() - got,
                        offset_ + static_cast<off_t>(got));
    if (n == -1 && errno == EINTR) continue;
    if (n <= 0) {
      throw store::StoreError("FileStore " + path_ + ": read: " +
                              (n == 0 ? "short file" : errno_text()));
    }
    got += static_cast<size_t>(n);
  }
  size_t pos = 0;
  while (data.size() - pos >= 8) {
    uint32_t klen = get_u32(data.data() + pos);
    if (data.size() - pos - 4 < klen + 4) break;
    std::string key = data.substr(pos + 4, klen);
    uint32_t vlen = get_u32(data.data() + pos + 4 + klen);
    size_t body = pos + 8 + klen;
    if (vlen == kDeleted) {
      cache_.erase(key);
      pos = body;
      continue;
    }
    if (data.size() - body < vlen) break;
    cache_.insert_or_assign(std::move(key), data.substr(body, vlen));
    pos = body + vlen;
  }
  if (pos != data.size()) {
    throw store::StoreError("FileStore " + path_ +
                            ": truncated record at byte " +
                            std::to_string(offset_ + static_cast<off_t>(pos)) +
                            " (was the file written by something else?)");
  }
  offset_ += static_cast<off_t>(pos);
}

void FileStore::write_locked(std::string_view key, const std::string* value) {
  std::string rec;
  put_u32(rec, static_cast<uint32_t>(key.size()));
  rec.append(key);
  put_u32(rec, value ? static_cast<uint32_t>(value->size()) : kDeleted);
  if (value) rec.append(*value);
  size_t done = 0;
  while (done < rec.size()) {
    ssize_t n = ::pwrite(fd_, rec.data() + done, rec.size() - done,
                         offset_ + static_cast<off_t>(done));
    if (n == -1 && errno == EINTR) continue;
    if (n <= 0) {
      // Part of the record may be in the file (a full disk, a file size
      // limit): cut it off, or every later reader would stop at a
      // truncated record. Readers take the lock this writer holds, so none
      // has seen it.
      std::string why = n == 0 ? "no progress" : errno_text();
      if (::ftruncate(fd_, offset_) != 0) {
        why += "; removing the partial record failed too (" + errno_text() +
               "): the file is damaged, delete it";
      }
      throw store::StoreError("FileStore " + path_ + ": write of key '" +
                              std::string(key) + "' failed: " + why);
    }
    done += static_cast<size_t>(n);
  }
  offset_ += static_cast<off_t>(rec.size());
  if (value) {
    cache_.insert_or_assign(std::string(key), *value);
  } else {
    cache_.erase(std::string(key));
  }
}

int64_t FileStore::add_locked(std::string_view key, int64_t delta) {
  int64_t v = 0;
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) {
      throw store::StoreError("FileStore " + path_ + ": add on key '" +
                              std::string(key) + "' whose value '" + s +
                              "' is not an integer");
    }
  }
  v += delta;
  std::string text = std::to_string(v);
  write_locked(key, &text);
  return v;
}

void FileStore::set(std::string_view key, std::string_view value) {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, true);
  refresh_locked();
  std::string v(value);
  write_locked(key, &v);
}

std::string FileStore::get(std::string_view key) {
  return multi_get({std::string(key)})[0];
}

int64_t FileStore::add(std::string_view key, int64_t delta) {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, true);
  refresh_locked();
  return add_locked(key, delta);
}

std::string FileStore::compare_set(std::string_view key,
                                   std::string_view expected,
                                   std::string_view desired) {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, true);
  refresh_locked();
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (!expected.empty()) return std::string(expected);
  } else if (it->second != expected) {
    return it->second;
  }
  std::string v(desired);
  write_locked(key, &v);
  return v;
}

void FileStore::wait(const std::vector<std::string>& keys,
                     std::chrono::milliseconds timeout) {
  wait_for_keys(keys, timeout);
}

void FileStore::wait_for_keys(const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (check(keys)) return;
    auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      std::string missing;
      size_t present = 0;
      {
        std::lock_guard guard(process_mutex());
        for (const auto& k : keys) {
          if (cache_.count(k)) {
            ++present;
          } else {
            missing += (missing.empty() ? "'" : ",'") + k + "'";
          }
        }
      }
      throw store::StoreTimeoutError(
          "FileStore " + path_ + ": timed out after " +
          std::to_string(timeout.count()) + " ms waiting for keys " + missing +
          " (" + std::to_string(present) + "/" + std::to_string(keys.size()) +
          " present)");
    }
    // Wait for a write to the file (inotify), at most 100 ms so that writes
    // from other machines on a network file system are seen too.
    int wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 100));
    if (inotify_fd_ != -1) {
      struct pollfd p {
        inotify_fd_, POLLIN, 0
      };
      if (::poll(&p, 1, wait_ms) > 0) {
        char buf[4096];
        while (::read(inotify_fd_, buf, sizeof(buf)) > 0) {
        }
      }
    } else {
      ::poll(nullptr, 0, wait_ms);
    }
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, false);
  refresh_locked();
  for (const auto& k : keys) {
    if (!cache_.count(k)) return false;
  }
  return true;
}

bool FileStore::delete_key(std::string_view key) {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, true);
  refresh_locked();
  if (!cache_.count(key)) return false;
  write_locked(key, nullptr);
  return true;
}

int64_t FileStore::num_keys() {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, false);
  refresh_locked();
  return static_cast<int64_t>(cache_.size()) -
         (cache_.count(kUsersKey) ? 1 : 0);
}

std::vector<std::string> FileStore::multi_get(
    const std::vector<std::string>& keys) {
  wait_for_keys(keys, timeout_);
  std::lock_guard guard(process_mutex());
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(cache_.at(k));
  return out;
}

void FileStore::multi_set(const std::vector<std::string>& keys,
                          const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw store::StoreError("FileStore: multi_set with " +
                            std::to_string(keys.size()) + " keys but " +
                            std::to_string(values.size()) +
                            " values; pass one value per key");
  }
  std::lock_guard guard(process_mutex());
  Lock lock(*this, true);
  refresh_locked();
  for (size_t i = 0; i < keys.size(); ++i) write_locked(keys[i], &values[i]);
}

int64_t FileStore::append(std::string_view key, std::string_view value) {
  std::lock_guard guard(process_mutex());
  Lock lock(*this, true);
  refresh_locked();
  auto it = cache_.find(key);
  std::string v = it == cache_.end() ? std::string() : it->second;
  v.append(value);
  write_locked(key, &v);
  return static_cast<int64_t>(v.size());
}

}  // namespace dlaunch::comm
