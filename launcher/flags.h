#pragma once

#include <charconv>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/worker_env.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// How a flag's value is written. The YAML loader checks a key's node
// against it (a list may be a YAML sequence, a map a YAML mapping) and
// --print-config writes the value back in the same form.
enum class ValueType {
  kSwitch,    // no value on the command line; true/false in a file
  kInt,       // an integer, or one of `choices`
  kSeconds,   // a duration in seconds: finite, > 0, <= max_seconds
  kString,    // text, or one of `choices` when there are any
  kPath,      // a file or folder; relative paths in a file resolve against
              // the file's folder
  kCommand,   // a program: a bare name is looked up in PATH, a path with a
              // '/' resolves like kPath
  kList,      // comma-separated on the command line, a sequence in a file
  kMap,       // K=V,... on the command line, a mapping in a file
  kRepeated,  // items that may hold commas (-x A -x 'B=1,2'): one per
              // occurrence on the command line, joined by '\n' from a file's
              // sequence and in print(); used with `repeatable`
};

// A value a flag rejects. `message` names the value and the valid forms
// but not the flag: the caller prefixes the flag ("--term-timeout") or the
// file position ("job.yaml:3:15: term_timeout").
struct BadValue {
  std::string message;
  // When set, the value the message is about, written right after the
  // flag instead ("--nproc-per-node gpu: cannot count CUDA devices: ...").
  std::string about = {};
};

// Parses all of `s` as a number (std::from_chars); false when any of it is
// not one.
template <typename T>
bool parse_number(const std::string& s, T& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// "NOUN LO..HI" ("a port 1..65535"; "LO..HI" without a noun): the range
// of a message, written from the bounds the value is checked against.
inline std::string range_text(std::string_view noun, long long lo,
                              long long hi) {
  return std::string(noun) + (noun.empty() ? "" : " ") + std::to_string(lo) +
         ".." + std::to_string(hi);
}

// Parses all of `s` as an int within lo..hi; false otherwise.
inline bool parse_in_range(const std::string& s, int lo, int hi, int& out) {
  return parse_number(s, out) && out >= lo && out <= hi;
}

// The most slots (workers) one host may have: a hostfile's slots=, a host
// list's NAME:SLOTS, --nproc-per-node.
inline constexpr int kMaxSlots = 1 << 16;

// The largest duration any flag or key accepts, and its words for messages.
inline constexpr double kMaxSeconds = 7 * 24 * 3600.0;
inline constexpr std::string_view kMaxSecondsText = "604800 (7 days)";

// One flag of `dlaunch`, defined once: the command-line parser, `--help`,
// the PET_* fallbacks, the YAML job loader and --print-config all read the
// table of these (flags()); a man page or shell completion can be generated
// from it. Plain data with two function pointers; the table is immutable.
struct FlagSpec {
  // Dash name without "--": "nproc-per-node". --NAME and, when different,
  // --NAME_WITH_UNDERSCORES are its spellings.
  std::string_view name = {};
  // Further spellings, dashes included: {"-m"}, {"--run-id", "--run_id"}.
  std::vector<std::string_view> aliases = {};
  // What follows the flag in --help: "N|cpu|gpu|auto"; empty for switches.
  std::string_view placeholder = {};
  ValueType type = ValueType::kString;
  // An action (--help, --version, --config, --dry-run, --print-config)
  // says what to do with the job rather than configuring it: it has no
  // key, no PET_* variable, and comes from the command line only.
  bool action = false;
  // Key in a YAML job file ("nproc_per_node"); its PET_* variable is
  // PET_ + the key in capitals. Every flag that is not an action has one
  // (tests/agent/cli_test.cc checks).
  std::string_view key = {};
  // The default as --help shows it; empty when there is none to show.
  std::string_view default_text = {};
  // The --help paragraph, one sentence or a few, unwrapped.
  std::string_view help = {};
  // The --help section: "WORKERS", "PROGRAMS", "OUTPUT", "SIGNALS",
  // "RENDEZVOUS", "HOSTS", "JOB FILES".
  std::string_view section = {};
  // The literal values it accepts besides numbers (completion, YAML type
  // checks): {"cpu", "gpu", "auto"}; empty when free-form.
  std::vector<std::string_view> choices = {};
  // kSeconds: the largest value accepted.
  double max_seconds = kMaxSeconds;
  // kList or kRepeated: the flag may be given more than once, and its sources
  // add up instead of the first one found winning: the job file's items, then
  // PET_<KEY>'s, then DLAUNCH_<KEY>'s, then each occurrence on the command
  // line; apply() runs once per source, appending.
  bool repeatable = false;
  // Parses `value` (a switch's is "1"/"true"/"0"/"false") into `options`;
  // throws BadValue. `env` is the launching environment (for
  // --nproc-per-node gpu). Null for actions.
  void (*apply)(const FlagSpec& self, const std::string& value,
                LaunchOptions& options, const agent::EnvMap& env) = nullptr;
  // The effective value as text in the command-line form (lists
  // comma-separated, maps K=V,...); nullopt when it has none to write.
  // Null for actions.
  std::optional<std::string> (*print)(const LaunchOptions& options) = nullptr;
};

// Every flag, in --help order.
const std::vector<FlagSpec>& flags();

// The spellings of `flag`: "--NAME", "--NAME_UNDERSCORED" when different,
// then its aliases.
std::vector<std::string> spellings(const FlagSpec& flag);

// PET_ + the key in capitals ("PET_NPROC_PER_NODE"); empty for actions.
std::string pet_variable(const FlagSpec& flag);

// The flag whose YAML key or dash name is `key_or_name`; nullptr if none.
const FlagSpec* find_flag(std::string_view key_or_name);

// True for "1", "true", "True", "TRUE", "yes", "on" (switch values);
// false for "0", "false", "no", "off", "". Throws BadValue otherwise.
bool parse_switch(const std::string& value);

// A duration of `flag`: finite, > 0 and <= flag.max_seconds. Throws
// BadValue naming the value and the range.
std::chrono::milliseconds parse_duration(const FlagSpec& flag,
                                         const std::string& value);

// Checks the rendezvous flags together, once every flag is applied (static
// needs --node-rank, c10d across nodes needs --rdzv-endpoint, ...), and
// fills what follows from them (static's endpoint, the agent's rendezvous
// timeout). Throws BadValue with the whole message.
void check_rendezvous(LaunchOptions& options);

// Checks the HOSTS flags together once every flag is applied: one host
// source, --include/--exclude over it, launcher settings that need hosts;
// with --launcher slurm the hosts come from the allocation in `env`
// (slurm.h). Throws BadValue with the whole message.
void check_hosts(LaunchOptions& options, const agent::EnvMap& env);

// Splits `text` into words as a POSIX shell would ("-o 'A B'" is two
// words), without expansions. Throws BadValue for an unclosed quote.
std::vector<std::string> split_words(const std::string& text);

// "0.5", "30": seconds as the shortest text that reads back the same.
std::string format_seconds(std::chrono::milliseconds d);

// Whether the --rdzv-conf key `key` names a file (token_file, cacert, cert,
// key, password_file): a job file resolves it against its folder, and a
// printed job writes it absolute.
bool is_rdzv_conf_path(std::string_view key);

// Whether `name` is a shell variable name: letters, digits and _, not
// starting with a digit (what --export, --env-file and a job file's env
// and ${NAME} accept).
bool is_variable_name(std::string_view name);

}  // namespace dlaunch::launcher
