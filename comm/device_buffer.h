#pragma once

#include <cstddef>

#include "comm/tensor.h"

namespace dlaunch::comm {

// The CUDA device the nccl backend uses when the caller names none
// (nccl::resolve_device: $DLAUNCH_CUDA_DEVICE, else $LOCAL_RANK, else 0);
// 0 in a build without NCCL.
int default_device();

// An owning buffer of CUDA device memory for the nccl backend's callers
// (workloads, tests), so that they need no CUDA headers. Move-only; one
// thread at a time. In a build without NCCL (or on a machine without a
// GPU) the constructor throws CommError saying so.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of memory on CUDA device `device` (made current).
  DeviceBuffer(size_t bytes, int device);
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  // A Tensor over `numel` elements of `dtype` from byte `offset`.
  Tensor view(size_t offset, size_t numel, DType dtype) const;

  // Synchronous copies (they wait for the device): `n` bytes at `offset`.
  void copy_from_host(const void* src, size_t n, size_t offset = 0);
  void copy_to_host(void* dst, size_t n, size_t offset = 0) const;

 private:
  void swap(DeviceBuffer& o) noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace dlaunch::comm
