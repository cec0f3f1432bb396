#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "comm/store/store.h"

namespace dlaunch::comm::nccl {

struct GroupOptions {
  // Where rank 0 publishes the NCCL unique id and the others read it.
  // Required.
  std::shared_ptr<store::Store> store;
  // This process's rank in [0, size). Required.
  int rank = -1;
  // Number of ranks, one GPU each. Required.
  int size = -1;
  // Bound on every blocking call, and on each operation (the watchdog aborts
  // the communicator past it). Default 30 minutes.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // Group name, also the store key prefix. Default "world".
  std::string name = "world";
  // CUDA device ordinal. Default -1: resolve_device() picks one.
  int device = -1;
  // Check every call's arguments against every rank's before it runs (as
  // the gloo backend always does), over a Gloo group made by
  // `make_check_group`. Default: resolve_check_arguments().
  std::optional<bool> check_arguments;
  // Makes the CPU group of the argument check, named as given (init.cc
  // passes a Gloo group over the same store). Required when checking.
  std::function<std::unique_ptr<ProcessGroup>(const std::string& name)>
      make_check_group;
  // How often the watchdog looks at outstanding operations and NCCL's
  // asynchronous error. Default 100 ms.
  std::chrono::milliseconds watchdog_interval{100};
  // Kept alive while this group or any group derived from it exists (the
  // store server rank 0 hosts for env:// and tcp://). Default none.
  std::shared_ptr<void> owned;
};

// The device a group uses when GroupOptions.device is -1:
// $DLAUNCH_CUDA_DEVICE when set (dlaunch --gpu-binding per-rank sets 0, the
// only device the worker sees), else $LOCAL_RANK, else 0. Throws CommError
// naming a malformed variable. Needs no GPU.
int resolve_device(int requested);

// Whether the argument check runs when GroupOptions.check_arguments is
// unset: on when $DLAUNCH_NCCL_CHECK is 1 or $TORCH_DISTRIBUTED_DEBUG is
// DETAIL (torch's switch for the same check). Needs no GPU.
bool resolve_check_arguments(std::optional<bool> requested);

// CUDA devices this process sees; 0 when there is no GPU or the driver or
// runtime fails, with the reason in `why`.
int visible_devices(std::string* why);

// Creates an NCCL group: rank 0 makes the unique id and publishes it through
// the store, every rank joins on its device. Blocks until every rank joined,
// at most options.timeout; throws CommError (CommTimeoutError on timeout)
// naming the group, or when no GPU is visible. Tensors must be CUDA device
// memory on the group's device.
std::unique_ptr<ProcessGroup> create_process_group(const GroupOptions& options);

}  // namespace dlaunch::comm::nccl
