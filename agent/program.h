#pragma once

#include <stdexcept>
#include <string>

namespace dlaunch::agent {

// Resolves the program a worker runs before any worker starts, so a typo
// costs one clear error (exit 127) and no restarts. `name` with a '/' is
// taken as a path; otherwise each folder of `path_env` ($PATH) is tried.
// Returns the path to execve, or throws ProgramError.
std::string resolve_program(const std::string& name,
                            const std::string& path_env);

// A program that does not exist or is not executable. what() names it and
// why: "dlaunch: 'foo': not found in PATH (/usr/bin:/bin)".
class ProgramError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dlaunch::agent
