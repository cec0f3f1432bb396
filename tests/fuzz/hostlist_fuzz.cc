// libFuzzer harness for the hostlist parsers (launcher/hostlist.h,
// launcher/hosts.h): any --hosts, --include or --exclude text is expanded,
// or refused with an error naming the problem; never a crash, another
// exception type or an expansion past the host cap. Every name that comes
// out is a plain host name that expands to itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/hostlist.h"
#include "launcher/hosts.h"

namespace launcher = dlaunch::launcher;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Names out of a hostlist: non-empty, host-name characters only, and
// (each a hostlist of one host) their own expansion; the last check for
// a few of them, so a 65536-host expansion stays quick.
template <typename T, typename Name>
void check_names(const std::vector<T>& items, Name name) {
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& n = name(items[i]);
    check(!n.empty());
    for (char c : n) check(launcher::is_host_name_char(c));
    if (i < 4 || i + 4 >= items.size()) {
      auto again = launcher::expand_hostlist(n);
      check(again.size() == 1 && again[0] == n);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  // The items are the text's pieces between top-level commas.
  size_t joined = 0;
  for (std::string_view item : launcher::split_hostlist(text)) {
    joined += item.size() + 1;
  }
  check(joined == text.size() + 1);

  // A small cap reaches the limit's edge with short inputs.
  for (size_t cap : {size_t{7}, launcher::kMaxHostlistHosts}) {
    try {
      auto names = launcher::expand_hostlist(text, cap);
      check(!names.empty() && names.size() <= cap);
      check_names(names,
                  [](const std::string& n) -> const std::string& { return n; });
    } catch (const launcher::HostlistError& e) {
      check(*e.what() != '\0' && e.offset() <= text.size());
    }
  }
  try {
    auto hosts = launcher::parse_host_list(text);
    check_names(hosts, [](const launcher::Host& h) -> const std::string& {
      return h.name;
    });
    for (const launcher::Host& h : hosts) {
      check(h.slots >= 0 && h.slots <= (1 << 16) && h.gpus.empty());
    }
  } catch (const launcher::HostsError& e) {
    check(*e.what() != '\0');
  }
  try {
    auto filters = launcher::parse_host_filter(text);
    check_names(filters,
                [](const launcher::HostFilter& f) -> const std::string& {
                  return f.name;
                });
    for (const launcher::HostFilter& f : filters) {
      for (int g : f.gpus) check(g >= 0 && g <= (1 << 16));
    }
  } catch (const launcher::HostsError& e) {
    check(*e.what() != '\0');
  }
  return 0;
}
