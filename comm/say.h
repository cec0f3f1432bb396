#pragma once

#include <unistd.h>

#include <string>
#include <string_view>

namespace dlaunch::comm {

// Writes "dlaunch comm: LINE" to stderr in one write(2), for what comm tells
// as it happens (a failure it is about to raise, an injected fault): before
// the caller acts on it, so that a process stopped right after (its agent
// ending the job because a peer reacted) still leaves the line. Any thread;
// never throws.
inline void say(std::string_view line) {
  std::string text = "dlaunch comm: ";
  text.append(line);
  text += '\n';
  if (::write(STDERR_FILENO, text.data(), text.size()) < 0) {
    // Nothing more to do: stderr is gone.
  }
}

// say(what), then the error E(what) for the caller to throw: a failure told
// as it is raised.
template <typename E>
E told(const std::string& what) {
  say(what);
  return E(what);
}

}  // namespace dlaunch::comm
