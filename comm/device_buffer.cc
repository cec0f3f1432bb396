#include "comm/device_buffer.h"

#include <string>
#include <utility>

#include "comm/process_group.h"

#ifdef DLAUNCH_WITH_NCCL
#include <cuda_runtime.h>

#include "comm/nccl/process_group.h"
#endif

namespace dlaunch::comm {

int default_device() {
#ifdef DLAUNCH_WITH_NCCL
  return nccl::resolve_device(-1);
#else
  return 0;
#endif
}

#ifdef DLAUNCH_WITH_NCCL
namespace {
void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    throw CommError(what + ": CUDA error " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")");
  }
}
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes, int device)
    : bytes_(bytes), device_(device) {
  const std::string what = "allocating " + std::to_string(bytes) +
                           " bytes on cuda:" + std::to_string(device);
  check(cudaSetDevice(device), what);
  check(cudaMalloc(&data_, bytes > 0 ? bytes : 1), what);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

void DeviceBuffer::copy_from_host(const void* src, size_t n, size_t offset) {
  DLAUNCH_CHECK(offset + n <= bytes_, "copy past the end of a DeviceBuffer");
  check(cudaMemcpy(static_cast<char*>(data_) + offset, src, n,
                   cudaMemcpyHostToDevice),
        "copying to cuda:" + std::to_string(device_));
}

void DeviceBuffer::copy_to_host(void* dst, size_t n, size_t offset) const {
  DLAUNCH_CHECK(offset + n <= bytes_, "copy past the end of a DeviceBuffer");
  check(cudaMemcpy(dst, static_cast<const char*>(data_) + offset, n,
                   cudaMemcpyDeviceToHost),
        "copying from cuda:" + std::to_string(device_));
}
#else
DeviceBuffer::DeviceBuffer(size_t bytes, int device)
    : bytes_(bytes), device_(device) {
  throw CommError(
      "device memory needs the nccl backend, and this build has none "
      "(configured with DLAUNCH_WITH_NCCL=OFF); use backend 'gloo'");
}

DeviceBuffer::~DeviceBuffer() = default;

void DeviceBuffer::copy_from_host(const void*, size_t, size_t) {
  DLAUNCH_CHECK(false, "DeviceBuffer without CUDA");
}

void DeviceBuffer::copy_to_host(void*, size_t, size_t) const {
  DLAUNCH_CHECK(false, "DeviceBuffer without CUDA");
}
#endif

Tensor DeviceBuffer::view(size_t offset, size_t numel, DType dtype) const {
  DLAUNCH_CHECK(offset + numel * dtype_size(dtype) <= bytes_,
                "a view past the end of a DeviceBuffer");
  return Tensor{static_cast<char*>(data_) + offset, numel, dtype,
                Device{DeviceType::kCuda, device_}};
}

void DeviceBuffer::swap(DeviceBuffer& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  std::swap(device_, o.device_);
}

}  // namespace dlaunch::comm
