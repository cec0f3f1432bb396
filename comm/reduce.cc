#include "comm/reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "comm/check.h"

namespace dlaunch::comm {
namespace {

struct Sum {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct Prod {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
struct Min {
  template <class T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};
struct Max {
  template <class T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};
struct Band {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a & b);
  }
};
struct Bor {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a | b);
  }
};
struct Bxor {
  template <class T>
  static T apply(T a, T b) {
    return static_cast<T>(a ^ b);
  }
};

// The common cases (in place: c == a; or c distinct from both) get
// restrict-qualified loops the compiler vectorises; c == b falls back to the
// plain loop.
template <class T, class Op>
void apply_native(void* c, const void* a, const void* b, size_t n) {
  if (c == a) {
    T* __restrict out = static_cast<T*>(c);
    const T* __restrict y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = Op::apply(out[i], y[i]);
    return;
  }
  if (c != b) {
    T* __restrict out = static_cast<T*>(c);
    const T* __restrict x = static_cast<const T*>(a);
    const T* __restrict y = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) out[i] = Op::apply(x[i], y[i]);
    return;
  }
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  for (size_t i = 0; i < n; ++i) out[i] = Op::apply(x[i], out[i]);
}

// 16-bit floats (f16, bf16): computed in float, rounded back.
template <class Op, float (*to_float)(uint16_t), uint16_t (*from_float)(float)>
void apply_16bit(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    out[i] = from_float(Op::apply(to_float(x[i]), to_float(y[i])));
  }
}

// The integer dtypes, for every op.
template <class Op>
ReduceFn integer_fn(DType dtype) {
  switch (dtype) {
    case DType::kI8:
      return &apply_native<int8_t, Op>;
    case DType::kU8:
      return &apply_native<uint8_t, Op>;
    case DType::kI32:
      return &apply_native<int32_t, Op>;
    case DType::kI64:
      return &apply_native<int64_t, Op>;
    default:
      break;
  }
  DLAUNCH_CHECK(false, "integer reduction on a non-integer dtype");
  return nullptr;
}

template <class Op>
ReduceFn arithmetic_fn(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return &apply_native<float, Op>;
    case DType::kF64:
      return &apply_native<double, Op>;
    case DType::kF16:
      return &apply_16bit<Op, half_to_float, float_to_half>;
    case DType::kBF16:
      return &apply_16bit<Op, bf16_to_float, float_to_bf16>;
    default:
      return integer_fn<Op>(dtype);
  }
}

template <class T>
void divide_native(void* p, size_t n, int divisor) {
  T* x = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / divisor);
}

}  // namespace

std::string reduce_op_error(DType dtype, ReduceOp op) {
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kBxor)) {
    return "ReduceOp value " + std::to_string(static_cast<int>(op)) +
           " is none this library knows; use one of comm::ReduceOp's";
  }
  if (static_cast<uint8_t>(dtype) > static_cast<uint8_t>(DType::kI64)) {
    return {};  // the tensor's check names it
  }
  bool bitwise =
      op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (bitwise && !dtype_is_integer(dtype)) {
    return "ReduceOp " + std::string(reduce_op_name(op)) +
           " is defined for integer dtypes only (int8, uint8, int32, int64), "
           "not " +
           std::string(dtype_name(dtype)) +
           "; use sum/prod/min/max/avg or an integer tensor";
  }
  return {};
}

ReduceFn reduce_fn(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return arithmetic_fn<Sum>(dtype);
    case ReduceOp::kProduct:
      return arithmetic_fn<Prod>(dtype);
    case ReduceOp::kMin:
      return arithmetic_fn<Min>(dtype);
    case ReduceOp::kMax:
      return arithmetic_fn<Max>(dtype);
    case ReduceOp::kBand:
      return integer_fn<Band>(dtype);
    case ReduceOp::kBor:
      return integer_fn<Bor>(dtype);
    case ReduceOp::kBxor:
      return integer_fn<Bxor>(dtype);
  }
  DLAUNCH_CHECK(false, "unknown ReduceOp");
  return nullptr;
}

void divide_in_place(Tensor t, int divisor) {
  DLAUNCH_CHECK(divisor > 0, "divide_in_place by a non-positive divisor");
  if (divisor == 1) return;
  switch (t.dtype) {
    case DType::kF32:
      return divide_native<float>(t.data, t.numel, divisor);
    case DType::kF64:
      return divide_native<double>(t.data, t.numel, divisor);
    case DType::kI8:
      return divide_native<int8_t>(t.data, t.numel, divisor);
    case DType::kU8:
      return divide_native<uint8_t>(t.data, t.numel, divisor);
    case DType::kI32:
      return divide_native<int32_t>(t.data, t.numel, divisor);
    case DType::kI64:
      return divide_native<int64_t>(t.data, t.numel, divisor);
    case DType::kF16: {
      auto* x = static_cast<uint16_t*>(t.data);
      for (size_t i = 0; i < t.numel; ++i) {
        x[i] = float_to_half(half_to_float(x[i]) / static_cast<float>(divisor));
      }
      return;
    }
    case DType::kBF16: {
      auto* x = static_cast<uint16_t*>(t.data);
      for (size_t i = 0; i < t.numel; ++i) {
        x[i] = float_to_bf16(bf16_to_float(x[i]) / static_cast<float>(divisor));
      }
      return;
    }
  }
  DLAUNCH_CHECK(false, "unknown DType");
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / nan
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: value = mant * 2^-24
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan (keep nan quiet)
    return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    return sign | 0x7c00u;
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14)
    // Subnormal or zero: round abs / 2^-24 to nearest even.
    float v = std::bit_cast<float>(abs);
    float scaled = v * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 112;  // rebias 127 -> 15
  uint32_t half = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float bf16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // nan: keep it a quiet nan
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

double get_element(const Tensor& t, size_t i) {
  const char* p = static_cast<const char*>(t.data);
  switch (t.dtype) {
    case DType::kF32:
      return reinterpret_cast<const float*>(p)[i];
    case DType::kF64:
      return reinterpret_cast<const double*>(p)[i];
    case DType::kF16:
      return half_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::kBF16:
      return bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::kI8:
      return reinterpret_cast<const int8_t*>(p)[i];
    case DType::kU8:
      return reinterpret_cast<const uint8_t*>(p)[i];
    case DType::kI32:
      return reinterpret_cast<const int32_t*>(p)[i];
    case DType::kI64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

void set_element(const Tensor& t, size_t i, double v) {
  char* p = static_cast<char*>(t.data);
  int64_t iv = static_cast<int64_t>(v);
  switch (t.dtype) {
    case DType::kF32:
      reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      reinterpret_cast<double*>(p)[i] = v;
      break;
    case DType::kF16:
      reinterpret_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v));
      break;
    case DType::kBF16:
      reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DType::kI8:
      reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(iv);
      break;
    case DType::kU8:
      reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(iv);
      break;
    case DType::kI32:
      reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(iv);
      break;
    case DType::kI64:
      reinterpret_cast<int64_t*>(p)[i] = iv;
      break;
  }
}

}  // namespace dlaunch::comm
