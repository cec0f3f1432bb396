// libFuzzer harness for hostfiles (launcher/hostfile.h): any text given to
// --hostfile is read as hosts with their slots, or refused with an error
// positioned in the file; never a crash or another exception type. The
// hosts that come out are named once each, with plain names and slots in
// range, and --include/--exclude of the first one apply to them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "launcher/hostfile.h"
#include "launcher/hostlist.h"
#include "launcher/hosts.h"

namespace launcher = dlaunch::launcher;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<launcher::Host> hosts;
  try {
    hosts = launcher::parse_hostfile(text, "fuzz.hosts");
  } catch (const launcher::HostsError& e) {
    // "FILE:LINE:COLUMN: hosts: ...".
    check(std::string(e.what()).rfind("fuzz.hosts:", 0) == 0);
    return 0;
  }
  std::set<std::string> names;
  for (const launcher::Host& h : hosts) {
    check(!h.name.empty() && names.insert(h.name).second);
    for (char c : h.name) check(launcher::is_host_name_char(c));
    check(h.slots >= 0 && h.slots <= (1 << 16) && h.gpus.empty());
  }
  if (hosts.empty()) return 0;
  // Selecting the first host, all of it or its GPU 0, keeps only it.
  const std::string& first = hosts.front().name;
  for (const std::vector<int>& gpus :
       {std::vector<int>{}, std::vector<int>{0}}) {
    auto kept =
        launcher::select_hosts(hosts, {{first, gpus}}, {}, /*default_slots=*/1);
    check(kept.size() == 1 && kept[0].name == first);
    check(gpus.empty() || (kept[0].gpus == gpus && kept[0].slots == 1));
  }
  try {
    auto rest = launcher::select_hosts(hosts, {}, {{first, {}}}, 1);
    check(rest.size() == hosts.size() - 1);
  } catch (const launcher::HostsError&) {
    check(hosts.size() == 1);  // nothing left to run on
  }
  return 0;
}
