#include "agent/program.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

namespace dlaunch::agent {
namespace {

// Empty when `path` is an executable regular file, else why not.
std::string why_not_executable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (::access(path.c_str(), X_OK) != 0) {
    return std::string("not executable (") + std::strerror(errno) + ")";
  }
  return "";
}

}  // namespace

std::string resolve_program(const std::string& name,
                            const std::string& path_env) {
  if (name.empty()) throw ProgramError("dlaunch: no program to run");
  if (name.find('/') != std::string::npos) {
    std::string why = why_not_executable(name);
    if (!why.empty()) throw ProgramError("dlaunch: '" + name + "': " + why);
    return name;
  }
  std::string_view rest = path_env;
  std::string found_not_exec;
  while (true) {
    size_t colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate += '/';
    candidate += name;
    std::string why = why_not_executable(candidate);
    if (why.empty()) return candidate;
    if (found_not_exec.empty() && why.find("No such file") == std::string::npos)
      found_not_exec = candidate + ": " + why;
    if (colon == std::string_view::npos) break;
    rest = rest.substr(colon + 1);
  }
  if (!found_not_exec.empty()) {
    throw ProgramError("dlaunch: '" + name + "': " + found_not_exec);
  }
  throw ProgramError("dlaunch: '" + name + "': command not found in PATH (" +
                     path_env + ")");
}

}  // namespace dlaunch::agent
