#pragma once

#include <vector>

namespace dlaunch::testing {

// The CPUs the calling thread may run on, ascending; fails the test (and
// returns none) when the mask cannot be read.
std::vector<int> allowed_cpus();

// Sets the calling thread's affinity mask to `cpus`; false (the test
// failed, naming the CPUs) if the kernel refused it.
bool pin_to(const std::vector<int>& cpus);

}  // namespace dlaunch::testing
