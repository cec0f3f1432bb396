#include "agent/line_buffer.h"

namespace dlaunch::agent {

void LineBuffer::feed(std::string_view bytes, std::string& out) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(bytes);
      // A "line" this long is not one: pass it on rather than grow forever.
      if (partial_.size() >= kMaxLine) flush(out);
      return;
    }
    out += prefix_;
    out += partial_;
    partial_.clear();
    out.append(bytes.substr(0, nl + 1));
    bytes.remove_prefix(nl + 1);
  }
}

void LineBuffer::flush(std::string& out) {
  if (partial_.empty()) return;
  out += prefix_;
  out += partial_;
  out += '\n';
  partial_.clear();
}

}  // namespace dlaunch::agent
