#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store/store.h"

namespace dlaunch::comm {

// A Store kept in one file on a file system every rank can reach (torch's
// FileStore, for init_method "file:///path"). The file is an append-only
// log of records, read and written under an fcntl lock, so processes on
// several machines sharing an NFS mount agree. Each instance registers as a
// user; the last one to go away deletes the file, so that a later job can
// reuse the path. Thread-safe (calls are serialised internally).
class FileStore : public store::Store {
 public:
  // Opens (creating if needed) `path`. Throws store::StoreError naming the
  // path and the reason when it cannot be opened. `timeout` becomes
  // timeout(), which also bounds every wait for the file lock
  // (StoreTimeoutError: a process holding it is stuck or stopped, or the
  // NFS server does not answer).
  explicit FileStore(std::string path, std::chrono::milliseconds timeout =
                                           std::chrono::minutes(5));
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  int64_t add(std::string_view key, int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys,
            std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  int64_t num_keys() override;
  std::vector<std::string> multi_get(
      const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  int64_t append(std::string_view key, std::string_view value) override;

  const std::string& path() const { return path_; }

 private:
  class Lock;
  // Reads records appended since the last refresh; file lock held.
  void refresh_locked();
  // Appends one record (a missing value deletes the key); write lock held.
  void write_locked(std::string_view key, const std::string* value);
  int64_t add_locked(std::string_view key, int64_t delta);
  // Blocks until every key is present or the deadline passes.
  void wait_for_keys(const std::vector<std::string>& keys,
                     std::chrono::milliseconds timeout);

  const std::string path_;
  int fd_ = -1;
  int inotify_fd_ = -1;
  off_t offset_ = 0;
  std::map<std::string, std::string, std::less<>> cache_;
};

}  // namespace dlaunch::comm
