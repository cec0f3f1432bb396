#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm/process_group.h"
#include "comm/store/store.h"

namespace dlaunch::comm {

struct InitOptions {
  // "env://" (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; rank 0 serves the
  // store on MASTER_PORT), "tcp://HOST:PORT" (rank 0 serves), or
  // "file:///path" (a shared file system). Default "env://".
  std::string init_method = "env://";
  // Required for tcp:// and file://; for env:// overrides RANK/WORLD_SIZE.
  // Default -1: unset.
  int rank = -1;
  int world_size = -1;
  // Bound on every blocking call. Default: $DLAUNCH_COMM_TIMEOUT (seconds)
  // when set, else 30 minutes.
  std::optional<std::chrono::milliseconds> timeout;
};

// Creates the world group of `backend` ("gloo"; "nccl" where built with
// DLAUNCH_WITH_NCCL: one GPU per rank, the device resolved as
// nccl::resolve_device says). Throws CommError naming the bad variable or
// argument, or, for nccl, when no GPU is visible.
std::unique_ptr<ProcessGroup> init_process_group(
    std::string_view backend, const InitOptions& options = {});

// The world group over an existing store (tests, embedding); the group
// shares ownership of the store.
std::unique_ptr<ProcessGroup> make_process_group(
    std::string_view backend, std::shared_ptr<store::Store> store, int rank,
    int world_size, std::chrono::milliseconds timeout);

}  // namespace dlaunch::comm
