#include "launcher/ship.h"

#include <elf.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>

#include "agent/watchdog_loop.h"
#include "launcher/command_runner.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;

// The last non-empty line of `text`, for one-line reasons.
std::string last_line(const std::string& text) {
  std::string last;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    if (nl > pos) last = text.substr(pos, nl - pos);
    pos = nl + 1;
  }
  return last;
}

constexpr char kCacheRoot[] = "${XDG_CACHE_HOME:-$HOME/.cache}/dlaunch";

// Shell code that sets $d to the cache root and defines `private DIR`,
// which fails, naming the fix, when DIR exists and is not the user's
// alone; then checks the root and the folder `name`. Nothing in a
// folder that others can write runs: they could have put anything there.
std::string cache_guard(const std::string& name) {
  return std::string("d=\"") + kCacheRoot +
         "\" && private() { if [ -L \"$1\" ] || { [ -e \"$1\" ] && { [ ! -O "
         "\"$1\" ] || case $(ls -ld \"$1\") in ?????w*|????????w*) true;; "
         "*) false;; esac; }; }; then echo \"dlaunch: the cache folder $1 is "
         "not private (another user's, group- or world-writable, or a link): "
         "a dlaunch there could be anyone's; if it is yours, chmod 700 $1, "
         "else remove it or set XDG_CACHE_HOME elsewhere\" >&2; exit 3; fi; "
         "} && private \"$d\" && private \"$d/" +
         name + "\"";
}

}  // namespace

std::string why_not_shippable(const fs::path& exe) {
  std::ifstream in(exe, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!in.read(reinterpret_cast<char*>(&eh), sizeof eh) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return exe.string() + " is not a 64-bit ELF program";
  }
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    in.seekg(static_cast<std::streamoff>(eh.e_phoff + i * sizeof ph));
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) break;
    if (ph.p_type == PT_INTERP) {
      return exe.string() +
             " is dynamically linked (a sanitizer build, or one with "
             "DLAUNCH_STATIC_RUNTIME=OFF) and cannot be shipped: install "
             "dlaunch on the host, or run the head from a release build "
             "(cmake --preset release), which is static and ships itself";
    }
  }
  return "";
}

std::string file_checksum(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read " + file.string() + ": " +
                             std::strerror(errno));
  }
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 16);
  while (in.read(buf.data(), buf.size()) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string cache_name(const std::string& checksum) {
  std::string name = DLAUNCH_VERSION "-" + checksum;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
        c != '_') {
      c = '_';
    }
  }
  return name;
}

std::string cached_path(const std::string& name) {
  return std::string(kCacheRoot) + "/" + name + "/dlaunch";
}

std::vector<std::string> cached_dlaunch_argv(const std::string& name) {
  return {"sh", "-c",
          cache_guard(name) + " && exec \"$d/" + name + "/dlaunch\" \"$@\"",
          "dlaunch"};
}

std::vector<std::pair<fs::path, std::string>> shipped_files(
    const LaunchPlan& plan, const std::string& host) {
  (void)plan.shipped.at(host);
  std::vector<std::pair<fs::path, std::string>> out = {
      {plan.ship_from, "dlaunch"}};
  if (!plan.ship_cuda_devices_from.empty()) {
    out.emplace_back(plan.ship_cuda_devices_from, "dlaunch-cuda-devices");
  }
  if (!plan.ship_watchdog_from.empty()) {
    out.emplace_back(plan.ship_watchdog_from, agent::kWatchdogProgram);
  }
  return out;
}

std::string ship_script(const std::string& name, const std::string& file) {
  const std::string dir = "\"$d/" + name + "\"";
  return "umask 077 && " + cache_guard(name) + " && mkdir -p " + dir +
         " && private \"$d\" && private " + dir + " && t=$(mktemp " + dir +
         "/." + file +
         ".XXXXXX) && trap 'rm -f \"$t\"' EXIT && trap 'exit 1' HUP INT TERM "
         "&& cat > \"$t\" && chmod 700 \"$t\" && mv -f \"$t\" " +
         dir + "/" + file;
}

std::vector<PreflightFailure> ship_where_missing(
    const AgentLauncher& backend, LaunchPlan& plan,
    std::vector<PreflightFailure> failures, const fs::path& self,
    const PreflightCheck& check,
    const std::function<void(const std::string&)>& note) {
  std::vector<PreflightFailure> left;
  std::vector<std::string> hosts;
  for (PreflightFailure& f : failures) {
    if (f.dlaunch_unusable) {
      hosts.push_back(f.host);
    } else {
      left.push_back(std::move(f));
    }
  }
  if (hosts.empty()) return left;
  const std::string lacks = "no usable dlaunch at " + plan.remote_dlaunch;
  auto refuse = [&](const std::string& why) {
    for (const std::string& h : hosts)
      left.push_back({h, lacks + ", and " + why});
    return left;
  };
  if (std::string why = why_not_shippable(self); !why.empty()) {
    return refuse(why);
  }
  plan.ship_from = self;
  // The helper programs beside it, those the head has.
  auto beside = [&](const char* name) {
    const fs::path p = fs::path(self).replace_filename(name);
    return ::access(p.c_str(), R_OK) == 0 ? p : fs::path();
  };
  plan.ship_cuda_devices_from = beside("dlaunch-cuda-devices");
  plan.ship_watchdog_from = beside(agent::kWatchdogProgram);
  try {
    plan.ship_checksum = file_checksum(self);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  plan.ship_cache = cache_name(plan.ship_checksum);
  for (const std::string& h : hosts) {
    plan.shipped[h] = cached_path(plan.ship_cache);
  }
  if (backend.ship_commands(plan).empty()) {
    plan.shipped.clear();
    return refuse(
        "--launcher " + plan.options.launcher +
        " cannot ship it here (its remote commands get no stdin); install "
        "dlaunch there, or use --launcher ssh, which ships it");
  }
  // The cache first: the hosts whose copy there is missing or damaged
  // get one.
  auto jobs_of = [&](const std::set<std::string>& of) {
    LaunchPlan p = plan;
    p.jobs.clear();
    p.shipped.clear();
    for (const RemoteJob& j : plan.jobs) {
      if (!of.contains(j.host)) continue;
      p.jobs.push_back(j);
      p.shipped[j.host] = plan.shipped.at(j.host);
    }
    return p;
  };
  std::set<std::string> copy, cached(hosts.begin(), hosts.end());
  for (PreflightFailure& f : check(jobs_of(cached))) {
    cached.erase(f.host);
    if (f.dlaunch_unusable) {
      copy.insert(f.host);
    } else {
      left.push_back(std::move(f));
    }
  }
  for (const std::string& h : cached) {
    note("dlaunch: " + h + " has " + lacks + "; found this one cached at " +
         plan.shipped.at(h));
  }
  if (copy.empty()) return left;
  LaunchPlan to = jobs_of(copy);
  std::vector<AgentCommand> cmds = backend.ship_commands(to);
  // A copy of tens of MB: a minute past the connection.
  CommandRunner run(cmds, CommandOutput::kCapture);
  const auto bound = plan.options.connect_timeout + std::chrono::seconds(60);
  run.wait(bound);
  std::vector<CommandResult> results = run.results();
  std::map<std::string, std::string> failed;  // host -> why its copy failed
  for (size_t i = 0; i < cmds.size(); ++i) {
    const CommandResult& r = results[i];
    std::string why;
    if (!r.started) {
      why = r.out;
    } else if (!r.exited) {
      why = "no end within " +
            std::to_string(
                std::chrono::ceil<std::chrono::seconds>(bound).count()) +
            " s";
    } else if (r.exit_code != 0) {
      why = "exit " + std::to_string(r.exit_code) + ": " + last_line(r.err);
    }
    if (why.empty()) continue;
    for (const std::string& h : cmds[i].hosts) failed.emplace(h, why);
  }
  std::set<std::string> again;
  for (const std::string& h : copy) {
    if (auto f = failed.find(h); f != failed.end()) {
      left.push_back({h, lacks + ", and copying this one to " +
                             plan.shipped.at(h) + " failed: " + f->second});
      continue;
    }
    note("dlaunch: " + h + " has " + lacks + "; shipped this one to " +
         plan.shipped.at(h));
    again.insert(h);
  }
  if (!again.empty()) {
    for (PreflightFailure& f : check(jobs_of(again)))
      left.push_back(std::move(f));
  }
  return left;
}

}  // namespace dlaunch::launcher
