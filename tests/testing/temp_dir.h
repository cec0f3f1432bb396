#pragma once

#include <filesystem>
#include <string>

namespace dlaunch::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it
// when the object dies. One per test; not thread-safe.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "dlaunch-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // path() / name.
  std::filesystem::path operator/(const std::string& name) const {
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

// Whole contents of a file ("" when it cannot be read).
std::string read_file(const std::filesystem::path& path);
// Writes `text` to `path`, with the mode given (e.g. 0755 for scripts).
void write_file(const std::filesystem::path& path, const std::string& text,
                int mode = 0644);

}  // namespace dlaunch::testing
