// libFuzzer harness for YAML job files (launcher/job_file.h): any text given
// to `dlaunch --config FILE` is loaded, checked and laid under the flag table
// as the real command line does; it must parse or fail with a UsageError
// naming the file, never crash. The text goes through a file because that is
// the loader's interface (it resolves paths against the file's folder).
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <variant>

#include "launcher/cli.h"

namespace {

// A private folder holding job.yaml, removed with everything in it when the
// process exits (libFuzzer's normal end calls exit). A crash skips that;
// scripts/fuzz points TMPDIR into build-fuzz/ so nothing lands in /tmp.
class JobDir {
 public:
  JobDir() {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = std::string(tmp && *tmp ? tmp : "/tmp") + "/dlaunch-fuzz-job-XXXXXX";
    if (::mkdtemp(dir_.data()) == nullptr) std::abort();
    file_ = dir_ + "/job.yaml";
  }
  ~JobDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  JobDir(const JobDir&) = delete;
  JobDir& operator=(const JobDir&) = delete;

  const std::string& file() const { return file_; }

 private:
  std::string dir_;
  std::string file_;
};

const std::string& job_path() {
  static const JobDir dir;
  return dir.file();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = job_path();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  // No GPU query (nproc_per_node: gpu) leaves the process: the helper does
  // not exist, which is an error like any other.
  dlaunch::agent::EnvMap env{{"PATH", "/usr/bin:/bin"},
                             {"HOME", "/nonexistent"},
                             {"DLAUNCH_CUDA_DEVICES", "/nonexistent/helper"}};
  auto result = dlaunch::launcher::parse_command_line(
      {"--config", path, "true"}, env, [](const std::string&) {});
  if (auto* e = std::get_if<dlaunch::launcher::UsageError>(&result)) {
    // Every refusal says what is wrong.
    if (e->message.empty()) std::abort();
  }
  return 0;
}
