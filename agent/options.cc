#include "agent/options.h"

#include <charconv>
#include <stdexcept>
#include <string>

namespace dlaunch::agent {
namespace {

constexpr std::string_view kValidForms =
    "valid forms: 0 (none), 1 (stdout), 2 (stderr), 3 (both), or a per-rank "
    "map like 0:3,1:0";

int parse_int(std::string_view s, std::string_view whole) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) {
    throw std::invalid_argument("'" + std::string(whole) + "': '" +
                                std::string(s) + "' is not a number; " +
                                std::string(kValidForms));
  }
  return v;
}

Streams parse_one(std::string_view s, std::string_view whole) {
  int v = parse_int(s, whole);
  if (v < 0 || v > 3) {
    throw std::invalid_argument(
        "'" + std::string(whole) + "': " + std::to_string(v) +
        " is out of range; " + std::string(kValidForms));
  }
  return static_cast<Streams>(v);
}

}  // namespace

Streams StreamsSpec::for_rank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? Streams::kNone : it->second;
}

StreamsSpec parse_streams(std::string_view text) {
  StreamsSpec spec;
  if (text.find(':') == std::string_view::npos) {
    spec.all = parse_one(text, text);
    return spec;
  }
  std::string_view rest = text;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw std::invalid_argument("'" + std::string(text) + "': '" +
                                  std::string(item) + "' is not RANK:VALUE; " +
                                  std::string(kValidForms));
    }
    int rank = parse_int(item.substr(0, colon), text);
    if (rank < 0) {
      throw std::invalid_argument("'" + std::string(text) +
                                  "': negative local rank; " +
                                  std::string(kValidForms));
    }
    if (spec.per_rank.contains(rank)) {
      throw std::invalid_argument("'" + std::string(text) + "': local rank " +
                                  std::to_string(rank) +
                                  " is given twice; give each rank once");
    }
    spec.per_rank[rank] = parse_one(item.substr(colon + 1), text);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

}  // namespace dlaunch::agent
