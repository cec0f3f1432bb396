#pragma once

#include <optional>

#include "comm/device_buffer.h"
#include "comm/process_group.h"
#include "comm/tensor.h"

namespace dlaunch::workloads {

// Host data as an operation of `pg` takes it: the host memory itself for
// gloo, a device copy of it for nccl (on comm::default_device()). The
// workloads fill and check on the host and move data with upload() and
// download(). Owned by one thread; `host` must outlive it.
class OpBuffer {
 public:
  OpBuffer(const comm::ProcessGroup& pg, comm::Tensor host);

  // What to pass to `pg`: the whole buffer, or `n` elements from `offset`.
  comm::Tensor tensor() const { return slice(0, host_.numel); }
  comm::Tensor slice(size_t offset, size_t n) const;
  // Host to device and back (synchronous; no-ops for gloo).
  void upload();
  void download();

 private:
  comm::Tensor host_;
  std::optional<comm::DeviceBuffer> device_;
};

// all_reduce of host data (timings, counts) over either backend.
void all_reduce_host(comm::ProcessGroup& pg, comm::Tensor host,
                     comm::ReduceOp op = comm::ReduceOp::kSum);

}  // namespace dlaunch::workloads
