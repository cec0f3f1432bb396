#include "workloads/op_buffer.h"

#include "comm/check.h"

namespace dlaunch::workloads {

OpBuffer::OpBuffer(const comm::ProcessGroup& pg, comm::Tensor host)
    : host_(host) {
  if (pg.backend() == "nccl") {
    device_.emplace(host.nbytes(), comm::default_device());
  }
}

comm::Tensor OpBuffer::slice(size_t offset, size_t n) const {
  DLAUNCH_CHECK(offset + n <= host_.numel, "OpBuffer slice past the end");
  const size_t es = comm::dtype_size(host_.dtype);
  if (device_) return device_->view(offset * es, n, host_.dtype);
  return comm::Tensor{
      static_cast<char*>(host_.data) + offset * es, n, host_.dtype, {}};
}

void OpBuffer::upload() {
  if (device_) device_->copy_from_host(host_.data, host_.nbytes());
}

void OpBuffer::download() {
  if (device_) device_->copy_to_host(host_.data, host_.nbytes());
}

void all_reduce_host(comm::ProcessGroup& pg, comm::Tensor host,
                     comm::ReduceOp op) {
  OpBuffer b(pg, host);
  b.upload();
  pg.all_reduce(b.tensor(), op);
  b.download();
}

}  // namespace dlaunch::workloads
