#include "comm/tensor.h"

#include "comm/check.h"

namespace dlaunch::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  DLAUNCH_CHECK(false, "unknown DType");
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
  }
  DLAUNCH_CHECK(false, "unknown DType");
  return {};
}

bool dtype_is_integer(DType t) {
  return t == DType::kI8 || t == DType::kU8 || t == DType::kI32 ||
         t == DType::kI64;
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProduct:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kBand:
      return "band";
    case ReduceOp::kBor:
      return "bor";
    case ReduceOp::kBxor:
      return "bxor";
  }
  DLAUNCH_CHECK(false, "unknown ReduceOp");
  return {};
}

}  // namespace dlaunch::comm
