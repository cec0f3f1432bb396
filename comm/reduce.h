#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "comm/check.h"
#include "comm/tensor.h"

namespace dlaunch::comm {

// Element-wise reductions shared by the backends that reduce on the CPU:
// c[i] = op(a[i], b[i]) for n elements; c may alias a or b. AVG reduces as
// SUM (the caller divides once at the end with divide_in_place); f16 and
// bf16 are computed in float and rounded to nearest even.
using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);

// Empty when `op` applies to `dtype`, else a message naming both and the fix
// (bitwise ops take integer dtypes only).
std::string reduce_op_error(DType dtype, ReduceOp op);

// The element-wise function for (dtype, op); the pair must be valid
// (reduce_op_error empty; checked).
ReduceFn reduce_fn(DType dtype, ReduceOp op);

// t[i] /= divisor (integer division for integer dtypes, as torch's AVG).
void divide_in_place(Tensor t, int divisor);

// IEEE 754 binary16 and bfloat16 conversions (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

// Reads and writes element i of a tensor of any dtype as a double (f16 and
// bf16 rounded to nearest even; integers wrap as a cast from int64 does).
double get_element(const Tensor& t, size_t i);
void set_element(const Tensor& t, size_t i, double v);

// a op b for a single value, written out plainly and sharing nothing with
// reduce_fn's loops: the reference that collective results are checked
// against (the tests, dl-bench's #wrong). AVG folds as SUM (divide once at
// the end). T is double or int64_t; bitwise ops need int64_t (checked).
template <class T>
T reference_fold(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        return op == ReduceOp::kBand  ? (a & b)
               : op == ReduceOp::kBor ? (a | b)
                                      : (a ^ b);
      }
      break;
  }
  DLAUNCH_CHECK(false, "bitwise reference_fold on a floating-point type");
  return a;
}

}  // namespace dlaunch::comm
