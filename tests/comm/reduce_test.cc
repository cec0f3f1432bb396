#include "comm/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "comm/process_group.h"

namespace dlaunch::comm {
namespace {

TEST(ReduceTest, HalfConversionsRoundTripAndRoundToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);  // overflow -> inf
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(5.960464477539063e-08f), 0x0001);  // 2^-24
  EXPECT_EQ(half_to_float(0x0001), 5.960464477539063e-08f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(float_to_half(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half
    ASSERT_EQ(float_to_half(half_to_float(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(ReduceTest, Bfloat16ConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(ReduceTest, FunctionsComputeElementwise) {
  std::vector<int32_t> a{1, 6, 3}, b{4, 5, 12}, c(3);
  reduce_fn(DType::kI32, ReduceOp::kMax)(c.data(), a.data(), b.data(), 3);
  EXPECT_EQ(c, (std::vector<int32_t>{4, 6, 12}));
  reduce_fn(DType::kI32, ReduceOp::kBxor)(c.data(), a.data(), b.data(), 3);
  EXPECT_EQ(c, (std::vector<int32_t>{5, 3, 15}));
  std::vector<uint16_t> h{float_to_half(1.5f), float_to_half(-2.0f)};
  std::vector<uint16_t> k{float_to_half(2.0f), float_to_half(3.0f)};
  reduce_fn(DType::kF16, ReduceOp::kProduct)(h.data(), h.data(), k.data(), 2);
  EXPECT_EQ(half_to_float(h[0]), 3.0f);
  EXPECT_EQ(half_to_float(h[1]), -6.0f);
}

TEST(ReduceTest, AvgDividesLikeTorch) {
  std::vector<int32_t> i{7, -7, 9};
  divide_in_place(Tensor::of(i), 2);
  EXPECT_EQ(i, (std::vector<int32_t>{3, -3, 4}));
  std::vector<double> d{3.0};
  divide_in_place(Tensor::of(d), 4);
  EXPECT_EQ(d[0], 0.75);
}

TEST(ReduceTest, BitwiseOpsOnFloatsAreRejectedWithTheFix) {
  EXPECT_EQ(reduce_op_error(DType::kI8, ReduceOp::kBand), "");
  EXPECT_EQ(reduce_op_error(DType::kF32, ReduceOp::kMax), "");
  std::string e = reduce_op_error(DType::kBF16, ReduceOp::kBor);
  EXPECT_NE(e.find("bor"), std::string::npos) << e;
  EXPECT_NE(e.find("bfloat16"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
}

}  // namespace
}  // namespace dlaunch::comm
