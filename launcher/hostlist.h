#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dlaunch::launcher {

// A hostlist that cannot be expanded: what() names the part, its offset
// and the valid form ("'node[3-1]': range 3-1 at offset 5 runs backwards;
// write LOW-HIGH like [1-3]").
class HostlistError : public std::invalid_argument {
 public:
  HostlistError(const std::string& message, size_t offset)
      : std::invalid_argument(message), offset_(offset) {}
  // Where in the text the problem starts (0-based).
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

// The most hosts one hostlist may expand to: a typo like node[1-99999999]
// is an error, not a gigabyte of names.
inline constexpr size_t kMaxHostlistHosts = 1 << 16;

// Expands pdsh/Slurm hostlist syntax, in order: "node[01-04],gpu7" is
// node01 node02 node03 node04 gpu7. Items are separated by commas outside
// brackets; an item is a name with any number of bracket groups, each a
// comma list of numbers and LOW-HIGH ranges ("rack[1-2]n[1,3]": the
// product, the last group varying fastest). A range keeps the width of
// LOW written with leading zeros ([08-11]: 08 09 10 11). Names use letters,
// digits, '.', '-' and '_'. Duplicates are kept (callers decide). Throws
// HostlistError for an empty text or item, an unclosed, nested, stray or
// empty bracket, a bad number or range, a bad character, or more than
// `max_hosts` hosts. Pure: no I/O, no name lookup.
std::vector<std::string> expand_hostlist(std::string_view text,
                                         size_t max_hosts = kMaxHostlistHosts);

// The top-level items of a hostlist: split at the commas outside brackets
// ("a[1,2],b" is "a[1,2]" and "b"). Does not check the items.
std::vector<std::string_view> split_hostlist(std::string_view text);

// The fields of `text` between each `sep`, empty ones kept, as views into
// `text` (a field's offset is its data() - text.data()): "a,,b" is "a",
// "", "b"; "" is one empty field. The one splitter of the host parsers
// (bracket groups, GPU lists, --include's '@' entries, Slurm's task counts).
std::vector<std::string_view> split_fields(std::string_view text, char sep);

// Whether `c` may appear in a host name outside brackets.
bool is_host_name_char(char c);

}  // namespace dlaunch::launcher
