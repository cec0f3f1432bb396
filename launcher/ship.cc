#include "launcher/ship.h"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>

#include "launcher/command_runner.h"

namespace dlaunch::launcher {
namespace {

namespace fs = std::filesystem;

constexpr char kCudaSuffix[] = "-cuda-devices";

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

std::string shipped_path(const std::string& tag, const std::string& host) {
  // '%' stays: pdsh's exec module puts the host for "%h".
  std::string safe = host;
  for (char& c : safe) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
        c != '_' && c != '%') {
      c = '_';
    }
  }
  return "/tmp/" + tag + "-" + safe + ".dlaunch";
}

std::vector<std::pair<fs::path, std::string>> shipped_files(
    const LaunchPlan& plan, const std::string& host) {
  const std::string& to = plan.shipped.at(host);
  std::vector<std::pair<fs::path, std::string>> out = {{plan.ship_from, to}};
  if (!plan.ship_cuda_devices_from.empty()) {
    out.emplace_back(plan.ship_cuda_devices_from, to + kCudaSuffix);
  }
  return out;
}

std::string ship_script(const std::string& path) {
  const std::string p = shell_command({path});
  return "umask 077 && set -C && cat > " + p + " && chmod 700 " + p;
}

int remove_shipped(const std::string& tag) {
  int removed = 0;
  std::error_code ec;
  const uid_t me = ::getuid();
  for (const auto& e : fs::directory_iterator("/tmp", ec)) {
    const std::string name = e.path().filename();
    if (!name.starts_with(tag + "-") ||
        !(name.ends_with(".dlaunch") ||
          name.ends_with(std::string(".dlaunch") + kCudaSuffix))) {
      continue;
    }
    struct ::stat st;
    if (::lstat(e.path().c_str(), &st) != 0 || st.st_uid != me ||
        !S_ISREG(st.st_mode)) {
      continue;
    }
    if (fs::remove(e.path(), ec)) ++removed;
  }
  return removed;
}

void remove_own_shipped_copy(const std::string& tag) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const std::string name = self.filename();
  if (ec || tag.empty() || self.parent_path() != "/tmp" ||
      !name.starts_with(tag + "-") || !name.ends_with(".dlaunch")) {
    return;
  }
  fs::remove(self, ec);
  fs::remove(self.string() + kCudaSuffix, ec);
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
  const fs::path cuda = fs::path(self).replace_filename("dlaunch-cuda-devices");
  plan.ship_cuda_devices_from =
      ::access(cuda.c_str(), R_OK) == 0 ? cuda : fs::path();
  try {
    plan.ship_checksum = file_checksum(self);
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  for (const std::string& h : hosts) {
    plan.shipped[h] = shipped_path(plan.job_tag, h);
  }
  std::vector<AgentCommand> cmds = backend.ship_commands(plan);
  if (cmds.empty()) {
    plan.shipped.clear();
    return refuse(
        "--launcher " + plan.options.launcher +
        " cannot ship it here (its remote commands get no stdin); install "
        "dlaunch there, or use --launcher ssh, which ships it");
  }
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
  LaunchPlan again = plan;
  again.jobs.clear();
  for (RemoteJob& j : plan.jobs) {
    auto it = plan.shipped.find(j.host);
    if (it == plan.shipped.end()) continue;
    if (auto f = failed.find(j.host); f != failed.end()) {
      left.push_back({j.host, lacks + ", and copying this one to " +
                                  it->second + " failed: " + f->second});
      continue;
    }
    if (!plan.ship_cuda_devices_from.empty()) {
      j.env["DLAUNCH_CUDA_DEVICES"] = it->second + kCudaSuffix;
    }
    note("dlaunch: " + j.host + " has " + lacks + "; shipped this one to " +
         it->second);
    again.jobs.push_back(j);
  }
  if (!again.jobs.empty()) {
    for (PreflightFailure& f : check(again)) left.push_back(std::move(f));
  }
  return left;
}

}  // namespace dlaunch::launcher
