#include "comm/store/text.h"

#include <cctype>
#include <cstdio>
#include <cstring>

namespace dlaunch::comm::store {

std::string format_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0 || ms >= 100000) {
    return std::to_string((ms + 500) / 1000) + " s";
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g s", static_cast<double>(ms) / 1000);
  return buf;
}

std::string errno_text(int err) { return lower_first(std::strerror(err)); }

std::string lower_first(std::string_view text) {
  std::string out(text);
  // Only a capitalised word ("Connection refused"), not an acronym ("EOF").
  if (out.size() > 1 && std::isupper(static_cast<unsigned char>(out[0])) &&
      std::islower(static_cast<unsigned char>(out[1]))) {
    out[0] =
        static_cast<char>(std::tolower(static_cast<unsigned char>(out[0])));
  }
  return out;
}

}  // namespace dlaunch::comm::store
