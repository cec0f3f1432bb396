#include "launcher/read_text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dlaunch::launcher {

std::string read_whole_file(const std::string& path, std::string& text) {
  text.clear();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return "no such file";
    return std::string("cannot be read (") + std::strerror(errno) + ")";
  }
  std::string why;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) why = "is a folder";
  char buf[65536];
  while (why.empty()) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      why = std::string("cannot be read (") + std::strerror(errno) + ")";
    }
  }
  ::close(fd);
  return why;
}

}  // namespace dlaunch::launcher
