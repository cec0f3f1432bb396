#pragma once

// Wording shared by the store's messages (docs/errors.md): durations and
// OS error texts read the same in every message.

#include <chrono>
#include <string>
#include <string_view>

namespace dlaunch::comm::store {

// "250 ms", "5 s", "1.5 s".
std::string format_duration(std::chrono::milliseconds d);

// strerror(err) with its first letter lower-cased: "connection refused".
std::string errno_text(int err);

// `text` with its first letter lower-cased, to fit mid-sentence.
std::string lower_first(std::string_view text);

}  // namespace dlaunch::comm::store
