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

// The whole run, every attempt and worker, as written to summary.json.
nlohmann::json summary_json(const RunResult& result);

// Reads the message of a TORCHELASTIC_ERROR_FILE written by torch's @record
// ({"message": {"message": ..., "extraInfo": ...}} or {"message": "..."}).
// Empty when the file is missing; the raw text when it is not that JSON.
std::string read_error_file(const std::filesystem::path& path);

// What a failed run leaves in the launcher's own TORCHELASTIC_ERROR_FILE,
// as torchrun's @record main does (TorchX and the like read it): the
// root-cause worker's error file with "errorCode" set to its status when
// that is torch's JSON, else {"message": {"message": WHY, "extraInfo":
// {"py_callstack": "", "timestamp": "SECONDS"}}}.
std::string launcher_error_json(const RunResult& result,
                                const std::string& why);

}  // namespace dlaunch::agent
