#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// A place in a job file, for messages: "job.yaml:3:15" (1-based).
struct FilePos {
  std::string file;  // as the user named it
  int line = 1;
  int column = 1;
  std::string text() const;
};

// A job file that cannot be used: `what()` is one line starting with
// "FILE:LINE:COLUMN: " that names the key, what is wrong and the fix.
class JobFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One flag's key in a job file, as its flag would take it on the command
// line (lists comma-separated, maps K=V,...), with `${VAR}`s expanded and
// relative paths resolved against the file's folder.
struct FileSetting {
  std::string value;
  FilePos pos;
};

// What a YAML job file says, checked for form: known keys (with a "did
// you mean" for unknown ones), types, `${VAR}`s, hosts. The values of flag
// keys are checked later by the flag table, after PET_* variables and
// flags are laid over them (launcher/cli.cc). Plain data.
struct JobFile {
  std::filesystem::path path;  // absolute
  FilePos top;                 // the file's first line, for whole-file errors
  // By flag name ("max-restarts"); only keys the file sets.
  std::map<std::string, FileSetting, std::less<>> settings;
  std::optional<FileSetting> program;  // resolved when it has a '/'
  std::optional<std::vector<std::string>> args;
  std::map<std::string, std::string> env;
  std::vector<Host> hosts;
};

// Reads and checks `path` ("job.yaml" as the user wrote it), given by
// `flag` (named when the file cannot be read). `env` is the launching
// environment, for `${VAR}` and `${VAR:-default}`. Throws JobFileError.
JobFile load_job_file(const std::string& path, const agent::EnvMap& env,
                      const std::string& flag = "--config");

// Whether an environment variable's name says it holds a secret, by its
// words between '_': one ending in TOKEN, one holding PASSWORD, PASSWD,
// SECRET or CREDENTIAL, or AUTH, PASS, PAT, APIKEY, a PWD not alone, and
// API/ACCESS/PRIVATE/SECRET followed by KEY (SSH_AUTH_SOCK is none): its
// value is never printed or written; --print-config and job.yaml write
// `${NAME}` instead.
bool is_secret_name(const std::string& name);

}  // namespace dlaunch::launcher
