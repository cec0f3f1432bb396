#include "launcher/error_file.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "agent/posix_env.h"
#include "agent/report.h"

namespace dlaunch::launcher {
namespace {

std::mutex mu;
std::string last_error;  // under mu
bool left = false;       // under mu

}  // namespace

HostFailure failure_of(const agent::RunResult& result, std::string error_text) {
  const agent::WorkerRecord* root = result.root_cause();
  return {.code = root && root->status ? root->status->shell_code()
                                       : result.exit_code,
          .root_time = root ? agent::format_time(root->end_time) : "",
          .round = result.attempts.empty() ? 0 : result.attempts.back().round,
          .error_text = std::move(error_text)};
}

std::string encode_host_failure(const HostFailure& f) {
  nlohmann::json j;
  j["code"] = f.code;
  j["root_time"] = f.root_time;
  j["round"] = f.round;
  j["error_text"] = f.error_text;
  return agent::json_text(j);
}

HostFailure decode_host_failure(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("code") ||
      !j["code"].is_number_integer() ||
      !j.value("root_time", nlohmann::json()).is_string() ||
      !j.value("round", nlohmann::json()).is_number_integer() ||
      !j.value("error_text", nlohmann::json()).is_string()) {
    throw std::runtime_error("not a host's failure record: " +
                             text.substr(0, 80));
  }
  return {.code = j["code"].get<int>(),
          .root_time = j["root_time"].get<std::string>(),
          .round = j["round"].get<int>(),
          .error_text = j["error_text"].get<std::string>()};
}

std::string root_cause_host(const std::map<std::string, HostFailure>& told) {
  std::string host;
  const HostFailure* root = nullptr;
  for (const auto& [h, f] : told) {
    if (f.root_time.empty()) continue;
    if (root == nullptr || f.round > root->round ||
        (f.round == root->round && f.root_time < root->root_time)) {
      root = &f;
      host = h;
    }
  }
  return host;
}

void note_error(const std::string& text, bool replace) {
  if (text.find("dlaunch: warning:") != std::string::npos ||
      text.find("dlaunch: note:") != std::string::npos) {
    return;
  }
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  if (t.empty()) return;
  std::lock_guard<std::mutex> lock(mu);
  if (replace || last_error.empty()) last_error = t;
}

void write_error_file(const std::string& json) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  {
    std::lock_guard<std::mutex> lock(mu);
    left = true;
  }
  if (path == nullptr || *path == '\0') return;
  std::ofstream out(path, std::ios::trunc);
  out << json;
  out.close();
  static std::atomic<bool> warned{false};
  if (!out && !warned.exchange(true)) {
    agent::write_all(STDERR_FILENO,
                     std::string("dlaunch: warning: cannot write "
                                 "TORCHELASTIC_ERROR_FILE ") +
                         path + ": " + std::strerror(errno) + "\n");
  }
}

void error_file_left() {
  std::lock_guard<std::mutex> lock(mu);
  left = true;
}

void leave_error_file(int code) {
  if (code == 0) return;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (left) return;
    why = last_error.empty() ? "dlaunch: exit " + std::to_string(code)
                             : last_error;
  }
  write_error_file(agent::launcher_error_json(agent::RunResult{}, why));
}

}  // namespace dlaunch::launcher
