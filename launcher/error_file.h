#pragma once

// dlaunch's own error file: TORCHELASTIC_ERROR_FILE in its environment (as
// TorchX starts torchrun), where a failed run leaves its root cause as
// torchrun's @record main does. An agent writes it (agent.h); these cover
// the failures outside one: the head's own errors, a remote host's failure
// (its agent's file travels through the head's store), the pre-flight.

#include <map>
#include <string>

#include "agent/run_record.h"

namespace dlaunch::launcher {

// Set by a multi-host head for every agent: KEY, under which a failed
// agent leaves its HostFailure in the head's store as KEY/HOST.
inline constexpr char kErrorKeyEnv[] = "DLAUNCH_ERROR_KEY";

// What a failed agent tells the head: its status, when its own root-cause
// worker failed ("" when another node's failure ended it: the head then
// looks for that node's) and in which rendezvous round, and the text of its
// error file ("" if none).
struct HostFailure {
  int code = 1;
  std::string root_time;  // format_time(): sorts as text
  int round = 0;          // of root_time
  std::string error_text;
};
// What the agent that returned `result` (failed, not stopped by a signal)
// tells: its root-cause worker's code and end, else its own exit code.
HostFailure failure_of(const agent::RunResult& result, std::string error_text);
std::string encode_host_failure(const HostFailure& f);
// Throws std::runtime_error on text that is not one.
HostFailure decode_host_failure(const std::string& text);
// The host of `told` (host -> what its agent told) whose own worker failed
// first in the latest round any did: the job's root cause. An elastic job
// goes on without hosts that failed in earlier rounds, so the round that
// ended it ranks first; within it, the earliest failure. "" when no host's
// own worker failed.
std::string root_cause_host(const std::map<std::string, HostFailure>& told);

// Notes `text`, an error dlaunch printed, as the one to leave should no
// agent or host leave one: the first noted, unless `replace` (later lines
// tend to be the teardown's); warnings and notes are not noted.
void note_error(const std::string& text, bool replace = false);
// Writes `json` (a whole error file) to the file, when there is one, and
// counts it as left.
void write_error_file(const std::string& json);
// An agent of this process wrote the file (it failed).
void error_file_left();
// For a run that ended with `code`: when not 0 and no error file was left,
// writes the last noted error (else "dlaunch: exit CODE").
void leave_error_file(int code);

}  // namespace dlaunch::launcher
