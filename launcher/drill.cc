#include "launcher/drill.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

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

}  // namespace

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
