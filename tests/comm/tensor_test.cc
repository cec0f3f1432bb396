#include "comm/tensor.h"

#include <gtest/gtest.h>

namespace dlaunch::comm {
namespace {

TEST(TensorTest, SizesAndNamesFollowTorch) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_name(DType::kF16), "float16");
  EXPECT_EQ(reduce_op_name(ReduceOp::kProduct), "prod");
  EXPECT_TRUE(dtype_is_integer(DType::kU8));
  EXPECT_FALSE(dtype_is_integer(DType::kBF16));
}

TEST(TensorTest, ViewsAVectorWithoutCopying) {
  std::vector<int32_t> v{1, 2, 3};
  Tensor t = Tensor::of(v);
  EXPECT_EQ(t.dtype, DType::kI32);
  EXPECT_EQ(t.nbytes(), 12u);
  t.as<int32_t>()[1] = 7;
  EXPECT_EQ(v[1], 7);
}

TEST(TensorDeathTest, AsWithWrongTypeAborts) {
  std::vector<float> v(2);
  Tensor t = Tensor::of(v);
  EXPECT_DEATH(t.as<int32_t>(), "another dtype");
}

}  // namespace
}  // namespace dlaunch::comm
