#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "comm/check.h"

namespace dlaunch::comm {

// Element types, named as torch names them (float32 ... int64).
enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI8, kU8, kI32, kI64 };

// Bytes per element.
size_t dtype_size(DType t);
// "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32",
// "int64".
std::string_view dtype_name(DType t);
// True for i8, u8, i32, i64 (the dtypes the bitwise ReduceOps accept).
bool dtype_is_integer(DType t);

// Maps a C++ element type to its DType (float, double, int8_t, uint8_t,
// int32_t, int64_t; f16/bf16 are passed as raw uint16_t with an explicit
// DType).
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::kI8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kU8;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;  // where the memory lives; default CPU
  int index = 0;                       // CUDA device ordinal; 0 for CPU
};

// A non-owning view of a contiguous buffer: the caller keeps the memory alive
// until the operation using it has completed (Work::wait for async calls).
struct Tensor {
  void* data = nullptr;
  size_t numel = 0;
  DType dtype = DType::kF32;
  Device device{};

  size_t nbytes() const { return numel * dtype_size(dtype); }

  template <class T>
  static Tensor of(T* p, size_t n, Device d = {}) {
    return Tensor{p, n, dtype_of<T>(), d};
  }
  template <class T>
  static Tensor of(std::vector<T>& v, Device d = {}) {
    return of(v.data(), v.size(), d);
  }
  template <class T>
  static Tensor of(std::span<T> s, Device d = {}) {
    return of(s.data(), s.size(), d);
  }
  // Typed access; T must match dtype (checked).
  template <class T>
  std::span<T> as() const {
    DLAUNCH_CHECK(dtype_of<T>() == dtype,
                  "Tensor::as<T>() with a T of another dtype");
    return {static_cast<T*>(data), numel};
  }
};

// torch.distributed.ReduceOp. AVG divides the sum by the group size (integer
// division for integer dtypes, as torch); BAND/BOR/BXOR accept integer
// dtypes only.
enum class ReduceOp : uint8_t {
  kSum,
  kProduct,
  kMin,
  kMax,
  kAvg,
  kBand,
  kBor,
  kBxor
};

// "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" (nccl-tests'
// names where they exist).
std::string_view reduce_op_name(ReduceOp op);

}  // namespace dlaunch::comm
