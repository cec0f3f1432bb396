#pragma once

#include <string>
#include <vector>

namespace dlaunch::agent {

// mkdtemp() of the first of `templates` (each ending in XXXXXX) that works:
// the folder made. Throws std::runtime_error (temp_dir_error()) when none
// does.
std::string make_temp_dir(std::vector<std::string> templates);

// The message for templates that all failed, `errnos[i]` being why
// `templates[i]` did: each named with its reason, and the fix.
std::string temp_dir_error(const std::vector<std::string>& templates,
                           const std::vector<int>& errnos);

}  // namespace dlaunch::agent
