#include "agent/report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <sstream>

namespace dlaunch::agent {

const WorkerRecord* RunResult::root_cause() const {
  if (attempts.empty()) return nullptr;
  const AttemptRecord& last = attempts.back();
  if (last.root_cause < 0) return nullptr;
  return &last.workers[static_cast<size_t>(last.root_cause)];
}

std::string format_time(WallTime t) {
  if (t == WallTime{}) return "";
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                t.time_since_epoch())
                .count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(ms % 1000));
  return buf;
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string read_error_bytes(const std::filesystem::path& path, bool* more) {
  if (more) *more = false;
  // Only a regular file is opened (opening a FIFO or a device may act).
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0 || !S_ISREG(before.st_mode)) {
    return "";
  }
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return "";
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    text.resize(kMaxErrorFileBytes + 1);
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
    if (got > kMaxErrorFileBytes) {
      text.resize(kMaxErrorFileBytes);
      if (more) *more = true;
    }
  }
  ::close(fd);
  return text;
}

std::string read_error_file(const std::filesystem::path& path) {
  bool more = false;
  std::string text = read_error_bytes(path, &more);
  nlohmann::json j = more ? nlohmann::json(nlohmann::json::value_t::discarded)
                          : nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    if (text.size() > kMaxErrorTextShown || more) {
      const std::string size =
          more ? "over " + std::to_string(kMaxErrorFileBytes)
               : std::to_string(text.size());
      // Not inside a UTF-8 character: the summary's JSON refuses one cut.
      size_t keep = std::min(text.size(), kMaxErrorTextShown);
      while (keep > 0 && keep < text.size() &&
             (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) {
        --keep;
      }
      text.resize(keep);
      text += "... (the first " + std::to_string(keep) + " of " + size +
              " bytes of " + path.string() + ")";
    }
    return text;
  }
  const nlohmann::json& m = j["message"];
  if (m.is_string()) return m.get<std::string>();
  if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    return m["message"].get<std::string>();
  }
  return json_text(m);
}

std::string launcher_error_json(const RunResult& result,
                                const std::string& why) {
  if (const WorkerRecord* root = result.root_cause();
      root && !root->error_file.empty()) {
    bool more = false;
    const std::string text = read_error_bytes(root->error_file, &more);
    nlohmann::json j = more || text.empty()
                           ? nlohmann::json(nlohmann::json::value_t::discarded)
                           : nlohmann::json::parse(text, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("message") &&
        j["message"].is_object()) {
      // torch's: the exit code, or minus the signal.
      if (root->status) {
        j["message"]["errorCode"] = root->status->signal != 0
                                        ? -root->status->signal
                                        : root->status->code;
      }
      return json_text(j) + "\n";
    }
  }
  nlohmann::json j;
  j["message"]["message"] = why;
  j["message"]["extraInfo"]["py_callstack"] = "";
  j["message"]["extraInfo"]["timestamp"] = std::to_string(std::time(nullptr));
  return json_text(j) + "\n";
}

namespace {

std::string log_files(const WorkerRecord& w) {
  std::string s;
  if (!w.stdout_log.empty()) s += w.stdout_log.string();
  if (!w.stderr_log.empty()) {
    if (!s.empty()) s += ", ";
    s += w.stderr_log.string();
  }
  return s;
}

std::string how_it_ended(const WorkerRecord& w) {
  if (!w.spawn_error.empty()) return "could not start: " + w.spawn_error;
  if (!w.status) return "did not exit (abandoned after SIGKILL)";
  return w.status->describe();
}

nlohmann::json worker_json(const WorkerRecord& w) {
  nlohmann::json j;
  j["local_rank"] = w.local_rank;
  j["rank"] = w.rank;
  j["pid"] = w.pid;
  j["start_time"] = format_time(w.start_time);
  j["end_time"] = format_time(w.end_time);
  if (w.status) {
    j["exit_code"] =
        w.status->signal ? nlohmann::json() : nlohmann::json(w.status->code);
    j["signal"] = w.status->signal
                      ? nlohmann::json(signal_name(w.status->signal))
                      : nlohmann::json();
  } else {
    j["exit_code"] = nullptr;
    j["signal"] = nullptr;
  }
  j["ended"] = how_it_ended(w);
  j["stopped_by_agent"] = w.stopped_by_agent;
  j["spawn_error"] = w.spawn_error;
  j["error_message"] = w.error_message;
  j["error_file"] = w.error_file.string();
  j["stdout_log"] = w.stdout_log.string();
  j["stderr_log"] = w.stderr_log.string();
  j["log_error"] = w.log_error;
  j["injected_fault"] = w.injected_fault.empty()
                            ? nlohmann::json()
                            : nlohmann::json(w.injected_fault);
  j["injected_by"] = w.injected_fault.empty() ? nlohmann::json()
                                              : nlohmann::json(w.injected_by);
  j["hung"] = w.hung;
  if (w.hung) {
    j["progress"] = w.progress;
    j["operation"] = w.operation;
  }
  return j;
}

nlohmann::json fault_json(const FaultRecord& f) {
  auto time_or_null = [](WallTime t) {
    return t == WallTime{} ? nlohmann::json() : nlohmann::json(format_time(t));
  };
  nlohmann::json j;
  j["spec"] = f.spec;
  j["action"] = f.action;
  j["source"] = f.source;
  j["attempt"] = f.attempt;
  j["pid"] = f.pid;
  j["fired"] = format_time(f.fired);
  j["detected"] = time_or_null(f.detected);
  j["running_again"] = time_or_null(f.running_again);
  return j;
}

// "stuck in all_reduce (progress 41)".
std::string hang_text(const WorkerRecord& w) {
  return "no progress within --hang-timeout: stuck in " + w.operation +
         " (progress counter " + std::to_string(w.progress) + ")";
}

}  // namespace

std::string failure_report(const RunResult& r) {
  const WorkerRecord* root = r.root_cause();
  if (root == nullptr) return "";
  const AttemptRecord& a = r.attempts.back();
  std::ostringstream o;
  o << "dlaunch: worker group failed (run " << r.run_id << ", attempt "
    << a.restart_count + 1 << " of at most " << r.max_restarts + 1 << ", "
    << a.workers.size() << " workers)\n";
  o << "  root cause (first observed failure):\n";
  o << "    time       : " << format_time(root->end_time) << "\n";
  o << "    host       : " << r.host << "\n";
  o << "    rank       : " << root->rank << " (local rank " << root->local_rank
    << ")\n";
  o << "    exit       : " << how_it_ended(*root) << "\n";
  o << "    pid        : " << root->pid << "\n";
  if (!root->injected_fault.empty()) {
    o << "    injected   : fault " << root->injected_fault
      << (root->injected_by == "comm"
              ? " (DLAUNCH_COMM_FAULTS: comm caused this failure on purpose)"
              : " (dlaunch caused this failure on purpose)")
      << "\n";
  }
  if (root->hung) o << "    hung       : " << hang_text(*root) << "\n";
  if (!root->error_message.empty()) {
    o << "    error      : " << root->error_message << "\n";
    if (!root->error_file.empty()) {
      o << "    error file : " << root->error_file.string() << "\n";
    }
  }
  std::string logs = log_files(*root);
  if (!logs.empty()) o << "    logs       : " << logs << "\n";
  if (!root->log_error.empty()) {
    o << "    log lost   : incomplete, a write failed (" << root->log_error
      << ")\n";
  }
  for (size_t i = 0; i < a.workers.size(); ++i) {
    const WorkerRecord& w = a.workers[i];
    if (static_cast<int>(i) == a.root_cause || !w.failed_on_its_own()) continue;
    o << "  also failed: rank " << w.rank << " (local rank " << w.local_rank
      << ", pid " << w.pid << "): " << (w.hung ? hang_text(w) : how_it_ended(w))
      << (w.injected_fault.empty() ? ""
                                   : " (injected: " + w.injected_fault + ")")
      << "\n";
  }
  if (!r.summary_file.empty()) {
    o << "  summary    : " << r.summary_file.string() << "\n";
  }
  return o.str();
}

nlohmann::json summary_json(const RunResult& r) {
  nlohmann::json j;
  j["run_id"] = r.run_id;
  j["host"] = r.host;
  j["exit_code"] = r.exit_code;
  j["max_restarts"] = r.max_restarts;
  j["stop_signal"] = r.stop_signal ? nlohmann::json(signal_name(r.stop_signal))
                                   : nlohmann::json();
  j["error"] = r.error;
  const WorkerRecord* root = r.root_cause();
  j["root_cause"] = root ? worker_json(*root) : nlohmann::json();
  nlohmann::json attempts = nlohmann::json::array();
  for (const AttemptRecord& a : r.attempts) {
    nlohmann::json aj;
    aj["restart_count"] = a.restart_count;
    aj["round"] = a.round;
    aj["reason"] = a.reason;
    aj["group_rank"] = a.group_rank;
    aj["members"] = a.members;
    aj["ended_by"] = a.ended_by;
    aj["master_addr"] = a.master_addr;
    aj["master_port"] = a.master_port;
    aj["start_time"] = format_time(a.start_time);
    aj["end_time"] = format_time(a.end_time);
    aj["outcome"] = a.outcome;
    aj["root_cause_local_rank"] =
        a.root_cause >= 0
            ? nlohmann::json(
                  a.workers[static_cast<size_t>(a.root_cause)].local_rank)
            : nlohmann::json();
    nlohmann::json ws = nlohmann::json::array();
    for (const WorkerRecord& w : a.workers) ws.push_back(worker_json(w));
    aj["workers"] = std::move(ws);
    attempts.push_back(std::move(aj));
  }
  j["attempts"] = std::move(attempts);
  nlohmann::json faults = nlohmann::json::array();
  for (const FaultRecord& f : r.faults) faults.push_back(fault_json(f));
  j["faults"] = std::move(faults);
  return j;
}

}  // namespace dlaunch::agent
