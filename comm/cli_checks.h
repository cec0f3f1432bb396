#pragma once

// CLI11 pieces shared by the command-line programs built on comm (dl-store,
// the workloads): errors of one line that name the value, the valid range
// and the way to the help. CLI11's own PositiveNumber prints "not in range
// 0.000000 to 1797693134862315708145274...", its errors a second line.

#include <CLI/CLI.hpp>
#include <charconv>
#include <limits>
#include <optional>
#include <string>

namespace dlaunch::comm {

// Accepts a whole number of type T from `lo` to T's largest; the message
// of anything else names both ends. Shown in --help as POSITIVE (lo 1) or
// NONNEGATIVE (lo 0), like CLI11's checks.
template <class T>
CLI::Validator whole_number(T lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        T v{};
        const char* end = s.data() + s.size();
        auto [p, ec] = std::from_chars(s.data(), end, v);
        if (ec == std::errc() && p == end && v >= lo) return "";
        return "'" + s + "' is not valid; use a whole number from " +
               std::to_string(lo) + " to " +
               std::to_string(std::numeric_limits<T>::max());
      },
      lo == 1   ? "POSITIVE"
      : lo == 0 ? "NONNEGATIVE"
                : ">=" + std::to_string(lo));
}

// Makes `app` report a bad command line as one line, "PROG: ERROR (see
// PROG --help)", instead of CLI11's two.
inline void one_line_errors(CLI::App& app) {
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return a->get_name() + ": " + e.what() + " (see " + a->get_name() +
           " --help)\n";
  });
}

// Parses `argv` into `app` (with one_line_errors). Returns the status to
// exit with when the program ends here: 0 after --help (printed), 2 after
// a bad command line (reported); nullopt when it goes on.
inline std::optional<int> parse_or_exit(CLI::App& app, int argc, char** argv) {
  one_line_errors(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace dlaunch::comm
