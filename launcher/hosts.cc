#include "launcher/hosts.h"

#include <algorithm>
#include <map>
#include <set>

#include "launcher/flags.h"
#include "launcher/hostlist.h"

namespace dlaunch::launcher {
namespace {

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// `name` expanded, `so_far` hosts having come before it: each item is
// capped on its own, so the whole text is held to the same cap here.
std::vector<std::string> expand(std::string_view whole, std::string_view name,
                                size_t so_far) {
  std::vector<std::string> names;
  try {
    names = expand_hostlist(name);
  } catch (const HostlistError& e) {
    throw HostsError(whole == name ? std::string(e.what())
                                   : quoted(whole) + ": " + e.what());
  }
  if (so_far + names.size() > kMaxHostlistHosts) {
    throw HostsError(quoted(whole) + ": more than " +
                     std::to_string(kMaxHostlistHosts) +
                     " hosts in all; name fewer hosts");
  }
  return names;
}

}  // namespace

std::vector<Host> parse_host_list(std::string_view text) {
  if (text.empty()) {
    throw HostsError(
        "the host list is empty; name hosts like node[01-04]:8,gpu7");
  }
  std::vector<Host> hosts;
  std::set<std::string> seen;
  for (std::string_view item : split_hostlist(text)) {
    std::string_view name = item;
    int slots = 0;
    if (size_t colon = item.rfind(':'); colon != std::string_view::npos) {
      name = item.substr(0, colon);
      std::string n(item.substr(colon + 1));
      if (!parse_in_range(n, 1, kMaxSlots, slots)) {
        throw HostsError(quoted(item) + ": '" + n +
                         "' is not a slot count; write NAME:SLOTS with " +
                         range_text("", 1, kMaxSlots) +
                         " slots, like node[01-04]:8");
      }
    }
    if (name.empty()) {
      throw HostsError(quoted(text) +
                       ": an empty host name; name hosts like "
                       "node[01-04]:8,gpu7");
    }
    for (std::string& h : expand(text, name, hosts.size())) {
      if (!seen.insert(h).second) {
        throw HostsError(quoted(text) + ": '" + h +
                         "' is listed twice; list each host once (give "
                         "NAME:SLOTS for more workers on it)");
      }
      hosts.push_back(Host{.name = std::move(h), .slots = slots});
    }
  }
  return hosts;
}

std::vector<HostFilter> parse_host_filter(std::string_view text) {
  const std::string form =
      "; write NAME or NAME:GPU,GPU,... separated by '@', like "
      "node01:0,2@node02";
  if (text.empty()) throw HostsError("it is empty" + form);
  std::vector<HostFilter> out;
  for (std::string_view entry : split_fields(text, '@')) {
    if (entry.empty()) {
      throw HostsError(quoted(text) + ": an empty entry" + form);
    }
    std::string_view name = entry;
    std::vector<int> gpus;
    if (size_t colon = entry.find(':'); colon != std::string_view::npos) {
      name = entry.substr(0, colon);
      for (std::string_view field :
           split_fields(entry.substr(colon + 1), ',')) {
        std::string n(field);
        int g = 0;
        if (!parse_number(n, g) || g < 0 || g > (1 << 16)) {
          throw HostsError(quoted(entry) + ": '" + n +
                           "' is not a GPU index (0, 1, ...)" + form);
        }
        if (std::find(gpus.begin(), gpus.end(), g) != gpus.end()) {
          throw HostsError(quoted(entry) + ": GPU " + n +
                           " is named twice; name it once");
        }
        gpus.push_back(g);
      }
    }
    if (name.empty()) {
      throw HostsError(quoted(entry) + ": no host name before ':'" + form);
    }
    for (std::string& h : expand(text, name, out.size())) {
      out.push_back(HostFilter{std::move(h), gpus});
    }
  }
  return out;
}

std::string gpu_list(const std::vector<int>& gpus) {
  std::string out;
  for (int g : gpus) out += (out.empty() ? "" : ",") + std::to_string(g);
  return out;
}

std::vector<Host> select_hosts(std::vector<Host> hosts,
                               const std::vector<HostFilter>& include,
                               const std::vector<HostFilter>& exclude,
                               int default_slots) {
  if (!include.empty() && !exclude.empty()) {
    throw HostsError(
        "--include and --exclude cannot be used together; keep one");
  }
  if (include.empty() && exclude.empty()) return hosts;
  const bool keep = !include.empty();
  const char* flag = keep ? "--include" : "--exclude";
  std::map<std::string, const HostFilter*> named;
  for (const HostFilter& f : keep ? include : exclude) {
    auto it = std::find_if(hosts.begin(), hosts.end(),
                           [&](const Host& h) { return h.name == f.name; });
    if (it == hosts.end()) {
      throw HostsError(std::string(flag) + ": '" + f.name +
                       "' is not one of the job's hosts (--hosts or "
                       "--hostfile); name a host listed there");
    }
    if (!named.emplace(f.name, &f).second) {
      throw HostsError(std::string(flag) + ": '" + f.name +
                       "' is named twice; name each host once");
    }
    const int slots = it->slots > 0 ? it->slots : default_slots;
    if (slots <= 0 && !f.gpus.empty()) {
      throw HostsError(
          std::string(flag) + ": " + f.name + ":" + gpu_list(f.gpus) + ": " +
          f.name +
          " has no slots given and --nproc-per-node gives no GPU count here "
          "(auto or cpu, or gpu on a machine without GPUs), so its GPU "
          "indices cannot be checked; give its slots (" +
          f.name + ":N in --hosts, slots=N in the hostfile)");
    }
    for (int g : f.gpus) {
      if (g >= slots) {
        throw HostsError(std::string(flag) + ": " + f.name + ":" +
                         std::to_string(g) + ": " + f.name + " has " +
                         std::to_string(slots) + " slot(s), GPUs 0.." +
                         std::to_string(slots - 1));
      }
    }
  }
  std::vector<Host> out;
  for (Host& h : hosts) {
    auto it = named.find(h.name);
    const bool listed = it != named.end();
    if (keep != listed && !(listed && !it->second->gpus.empty())) continue;
    if (listed && !it->second->gpus.empty()) {
      const int slots = h.slots > 0 ? h.slots : default_slots;
      std::vector<int> gpus;
      if (keep) {
        gpus = it->second->gpus;
        std::sort(gpus.begin(), gpus.end());
      } else {
        for (int g = 0; g < slots; ++g) {
          const auto& drop = it->second->gpus;
          if (std::find(drop.begin(), drop.end(), g) == drop.end()) {
            gpus.push_back(g);
          }
        }
        if (gpus.empty()) continue;  // every GPU excluded: the whole host
      }
      h.gpus = std::move(gpus);
      h.slots = static_cast<int>(h.gpus.size());
    }
    out.push_back(std::move(h));
  }
  if (out.empty()) {
    throw HostsError(std::string(flag) +
                     " leaves no host to run on; keep at least one");
  }
  return out;
}

}  // namespace dlaunch::launcher
