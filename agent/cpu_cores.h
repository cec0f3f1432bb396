#pragma once

#include <vector>

namespace dlaunch::agent {

// One CPU (hardware thread) and the core it belongs to, as
// /sys/devices/system/cpu/cpuN/topology names them; -1 where unknown.
struct CpuPlace {
  int cpu = 0;
  int package = -1;  // physical_package_id
  int core = -1;     // core_id, unique within its package
};

// Groups CPUs into cores: the CPUs of one (package, core) pair form one
// core, a CPU of unknown place a core of its own; cores come in the order
// of their lowest CPU, each core's CPUs in ascending order. Pure.
std::vector<std::vector<int>> group_cores(std::vector<CpuPlace> cpus);

// The cores this process may run on (sched_getaffinity, grouped by the
// kernel's topology files): what --cpu-bind core hands out to workers.
// Empty when the affinity mask cannot be read.
std::vector<std::vector<int>> allowed_cores();

}  // namespace dlaunch::agent
