#include "agent/line_buffer.h"

namespace dlaunch::agent {

void LineBuffer::emit(std::string& out, std::string_view end) {
  out += prefix_;
  out += partial_;
  out += end;
}

void LineBuffer::end_line(std::string& out, std::string_view end) {
  emit(out, end);
  partial_.clear();
  redraws_ = shown_ = false;
}

void LineBuffer::end_redraw(std::string& out) {
  redraws_ = true;
  if (!shown_ && !partial_.empty()) emit(out, "\r");
  partial_.clear();
  shown_ = false;
}

void LineBuffer::feed(std::string_view bytes, std::string& out) {
  if (bytes.empty()) return;
  redraws_ = false;
  if (cr_pending_) {
    cr_pending_ = false;
    if (bytes.front() == '\n') {
      // The line is sent again whole even if shown: a bare '\n' would reach
      // the console (or the head) apart from its line and prefix.
      end_line(out, "\r\n");
      bytes.remove_prefix(1);
    } else {
      end_redraw(out);
    }
  }
  while (!bytes.empty()) {
    const size_t end = bytes.find_first_of(live_ ? "\r\n" : "\n");
    const std::string_view text = bytes.substr(0, end);
    if (!text.empty()) {
      partial_.append(text);
      shown_ = false;
    }
    if (end == std::string_view::npos) break;
    if (bytes[end] == '\n') {
      end_line(out, "\n");
    } else if (end + 1 == bytes.size()) {
      cr_pending_ = true;  // "\r\n" split between reads, or a redraw
      redraws_ = true;
    } else if (bytes[end + 1] == '\n') {
      end_line(out, "\r\n");
      bytes.remove_prefix(1);
    } else {
      end_redraw(out);
    }
    bytes.remove_prefix(end + 1);
  }
  // A "line" this long is not one: pass it on rather than grow forever.
  if (partial_.size() >= kMaxLine) {
    flush(out);
  } else if (redraws_ && !shown_ && !partial_.empty()) {
    emit(out, "\r");
    shown_ = true;
  }
}

void LineBuffer::flush(std::string& out) {
  cr_pending_ = false;
  if (partial_.empty()) {
    redraws_ = shown_ = false;
    return;
  }
  end_line(out, "\n");
}

size_t LineBuffer::unit_end(std::string_view text, size_t pos) const {
  const size_t end = text.find_first_of(live_ ? "\r\n" : "\n", pos);
  if (end != std::string_view::npos && text[end] == '\r' &&
      end + 1 < text.size() && text[end + 1] == '\n') {
    return end + 1;
  }
  return end;
}

}  // namespace dlaunch::agent
