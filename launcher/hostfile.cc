#include "launcher/hostfile.h"

#include <map>
#include <sstream>

#include "launcher/flags.h"
#include "launcher/hostlist.h"
#include "launcher/read_text.h"

namespace dlaunch::launcher {

std::vector<Host> parse_hostfile(const std::string& text,
                                 const std::string& file) {
  std::vector<Host> hosts;
  std::map<std::string, int> line_of;  // host -> the line that named it
  std::istringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    auto fail = [&](const std::string& what) {
      throw HostsError(file + ":" + std::to_string(line_no) + ":" +
                       std::to_string(start + 1) + ": hosts: " + what);
    };
    std::istringstream words(line.substr(start));
    std::string word, more;
    words >> word;
    std::string name = word;
    std::string slots;
    if (size_t colon = word.rfind(':'); colon != std::string::npos) {
      name = word.substr(0, colon);
      slots = word.substr(colon + 1);
      if (slots.empty()) fail("'" + word + "' has no slots after ':'");
    }
    if (words >> more) {
      if (more.rfind("slots=", 0) != 0 || !slots.empty()) {
        fail("'" + more +
             "' is not valid; write NAME, NAME:SLOTS or NAME slots=SLOTS");
      }
      slots = more.substr(6);
      if (slots.empty()) fail("'slots=' has no number; write slots=8");
    }
    if (words >> more) {
      fail("'" + more + "' is extra; write one host per line");
    }
    int n = 0;
    if (!slots.empty() && !parse_in_range(slots, 1, kMaxSlots, n)) {
      fail("'" + slots + "' slots for " + name + " is not valid; use " +
           range_text("a number", 1, kMaxSlots));
    }
    std::vector<std::string> names;
    try {
      names = expand_hostlist(name);
    } catch (const HostlistError& e) {
      fail(e.what());
    }
    if (hosts.size() + names.size() > kMaxHostlistHosts) {
      fail("more than " + std::to_string(kMaxHostlistHosts) +
           " hosts in all; list fewer hosts");
    }
    for (std::string& h : names) {
      if (auto [it, fresh] = line_of.emplace(h, line_no); !fresh) {
        fail("'" + h + "' is listed twice (first on line " +
             std::to_string(it->second) +
             "); list each host once, with its slots");
      }
      hosts.push_back(Host{.name = std::move(h), .slots = n});
    }
  }
  return hosts;
}

std::vector<Host> read_hostfile(const std::string& path) {
  // Its flag or key is the caller's to name.
  const std::string text = read_text<HostsError>(
      path, "", "give a readable file with one host per line");
  std::vector<Host> hosts = parse_hostfile(text, path);
  // Running on this node alone instead would hide a wrong file.
  if (hosts.empty()) {
    throw HostsError("'" + path +
                     "' lists no host; write one host per line (NAME, "
                     "NAME:SLOTS or NAME slots=SLOTS)");
  }
  return hosts;
}

}  // namespace dlaunch::launcher
