#pragma once

// The text form shared by dlaunch's fault specs (--fault, DLAUNCH_FAULTS,
// a job file's faults:) and comm's DLAUNCH_COMM_FAULTS:
//   KIND[:KEY=VALUE[:KEY=VALUE...]]   e.g. kill:rank=1:after=2:signal=TERM
// No commas or spaces, so a list of specs is comma- or ;-separated.
// Header-only: the agent uses it without linking comm.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dlaunch::comm {

// A spec that cannot be used; what() is "fault 'TEXT': WHY; FIX".
class FaultSpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// One spec split into its kind and keys, with typed readers whose errors
// name the spec. Plain value; no OS access.
class FaultSpec {
 public:
  // Throws FaultSpecError when `text` is not KIND[:KEY=VALUE...], a key
  // is empty or given twice.
  explicit FaultSpec(std::string_view text) : text_(text) {
    if (text_.empty()) fail("empty; write KIND:KEY=VALUE[:KEY=VALUE...]");
    size_t start = 0;
    bool first = true;
    while (true) {
      size_t colon = text_.find(':', start);
      std::string part = text_.substr(start, colon - start);
      if (first) {
        kind_ = part;
        if (kind_.empty()) fail("no kind before ':'");
        first = false;
      } else {
        size_t eq = part.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == part.size()) {
          fail("'" + part + "' is not KEY=VALUE");
        }
        std::string key = part.substr(0, eq);
        if (has(key)) fail("'" + key + "' is given twice");
        keys_.emplace_back(key, part.substr(eq + 1));
      }
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }

  const std::string& text() const { return text_; }
  const std::string& kind() const { return kind_; }

  // Throws unless every key is one of `allowed`.
  void allow(std::initializer_list<std::string_view> allowed) const {
    for (const auto& [k, v] : keys_) {
      if (std::find(allowed.begin(), allowed.end(), k) != allowed.end()) {
        continue;
      }
      std::string list;
      for (std::string_view a : allowed) {
        list += (list.empty() ? "" : ", ") + std::string(a);
      }
      fail("'" + k + "' is not a key of " + kind_ + "; its keys are " + list);
    }
  }

  // Throws naming `key` when it is missing.
  void require(std::string_view key, std::string_view example) const {
    if (!has(key)) {
      fail(kind_ + " needs " + std::string(key) + "= (like " +
           std::string(example) + ")");
    }
  }

  bool has(std::string_view key) const { return find(key) != nullptr; }

  // The raw value of `key`, if given.
  std::optional<std::string> value(std::string_view key) const {
    const std::string* v = find(key);
    return v ? std::optional<std::string>(*v) : std::nullopt;
  }

  // An integer in [lo, hi].
  std::optional<int> integer(std::string_view key, int lo, int hi) const {
    const std::string* v = find(key);
    if (!v) return std::nullopt;
    int n = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc() || p != v->data() + v->size() || n < lo || n > hi) {
      fail(std::string(key) + "='" + *v +
           "' is not valid; use a whole number " + std::to_string(lo) + ".." +
           std::to_string(hi));
    }
    return n;
  }

  // Seconds, 0 up to 7 days, in whole milliseconds.
  std::optional<std::chrono::milliseconds> seconds(std::string_view key) const {
    const std::string* v = find(key);
    if (!v) return std::nullopt;
    double d = -1;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), d);
    if (ec != std::errc() || p != v->data() + v->size() || !std::isfinite(d) ||
        d < 0 || d > 7 * 24 * 3600.0) {
      fail(std::string(key) + "='" + *v +
           "' is not valid; use seconds from 0 to 604800, like 2 or 0.5");
    }
    return std::chrono::milliseconds(std::llround(d * 1e3));
  }

  // A signal: KILL, SIGKILL or a number 1..64.
  std::optional<int> signal(std::string_view key) const {
    const std::string* v = find(key);
    if (!v) return std::nullopt;
    std::string name = *v;
    if (name.rfind("SIG", 0) == 0) name = name.substr(3);
    for (const auto& [n, s] : signal_names()) {
      if (name == n) return s;
    }
    int num = 0;
    auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), num);
    if (ec == std::errc() && p == v->data() + v->size() && num >= 1 &&
        num <= 64) {
      return num;
    }
    fail(std::string(key) + "='" + *v +
         "' is not a signal; use a name like KILL, TERM, SEGV, ABRT, INT or "
         "a number 1..64");
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw FaultSpecError("fault '" + text_ + "': " + why);
  }

  // The signals known by name, without "SIG".
  static const std::vector<std::pair<std::string_view, int>>& signal_names() {
    static const std::vector<std::pair<std::string_view, int>> kNames = {
        {"KILL", SIGKILL}, {"TERM", SIGTERM}, {"INT", SIGINT},
        {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"SEGV", SIGSEGV},
        {"ABRT", SIGABRT}, {"BUS", SIGBUS},   {"FPE", SIGFPE},
        {"ILL", SIGILL},   {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
        {"PIPE", SIGPIPE}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
    return kNames;
  }

  // "KILL" for SIGKILL; the number for signals without a name here.
  static std::string signal_text(int sig) {
    for (const auto& [n, s] : signal_names()) {
      if (s == sig) return std::string(n);
    }
    return std::to_string(sig);
  }

  // "2", "0.5": seconds as the shortest text that reads back the same.
  static std::string seconds_text(std::chrono::milliseconds d) {
    char buf[32];
    auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d.count() / 1e3);
    return std::string(buf, p);
  }

 private:
  const std::string* find(std::string_view key) const {
    for (const auto& [k, v] : keys_) {
      if (k == key) return &v;
    }
    return nullptr;
  }

  std::string text_;
  std::string kind_;
  std::vector<std::pair<std::string, std::string>> keys_;
};

// Splits a list of specs on ',' ';' and whitespace (DLAUNCH_FAULTS,
// DLAUNCH_COMM_FAULTS); empty items are dropped.
inline std::vector<std::string> split_fault_list(std::string_view list) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : list) {
    if (c == ',' || c == ';' || c == ' ' || c == '\t' || c == '\n') {
      if (!cur.empty()) out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

}  // namespace dlaunch::comm
