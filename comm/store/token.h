#pragma once

// The job's store token (docs/store.md, "Authentication"): a shared secret
// every connection to a dlaunch store presents before any request. Where a
// token comes from (an environment variable, a 0600 file), what a valid one
// looks like, and how it is compared. Nothing here logs a token or puts one
// in a message.

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dlaunch::comm::store {

// Carries the job's token to agents (from the head or the user) and from an
// agent to its workers.
inline constexpr char kTokenEnv[] = "DLAUNCH_RDZV_TOKEN";
// A token is 16 to wire::kMaxTokenBytes (1024) printable, non-space ASCII
// characters.
inline constexpr size_t kMinTokenBytes = 16;

// A token that cannot be used: unreadable or unsafe file, bad form. The
// message names the source and the fix, never the token.
class TokenError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether `given` equals `expected`, in a time that depends only on the
// lengths (no early exit at the first differing byte).
bool token_matches(std::string_view expected, std::string_view given);

// Returns `token` when its form is valid; otherwise throws TokenError naming
// `source` ("DLAUNCH_RDZV_TOKEN", "token file /path").
std::string check_token(std::string token, const std::string& source);

// The token in `path`, trailing whitespace (the newline an editor or `echo`
// adds) removed. The file must be a regular file that neither group nor
// others may read or write (0600 or 0400); anything else throws TokenError
// with the chmod to run.
std::string read_token_file(const std::filesystem::path& path);

// The token in the environment value `value` (of kTokenEnv): nullopt when
// unset or empty, checked otherwise.
std::optional<std::string> token_from_env(const char* value);

// A fresh random token: 64 hex digits from the kernel's random source.
std::string random_token();

}  // namespace dlaunch::comm::store
