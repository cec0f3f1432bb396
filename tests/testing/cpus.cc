#include "tests/testing/cpus.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace dlaunch::testing {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) {
    ADD_FAILURE() << "sched_getaffinity: " << std::strerror(errno);
    return cpus;
  }
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

bool pin_to(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (::sched_setaffinity(0, sizeof(set), &set) == 0) return true;
  std::string list;
  for (int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
  ADD_FAILURE() << "sched_setaffinity to CPUs {" << list
                << "}: " << std::strerror(errno);
  return false;
}

}  // namespace dlaunch::testing
