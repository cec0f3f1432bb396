#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace dlaunch::comm
