#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/reduce.h"
#include "comm/tensor.h"

namespace dlaunch::comm::testing {

inline constexpr DType kAllDtypes[] = {DType::kF32,  DType::kF64, DType::kF16,
                                       DType::kBF16, DType::kI8,  DType::kU8,
                                       DType::kI32,  DType::kI64};
inline constexpr ReduceOp kAllOps[] = {
    ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
    ReduceOp::kAvg, ReduceOp::kBand,    ReduceOp::kBor, ReduceOp::kBxor};

inline bool op_applies(DType d, ReduceOp op) {
  return reduce_op_error(d, op).empty();
}

// Element i of a buffer of dtype d as a double (comm's own accessors).
inline double get(DType d, const void* p, size_t i) {
  return get_element(Tensor{const_cast<void*>(p), i + 1, d, {}}, i);
}

inline void put(DType d, void* p, size_t i, double v) {
  set_element(Tensor{p, i + 1, d, {}}, i, v);
}

// An owning buffer with a Tensor view on it.
struct Buffer {
  Buffer(DType d, size_t n) : raw(n * dtype_size(d) + 1) {
    t = Tensor{raw.data(), n, d, {}};
  }
  Buffer(DType d, const std::vector<double>& v) : Buffer(d, v.size()) {
    for (size_t i = 0; i < v.size(); ++i) put(d, raw.data(), i, v[i]);
  }
  std::vector<double> values() const {
    std::vector<double> v(t.numel);
    for (size_t i = 0; i < t.numel; ++i) v[i] = get(t.dtype, raw.data(), i);
    return v;
  }
  std::vector<uint8_t> raw;
  Tensor t;
};

// A value every dtype holds exactly and whose reductions over up to 8 ranks
// stay exact (products of at most four 2s, sums up to 32).
inline double value(ReduceOp op, int rank, size_t i) {
  switch (op) {
    case ReduceOp::kProduct:
      return static_cast<double>((rank + i) % 2 + 1);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return static_cast<double>(((rank + 1) * 37 + i * 11) % 128);
    default:
      return static_cast<double>((rank * 3 + i) % 5);
  }
}

// The reduction of value(op, r, i) over ranks 0..n-1, rounded to dtype d.
inline double expected(DType d, ReduceOp op, int n, size_t i) {
  double acc = value(op, 0, i);
  if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    int64_t bits = static_cast<int64_t>(acc);
    for (int r = 1; r < n; ++r) {
      bits = reference_fold(op, bits, static_cast<int64_t>(value(op, r, i)));
    }
    acc = static_cast<double>(bits);
  } else {
    for (int r = 1; r < n; ++r) acc = reference_fold(op, acc, value(op, r, i));
  }
  if (op == ReduceOp::kAvg) {
    acc = dtype_is_integer(d) ? std::trunc(acc / n) : acc / n;
  }
  uint64_t slot = 0;
  put(d, &slot, 0, acc);
  return get(d, &slot, 0);
}

// Floats compare within their precision (AVG rounds once more than the
// reference); integers compare exactly.
inline void expect_close(DType d, double got, double want,
                         const std::string& what) {
  double tol = 0;
  if (d == DType::kF16 || d == DType::kBF16) tol = 1e-2 * std::max(1.0, want);
  if (d == DType::kF32) tol = 1e-5 * std::max(1.0, want);
  if (d == DType::kF64) tol = 1e-12 * std::max(1.0, want);
  EXPECT_NEAR(got, want, tol) << what;
}

}  // namespace dlaunch::comm::testing
