#include "comm/init.h"

#include "comm/gloo/process_group.h"

namespace dlaunch::comm {

namespace {

[[noreturn]] void unknown_backend(std::string_view backend) {
#ifdef DLAUNCH_WITH_NCCL
  if (backend == "nccl") {
    throw CommError(
        "backend 'nccl': the NCCL backend is not available yet in this build "
        "(this build links NCCL, but comm has no NCCL process group yet); use "
        "backend 'gloo'");
  }
#else
  if (backend == "nccl") {
    throw CommError(
        "backend 'nccl' is not available in this build (configured with "
        "DLAUNCH_WITH_NCCL=OFF); use backend 'gloo'");
  }
#endif
  throw CommError("unknown backend '" + std::string(backend) +
                  "'; valid backends: gloo, nccl");
}

}  // namespace

std::unique_ptr<ProcessGroup> make_process_group(
    std::string_view backend, std::shared_ptr<store::Store> store, int rank,
    int world_size, std::chrono::milliseconds timeout) {
  if (backend != "gloo") unknown_backend(backend);
  gloo::GroupOptions o;
  o.store = std::move(store);
  o.rank = rank;
  o.size = world_size;
  o.timeout = timeout;
  return gloo::create_process_group(o);
}

}  // namespace dlaunch::comm
