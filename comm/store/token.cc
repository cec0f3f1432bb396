#include "comm/store/token.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "comm/store/text.h"
#include "comm/store/wire.h"

namespace dlaunch::comm::store {

bool token_matches(std::string_view expected, std::string_view given) {
  // Every byte of `expected` is compared whatever the others hold; volatile
  // keeps the compiler from turning the loop into an early exit.
  volatile unsigned char diff = expected.size() == given.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i])
                                       : static_cast<unsigned char>(0);
    diff = diff | (static_cast<unsigned char>(expected[i]) ^ g);
  }
  return diff == 0;
}

std::string check_token(std::string token, const std::string& source) {
  const std::string fix =
      "; use 16 to 1024 printable characters without spaces, e.g. the "
      "output of `openssl rand -hex 32`";
  if (token.size() < kMinTokenBytes || token.size() > wire::kMaxTokenBytes) {
    throw TokenError("the store token in " + source + " has " +
                     std::to_string(token.size()) + " characters" + fix);
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      throw TokenError("the store token in " + source +
                       " holds a space or a non-printable character" + fix);
    }
  }
  return token;
}

std::string read_token_file(const std::filesystem::path& path) {
  const std::string source = "token file " + path.string();
  // O_NOFOLLOW-free on purpose: a link to a safe file is fine; what is
  // checked is the file that is read (fstat of the open descriptor).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw TokenError("cannot read " + source + ": " + errno_text(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw TokenError("cannot read " + source + ": " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw TokenError(source + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    throw TokenError(source + " has mode " + mode +
                     ": group or others may read or change it; run chmod 600 " +
                     path.string());
  }
  std::string text;
  char buf[512];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw TokenError("cannot read " + source + ": " + errno_text(errno));
    }
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 2 * wire::kMaxTokenBytes) break;  // reported below
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' ||
                           text.back() == ' ' || text.back() == '\t')) {
    text.pop_back();
  }
  return check_token(std::move(text), source);
}

std::optional<std::string> token_from_env(const char* value) {
  if (!value || !*value) return std::nullopt;
  return check_token(value, kTokenEnv);
}

std::string random_token() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw TokenError("cannot make a store token: getrandom: " +
                       errno_text(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  return token;
}

}  // namespace dlaunch::comm::store
