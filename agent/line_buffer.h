#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dlaunch::agent {

// Cuts a byte stream into whole lines and prefixes each, so the lines of
// different workers never interleave on the console. One per worker stream;
// not thread-safe.
class LineBuffer {
 public:
  explicit LineBuffer(std::string prefix) : prefix_(std::move(prefix)) {}

  // Unfinished lines longer than this are passed on as a line of their own.
  static constexpr size_t kMaxLine = 64 * 1024;

  // Appends every line completed by `bytes` to `out`, prefixed and ending
  // in '\n'; keeps an unfinished line for later.
  void feed(std::string_view bytes, std::string& out);
  // Appends the unfinished line, if any, prefixed and with a '\n' added
  // (the stream has ended).
  void flush(std::string& out);

 private:
  std::string prefix_;
  std::string partial_;
};

}  // namespace dlaunch::agent
