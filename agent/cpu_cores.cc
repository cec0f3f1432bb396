#include "agent/cpu_cores.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <utility>

namespace dlaunch::agent {
namespace {

// One number from a topology file of `cpu`; -1 when it cannot be read.
int topology_value(int cpu, const char* name) {
  std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                   "/topology/" + name);
  int v = -1;
  if (!(in >> v)) return -1;
  return v;
}

}  // namespace

std::vector<std::vector<int>> group_cores(std::vector<CpuPlace> cpus) {
  std::sort(cpus.begin(), cpus.end(),
            [](const CpuPlace& a, const CpuPlace& b) { return a.cpu < b.cpu; });
  std::vector<std::vector<int>> cores;
  std::map<std::pair<int, int>, size_t> index;  // (package, core) -> core
  for (const CpuPlace& c : cpus) {
    if (c.package < 0 || c.core < 0) {
      cores.push_back({c.cpu});
      continue;
    }
    auto [it, fresh] =
        index.emplace(std::pair{c.package, c.core}, cores.size());
    if (fresh) cores.emplace_back();
    cores[it->second].push_back(c.cpu);
  }
  return cores;
}

std::vector<std::vector<int>> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::vector<CpuPlace> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    cpus.push_back({cpu, topology_value(cpu, "physical_package_id"),
                    topology_value(cpu, "core_id")});
  }
  return group_cores(std::move(cpus));
}

}  // namespace dlaunch::agent
