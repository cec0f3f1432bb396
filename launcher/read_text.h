#pragma once

#include <string>
#include <string_view>

namespace dlaunch::launcher {

// Reads all of file `path` into `text`. Returns "" or why it cannot:
// "is a folder" (a folder opens, and reads as nothing or throws: checked
// first), "no such file", or "cannot be read (REASON)".
std::string read_whole_file(const std::string& path, std::string& text);

// All of file `path`, which the user gave as `named` ("--env-file"; ""
// when the caller's message names the flag or key); else throws
// Error("NAMED: 'PATH': WHY; FIX"), WHY from read_whole_file() and `fix`
// saying what to give instead.
template <class Error>
std::string read_text(const std::string& path, std::string_view named,
                      std::string_view fix) {
  std::string text;
  if (std::string why = read_whole_file(path, text); !why.empty()) {
    throw Error(std::string(named) + (named.empty() ? "'" : ": '") + path +
                "': " + why + "; " + std::string(fix));
  }
  return text;
}

}  // namespace dlaunch::launcher
