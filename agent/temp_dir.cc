#include "agent/temp_dir.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace dlaunch::agent {

std::string make_temp_dir(std::vector<std::string> templates) {
  std::vector<int> errnos;
  for (std::string& t : templates) {
    if (::mkdtemp(t.data()) != nullptr) return t;
    errnos.push_back(errno);
  }
  throw std::runtime_error(temp_dir_error(templates, errnos));
}

std::string temp_dir_error(const std::vector<std::string>& templates,
                           const std::vector<int>& errnos) {
  std::string why;
  for (size_t i = 0; i < templates.size() && i < errnos.size(); ++i) {
    why += (why.empty() ? "" : "; ") + templates[i] + ": " +
           std::strerror(errnos[i]);
  }
  return why + "; set TMPDIR to a writable folder";
}

}  // namespace dlaunch::agent
