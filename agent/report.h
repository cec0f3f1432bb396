#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/run_record.h"

namespace dlaunch::agent {

// "2026-11-29T09:01:02.123Z".
std::string format_time(WallTime t);

// The short "root cause" block printed on stderr when the group failed:
// time, host, rank, local rank, exit code or signal, pid, the worker's
// error-file message and its log files. Empty when nothing failed.
std::string failure_report(const RunResult& result);

// `j` as JSON text (`indent` as json::dump's). A worker's error text need
// not be UTF-8: bad bytes become U+FFFD, where json::dump threw and lost
// the summary and the report.
std::string json_text(const nlohmann::json& j, int indent = -1);

// The whole run, every attempt and worker, as written to summary.json.
nlohmann::json summary_json(const RunResult& result);

// A worker's TORCHELASTIC_ERROR_FILE is read only when it is a regular
// file, never waiting (a FIFO there would hold the agent's event loop, a
// link to /dev/zero read forever), and at most this much of it.
inline constexpr size_t kMaxErrorFileBytes = size_t{1} << 20;
// What a failure report shows of text that is not torch's JSON.
inline constexpr size_t kMaxErrorTextShown = 4096;

// The first kMaxErrorFileBytes of the regular file at `path`; "" when it is
// missing or not a regular file. `more` (when given): whether it is longer.
std::string read_error_bytes(const std::filesystem::path& path,
                             bool* more = nullptr);

// Reads the message of a TORCHELASTIC_ERROR_FILE written by torch's @record
// ({"message": {"message": ..., "extraInfo": ...}} or {"message": "..."}).
// Empty when the file is missing or not a regular file; the raw text when
// it is not that JSON, its first kMaxErrorTextShown bytes and how much was
// left out.
std::string read_error_file(const std::filesystem::path& path);

// What a failed run leaves in the launcher's own TORCHELASTIC_ERROR_FILE,
// as torchrun's @record main does (TorchX and the like read it): the
// root-cause worker's error file with "errorCode" set to its status when
// that is torch's JSON, else {"message": {"message": WHY, "extraInfo":
// {"py_callstack": "", "timestamp": "SECONDS"}}}.
std::string launcher_error_json(const RunResult& result,
                                const std::string& why);

}  // namespace dlaunch::agent
