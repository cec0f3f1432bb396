#include "launcher/staging.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <set>
#include <system_error>
#include <vector>

#include "agent/posix_env.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;

constexpr char kRecord[] = "head";
constexpr std::string_view kPrefix = "dlaunch-job-", kSuffix = ".d";
// A folder without a record is a head's that has not written it yet (for
// microseconds after its mkdir) or one from a dlaunch before the record
// (81922dc). Past this age, and with no process naming its tag, it is
// left over.
constexpr std::chrono::hours kRecordlessAge{1};

// A small file's text, or nullopt (read through `dir_fd` when >= 0).
std::optional<std::string> read_small(int dir_fd, const char* path) {
  int fd = ::openat(dir_fd, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  char buf[4096];
  std::string text;
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

// Whether `name` is a head's staging folder's: dlaunch-job-HEX.d.
bool staging_name(std::string_view name) {
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  std::string_view hex = name.substr(
      kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  return !hex.empty() &&
         hex.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// Whether the record "PID START" names a process that runs now.
bool head_runs(std::string_view record) {
  long long pid = 0;
  unsigned long long start = 0;
  const char* p = record.data();
  const char* end = p + record.size();
  auto [after_pid, e1] = std::from_chars(p, end, pid);
  if (e1 != std::errc() || after_pid == end || *after_pid != ' ' || pid <= 0) {
    return true;  // unreadable: not ours to judge
  }
  auto [after_start, e2] = std::from_chars(after_pid + 1, end, start);
  if (e2 != std::errc()) return true;
  // A head runs as this user: EPERM means the pid is someone else's now.
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return false;
  std::optional<unsigned long long> now =
      process_start_time(static_cast<pid_t>(pid));
  return now && *now == start;
}

// The job tags (dlaunch-job-HEX) that this user's processes name in their
// command line or environment: an older head's ssh, pdsh or srun carry its
// agents' --job-tag, its workers DLAUNCH_JOB_TAG.
std::set<std::string, std::less<>> live_job_tags() {
  std::set<std::string, std::less<>> tags;
  const uid_t me = ::getuid();
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || st.st_uid != me) continue;
    for (const char* what : {"/cmdline", "/environ"}) {
      std::optional<std::string> text =
          read_small(AT_FDCWD, (e.path().string() + what).c_str());
      if (!text) continue;
      for (size_t at = text->find(kPrefix); at != std::string::npos;
           at = text->find(kPrefix, at + 1)) {
        size_t end =
            text->find_first_not_of("0123456789abcdef", at + kPrefix.size());
        tags.insert(text->substr(at, end - at));
      }
    }
  }
  return tags;
}

}  // namespace

std::optional<unsigned long long> process_start_time(pid_t pid) {
  std::optional<std::string> stat =
      read_small(AT_FDCWD, ("/proc/" + std::to_string(pid) + "/stat").c_str());
  if (!stat) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: count the
  // fields after its closing one. State is field 3, start time field 22.
  size_t at = stat->rfind(')');
  if (at == std::string::npos) return std::nullopt;
  for (int field = 2; field < 22; ++field) {
    at = stat->find(' ', at + 1);
    if (at == std::string::npos) return std::nullopt;
  }
  unsigned long long start = 0;
  auto [p, ec] = std::from_chars(stat->data() + at + 1,
                                 stat->data() + stat->size(), start);
  if (ec != std::errc()) return std::nullopt;
  return start;
}

size_t remove_stale_staging(const fs::path& tmp) {
  size_t removed = 0;
  auto remove = [&](const fs::path& p) {
    std::error_code ignored;  // another head may be removing it too
    if (fs::remove_all(p, ignored) > 0) ++removed;
  };
  const auto old = std::chrono::system_clock::now() - kRecordlessAge;
  std::vector<fs::path> unrecorded;  // old enough, without a record
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (!staging_name(name)) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::getuid()) {
      continue;
    }
    int dir = ::open(e.path().c_str(),
                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) continue;
    std::optional<std::string> record = read_small(dir, kRecord);
    ::close(dir);
    if (record) {
      if (!head_runs(*record)) remove(e.path());
    } else if (std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec) <
               old) {
      unrecorded.push_back(e.path());
    }
  }
  if (unrecorded.empty()) return removed;
  const auto live = live_job_tags();  // one look at /proc for them all
  for (const fs::path& p : unrecorded) {
    std::string name = p.filename().string();
    name.resize(name.size() - kSuffix.size());
    if (!live.contains(name)) remove(p);
  }
  return removed;
}

StagingDir::StagingDir(const fs::path& tmp, const std::string& tag)
    : path_(tmp / (tag + std::string(kSuffix))) {
  remove_stale_staging(tmp);
  if (::mkdir(path_.c_str(), 0700) != 0) return;
  std::optional<unsigned long long> start = process_start_time(::getpid());
  int dir =
      ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (!start || dir < 0) {
    if (dir >= 0) ::close(dir);
    return;
  }
  int fd = ::openat(dir, kRecord,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  ::close(dir);
  if (fd < 0) return;
  agent::write_all(
      fd, std::to_string(::getpid()) + " " + std::to_string(*start) + "\n");
  ::close(fd);
}

StagingDir::~StagingDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

}  // namespace dlaunch::launcher
