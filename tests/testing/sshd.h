#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dlaunch::testing {

// An sshd of the test's own on a free port of the given loopback
// addresses (each a "host"), with a generated host key and client key
// (no passwords, no PAM). Owned by one test; the destructor stops it.
// available() is false, with a reason, where sshd or ssh-keygen is absent.
class TestSshd {
 public:
  explicit TestSshd(const std::vector<std::string>& addresses);
  ~TestSshd();

  bool available() const { return sshd_ != nullptr; }
  // Why it is not available; empty when it is.
  const std::string& why_not() const { return why_not_; }
  int port() const { return port_; }
  // The ssh options that reach it non-interactively with the test's key:
  // the text for --ssh-args.
  std::string ssh_args() const;

 private:
  TempDir dir_{"dlaunch-sshd"};
  int port_ = 0;
  std::string why_not_;
  std::unique_ptr<Subprocess> sshd_;
};

}  // namespace dlaunch::testing
