#pragma once

// Where the build put dlaunch's executables. Header-only: DLAUNCH_BIN_DIR is
// defined for every test target by dlaunch_add_test().

#include <string>
#include <string_view>

namespace dlaunch::testing {

// The path of the built executable `name` ("dlaunch", "dl-store", ...).
inline std::string bin(std::string_view name) {
  return std::string(DLAUNCH_BIN_DIR "/") + std::string(name);
}

}  // namespace dlaunch::testing
