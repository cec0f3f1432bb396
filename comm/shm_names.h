#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace dlaunch::comm {

// The first part of the shared-memory names (/dev/shm/dlaunch-...) of
// groups whose workers an agent started for one attempt: "j<16 hex>.", a
// hash of what every worker of the attempt, on every node, has in its
// environment (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT,
// MASTER_ADDR, MASTER_PORT). Rank 0 puts it before its random token; once
// its workers are gone, each agent removes /dev/shm/dlaunch-<prefix>*, the
// segments of ranks killed before they could unlink them.
inline std::string attempt_shm_prefix(std::string_view run_id,
                                      std::string_view restart_count,
                                      std::string_view master_addr,
                                      std::string_view master_port) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (std::string_view part :
       {run_id, restart_count, master_addr, master_port}) {
    for (unsigned char c : part) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // (a separator no text holds)
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "j%016llx.",
                static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace dlaunch::comm
