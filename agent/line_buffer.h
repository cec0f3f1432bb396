#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dlaunch::agent {

// Cuts a byte stream into whole lines and prefixes each, so the lines of
// different workers never interleave on the console. A line that redraws
// itself with '\r' (a progress bar: tqdm writes "\r 10%|#  |") is shown
// live: each redraw goes out prefixed and ending in '\r', and what of the
// next has come is shown (ending in '\r') at the end of the feed() that
// brought the redraw, so the bar moves before its line ends. Plain text without
// '\r' waits for its
// '\n' as before. One per worker stream; not thread-safe.
class LineBuffer {
 public:
  // `redraws` false: '\r' is text like any other (for streams whose lines
  // are labelled whole further on, as pdsh's and srun's are).
  explicit LineBuffer(std::string prefix, bool redraws = true)
      : prefix_(std::move(prefix)), live_(redraws) {}

  // Unfinished lines longer than this are passed on as a line of their own.
  static constexpr size_t kMaxLine = 64 * 1024;

  // Appends to `out` every unit completed by `bytes`: a line, prefixed and
  // ending in '\n' (or the stream's "\r\n"), or a redraw, prefixed and
  // ending in '\r'. Keeps an unfinished line for later.
  void feed(std::string_view bytes, std::string& out);
  // Appends the unfinished line, if any, prefixed and with a '\n' added
  // (the stream has ended).
  void flush(std::string& out);

  // Where the unit of `text` (feed()'s output) starting at `pos` ends: the
  // index of its terminator, '\n' or a redraw's '\r' (a "\r\n" line's '\n');
  // npos when none.
  size_t unit_end(std::string_view text, size_t pos) const;

 private:
  void emit(std::string& out, std::string_view end);
  // Emits the line with `end` and starts a new one.
  void end_line(std::string& out, std::string_view end);
  // A '\r' not followed by '\n' ended a redraw.
  void end_redraw(std::string& out);

  std::string prefix_;
  bool live_;
  std::string partial_;
  bool cr_pending_ = false;  // the last byte fed was a '\r'
  // A redraw ended in this feed(): what follows it is shown at the end,
  // once (a line grown a byte a time between redraws is not sent again
  // and again).
  bool redraws_ = false;
  bool shown_ = false;  // partial_ is on the console as it is
};

}  // namespace dlaunch::agent
