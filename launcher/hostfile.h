#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/launch_options.h"

namespace dlaunch::launcher {

// A hostfile line or --hosts/--include/--exclude text that cannot be used:
// what() is one line naming the place ("hosts.txt:3:1: hosts: ..." for a
// file), what is wrong and the valid form.
class HostsError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Parses hostfile text: one host per line as NAME, NAME:SLOTS or NAME
// slots=SLOTS (deepspeed's and OpenMPI's form); NAME may be a hostlist
// (node[01-04] slots=8 is four hosts). '#' starts a comment; blank lines
// are skipped. A host listed twice is an error naming both lines. Throws
// HostsError positioned in `file` ("FILE:LINE:COLUMN: hosts: ...").
std::vector<Host> parse_hostfile(const std::string& text,
                                 const std::string& file);

// Reads and parses the hostfile at `path`. Throws HostsError when it
// cannot be read or parsed.
std::vector<Host> read_hostfile(const std::string& path);

}  // namespace dlaunch::launcher
