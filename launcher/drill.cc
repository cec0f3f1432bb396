#include "launcher/drill.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "agent/report.h"

namespace dlaunch::launcher {
namespace {

using agent::WallTime;

// "0.123 s"; "-" when either end is missing.
std::string between(WallTime from, WallTime to) {
  if (from == WallTime{} || to == WallTime{}) return "-";
  double s = std::chrono::duration<double>(to - from).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

// Nanoseconds since the epoch; 0 for an unset time.
int64_t to_ns(WallTime t) {
  return t == WallTime{} ? 0
                         : std::chrono::duration_cast<std::chrono::nanoseconds>(
                               t.time_since_epoch())
                               .count();
}

WallTime from_ns(int64_t ns) {
  return ns == 0 ? WallTime{}
                 : WallTime(std::chrono::duration_cast<WallTime::duration>(
                       std::chrono::nanoseconds(ns)));
}

}  // namespace

std::string encode_drill_part(const agent::RunResult& r) {
  nlohmann::json j;
  j["starts"] = r.attempts.size();
  j["start"] = r.attempts.empty() ? 0 : to_ns(r.attempts.front().start_time);
  nlohmann::json faults = nlohmann::json::array();
  for (const agent::FaultRecord& f : r.faults) {
    faults.push_back({{"spec", f.spec},
                      {"source", f.source},
                      {"fired", to_ns(f.fired)},
                      {"detected", to_ns(f.detected)},
                      {"running_again", to_ns(f.running_again)}});
  }
  j["faults"] = std::move(faults);
  return agent::json_text(j);
}

void merge_drill_part(const std::string& part, agent::RunResult& merged) {
  try {
    nlohmann::json j = nlohmann::json::parse(part);
    const WallTime start = from_ns(j.at("start").get<int64_t>());
    const size_t starts = j.at("starts").get<size_t>();
    if (merged.attempts.size() < starts) merged.attempts.resize(starts);
    if (start != WallTime{} && !merged.attempts.empty() &&
        (merged.attempts.front().start_time == WallTime{} ||
         start < merged.attempts.front().start_time)) {
      merged.attempts.front().start_time = start;
    }
    for (const nlohmann::json& f : j.at("faults")) {
      agent::FaultRecord rec;
      rec.spec = f.at("spec").get<std::string>();
      rec.source = f.at("source").get<std::string>();
      rec.fired = from_ns(f.at("fired").get<int64_t>());
      rec.detected = from_ns(f.at("detected").get<int64_t>());
      rec.running_again = from_ns(f.at("running_again").get<int64_t>());
      merged.faults.push_back(std::move(rec));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("a drill part is malformed: ") +
                             e.what());
  }
}

std::string drill_verdict(const agent::RunResult& r,
                          const std::vector<std::string>& specs, bool& passed) {
  passed = r.exit_code == 0;
  const WallTime start =
      r.attempts.empty() ? WallTime{} : r.attempts.front().start_time;
  // The job's faults, then the comm faults (DLAUNCH_COMM_FAULTS) that
  // fired inside workers, which only the run knows of.
  std::vector<std::pair<std::string, const agent::FaultRecord*>> rows;
  for (const std::string& spec : specs) {
    const agent::FaultRecord* f = nullptr;
    for (const agent::FaultRecord& rec : r.faults) {
      if (rec.source != "comm" && rec.spec == spec) f = &rec;
    }
    rows.emplace_back(spec, f);
  }
  for (const agent::FaultRecord& rec : r.faults) {
    if (rec.source == "comm") rows.emplace_back("comm " + rec.spec, &rec);
  }
  size_t width = 6;
  for (const auto& row : rows) width = std::max(width, row.first.size() + 1);
  std::ostringstream o;
  o << "\ndlaunch --drill: verdict (run " << r.run_id << ")\n";
  o << pad("fault", width) << pad("fired at", 10) << pad("detected after", 16)
    << pad("running again after", 21) << "verdict\n";
  for (const auto& [name, f] : rows) {
    if (f == nullptr) {
      passed = false;
      o << pad(name, width) << pad("-", 10) << pad("-", 16) << pad("-", 21)
        << "FAIL: never fired (its attempt or target never ran here)\n";
      continue;
    }
    std::string verdict = "ok";
    if (f->detected == WallTime{}) {
      passed = false;
      verdict = "FAIL: not detected";
    } else if (f->running_again == WallTime{}) {
      verdict = "detected; the group did not start again";
      if (r.exit_code == 0) verdict = "ok (the job ended)";
    }
    o << pad(name, width) << pad(between(start, f->fired), 10)
      << pad(between(f->fired, f->detected), 16)
      << pad(between(f->fired, f->running_again), 21) << verdict << "\n";
  }
  o << "job: exit " << r.exit_code << " after " << r.attempts.size()
    << " group start(s) (expected exit 0): "
    << (r.exit_code == 0 ? "ok" : "FAIL") << "\n";
  o << "drill: " << (passed ? "PASSED" : "FAILED") << "\n";
  return o.str();
}

}  // namespace dlaunch::launcher
