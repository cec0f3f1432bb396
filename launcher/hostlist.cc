#include "launcher/hostlist.h"

#include <cctype>
#include <charconv>

namespace dlaunch::launcher {
namespace {

constexpr std::string_view kForm =
    "; write NAME or NAME[LIST] where LIST is numbers and LOW-HIGH ranges, "
    "like node[01-04,07],gpu7";

// One bracket group as the numbers it stands for, already formatted.
using Group = std::vector<std::string>;

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// Parses `text` (the inside of one bracket group, starting at `base` in
// the whole hostlist) into its numbers.
Group parse_group(std::string_view whole, std::string_view text, size_t base,
                  size_t max_hosts) {
  if (text.empty()) {
    throw HostlistError(quoted(whole) + ": empty brackets at offset " +
                            std::to_string(base - 1) + kForm.data(),
                        base - 1);
  }
  Group out;
  for (std::string_view part : split_fields(text, ',')) {
    const size_t at = base + static_cast<size_t>(part.data() - text.data());
    auto fail = [&](const std::string& what) {
      throw HostlistError(quoted(whole) + ": " + what + " at offset " +
                              std::to_string(at) + kForm.data(),
                          at);
    };
    if (part.empty()) fail("an empty element in brackets");
    size_t dash = part.find('-');
    std::string_view lo = part.substr(0, dash);
    std::string_view hi =
        dash == std::string_view::npos ? lo : part.substr(dash + 1);
    auto digits = [](std::string_view s) {
      if (s.empty() || s.size() > 18) return false;
      for (char c : s) {
        if (!std::isdigit(static_cast<unsigned char>(c))) return false;
      }
      return true;
    };
    if (!digits(lo) || !digits(hi)) {
      fail(quoted(part) + " is not a number or a LOW-HIGH range");
    }
    unsigned long long a = 0, b = 0;
    std::from_chars(lo.data(), lo.data() + lo.size(), a);
    std::from_chars(hi.data(), hi.data() + hi.size(), b);
    if (a > b) {
      fail("range " + quoted(part) + " runs backwards");
    }
    if (b - a >= max_hosts || out.size() + (b - a + 1) > max_hosts) {
      fail("range " + quoted(part) + " has more than " +
           std::to_string(max_hosts) + " hosts");
    }
    // Slurm's rule: LOW's written width, leading zeros included.
    const size_t width = lo.size();
    for (unsigned long long n = a; n <= b; ++n) {
      std::string s = std::to_string(n);
      if (s.size() < width) s.insert(0, width - s.size(), '0');
      out.push_back(std::move(s));
    }
  }
  return out;
}

// Expands one item (no top-level commas) starting at `base`.
void expand_item(std::string_view whole, std::string_view item, size_t base,
                 size_t max_hosts, std::vector<std::string>& out) {
  if (item.empty()) {
    throw HostlistError(quoted(whole) + ": an empty host name at offset " +
                            std::to_string(base) + kForm.data(),
                        base);
  }
  // ssh and pdsh would take such a name for an option (-F.evil reads a
  // config file); no host name starts with one (RFC 1123).
  if (item.front() == '-') {
    throw HostlistError(quoted(whole) + ": a host name at offset " +
                            std::to_string(base) +
                            " starts with '-' (ssh would take it for an "
                            "option); host names start with a letter or "
                            "digit",
                        base);
  }
  // The item as literal text pieces and groups, alternating: text[0]
  // group[0] text[1] group[1] ... text[n].
  std::vector<std::string_view> texts;
  std::vector<Group> groups;
  size_t total = 1;  // hosts the groups so far make
  auto too_many = [&] {
    return HostlistError(
        quoted(whole) + ": more than " + std::to_string(max_hosts) + " hosts",
        base);
  };
  size_t pos = 0;
  size_t piece = 0;
  while (pos < item.size()) {
    char c = item[pos];
    if (c == '[') {
      size_t close = item.find(']', pos);
      size_t nested = item.find('[', pos + 1);
      if (close == std::string_view::npos) {
        throw HostlistError(quoted(whole) + ": '[' at offset " +
                                std::to_string(base + pos) +
                                " is never closed" + kForm.data(),
                            base + pos);
      }
      if (nested < close) {
        throw HostlistError(quoted(whole) + ": nested '[' at offset " +
                                std::to_string(base + nested) + kForm.data(),
                            base + nested);
      }
      texts.push_back(item.substr(piece, pos - piece));
      groups.push_back(parse_group(whole, item.substr(pos + 1, close - pos - 1),
                                   base + pos + 1, max_hosts));
      // Checked group by group: many large groups must fail at the second,
      // not after every one of them was built.
      if (groups.back().size() > (max_hosts - out.size()) / total) {
        throw too_many();
      }
      total *= groups.back().size();
      pos = close + 1;
      piece = pos;
      continue;
    }
    if (c == ']') {
      throw HostlistError(quoted(whole) + ": ']' at offset " +
                              std::to_string(base + pos) +
                              " has no '[' before it" + kForm.data(),
                          base + pos);
    }
    if (!is_host_name_char(c)) {
      std::string shown =
          std::isprint(static_cast<unsigned char>(c))
              ? quoted(std::string(1, c))
              : "byte " + std::to_string(static_cast<unsigned char>(c));
      throw HostlistError(quoted(whole) + ": " + shown + " at offset " +
                              std::to_string(base + pos) +
                              " is not allowed in a host name (letters, "
                              "digits, '.', '-', '_')",
                          base + pos);
    }
    ++pos;
  }
  texts.push_back(item.substr(piece));
  if (out.size() + 1 > max_hosts) throw too_many();  // a name, no groups
  // Odometer over the groups, the last one fastest.
  std::vector<size_t> idx(groups.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    std::string name(texts[0]);
    for (size_t g = 0; g < groups.size(); ++g) {
      name += groups[g][idx[g]];
      name += texts[g + 1];
    }
    out.push_back(std::move(name));
    for (size_t g = groups.size(); g-- > 0;) {
      if (++idx[g] < groups[g].size()) break;
      idx[g] = 0;
    }
  }
}

}  // namespace

bool is_host_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
         c == '_';
}

std::vector<std::string_view> split_fields(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t at; (at = text.find(sep, start)) != std::string_view::npos;
       start = at + 1) {
    out.push_back(text.substr(start, at - start));
  }
  out.push_back(text.substr(start));
  return out;
}

std::vector<std::string_view> split_hostlist(std::string_view text) {
  std::vector<std::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') ++depth;
    if (text[i] == ']' && depth > 0) --depth;
    if (text[i] == ',' && depth == 0) {
      items.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  items.push_back(text.substr(start));
  return items;
}

std::vector<std::string> expand_hostlist(std::string_view text,
                                         size_t max_hosts) {
  if (text.empty()) {
    throw HostlistError(
        "the hostlist is empty; name at least one host, like node[01-04]", 0);
  }
  std::vector<std::string> out;
  size_t base = 0;
  for (std::string_view item : split_hostlist(text)) {
    expand_item(text, item, base, max_hosts, out);
    base += item.size() + 1;
  }
  return out;
}

}  // namespace dlaunch::launcher
