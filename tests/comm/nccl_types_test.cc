// What of the nccl backend needs no GPU: type and op mapping, error texts,
// tensor checks, the unique id's exchange through a store, the options read
// from the environment, and the no-device error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/nccl/process_group.h"
#include "comm/nccl/types.h"
#include "comm/store/hash_store.h"
#include "tests/comm/rank_threads.h"

namespace dlaunch::comm::nccl {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

using comm::testing::error_of;

TEST(NcclTypesTest, EveryDTypeMapsToNcclsOwn) {
  EXPECT_EQ(to_nccl(DType::kF32), ncclFloat32);
  EXPECT_EQ(to_nccl(DType::kF64), ncclFloat64);
  EXPECT_EQ(to_nccl(DType::kF16), ncclFloat16);
  EXPECT_EQ(to_nccl(DType::kBF16), ncclBfloat16);
  EXPECT_EQ(to_nccl(DType::kI8), ncclInt8);
  EXPECT_EQ(to_nccl(DType::kU8), ncclUint8);
  EXPECT_EQ(to_nccl(DType::kI32), ncclInt32);
  EXPECT_EQ(to_nccl(DType::kI64), ncclInt64);
}

TEST(NcclTypesTest, AvgIsNativeAndBitwiseOpsAreAClearError) {
  EXPECT_EQ(to_nccl(ReduceOp::kSum, "x"), ncclSum);
  EXPECT_EQ(to_nccl(ReduceOp::kProduct, "x"), ncclProd);
  EXPECT_EQ(to_nccl(ReduceOp::kMin, "x"), ncclMin);
  EXPECT_EQ(to_nccl(ReduceOp::kMax, "x"), ncclMax);
  EXPECT_EQ(to_nccl(ReduceOp::kAvg, "x"), ncclAvg);
  for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    std::string e =
        error_of([&] { to_nccl(op, "all_reduce #3 on group 'w'"); });
    EXPECT_THAT(e, HasSubstr("all_reduce #3 on group 'w'"));
    EXPECT_THAT(e, HasSubstr(std::string(reduce_op_name(op))));
    EXPECT_THAT(e, HasSubstr("use backend 'gloo' for bitwise ops"));
    EXPECT_FALSE(reduce_op_error(op).empty());
  }
  EXPECT_EQ(reduce_op_error(ReduceOp::kAvg), "");
}

TEST(NcclTypesTest, ResultTextNamesTheErrorItsMeaningAndNcclsLastError) {
  EXPECT_THAT(result_text(ncclRemoteError), HasSubstr("ncclRemoteError"));
  EXPECT_THAT(result_text(ncclRemoteError), HasSubstr("a peer failed"));
  EXPECT_THAT(result_text(ncclInvalidUsage), HasSubstr("two ranks on one GPU"));
  EXPECT_THAT(result_text(ncclUnhandledCudaError), HasSubstr("CUDA call"));
  EXPECT_THAT(result_text(ncclSystemError), HasSubstr("system call"));
  EXPECT_THAT(result_text(ncclInternalError), HasSubstr("internal"));
  EXPECT_THAT(result_text(ncclInvalidArgument), HasSubstr("bad argument"));
  EXPECT_THAT(result_text(ncclInProgress), HasSubstr("not finished"));
  EXPECT_THAT(result_text(static_cast<ncclResult_t>(42)),
              HasSubstr("NCCL error 42"));
  EXPECT_EQ(result_text(ncclSystemError, "socket closed"),
            result_text(ncclSystemError) + ": socket closed");
}

TEST(NcclTypesTest, CpuTensorsAndOtherDevicesAreAClearError) {
  float x[4];
  Tensor cpu = Tensor::of(x, 4);
  std::string e = tensor_error(cpu, 0, "t");
  EXPECT_THAT(e, HasSubstr("t is a CPU tensor"));
  EXPECT_THAT(e, HasSubstr("DeviceType::kCuda, 0"));
  EXPECT_THAT(e, HasSubstr("use backend 'gloo' for CPU tensors"));
  Tensor other = Tensor::of(x, 4, Device{DeviceType::kCuda, 1});
  EXPECT_THAT(tensor_error(other, 0, "out[2]"),
              HasSubstr("out[2] is on cuda:1 but the group uses cuda:0"));
  Tensor good = Tensor::of(x, 4, Device{DeviceType::kCuda, 0});
  EXPECT_EQ(tensor_error(good, 0, "t"), "");
  Tensor null{nullptr, 4, DType::kF32, Device{DeviceType::kCuda, 0}};
  EXPECT_THAT(tensor_error(null, 0, "t"), HasSubstr("no data pointer"));
}

ncclUniqueId id_with(unsigned char fill) {
  ncclUniqueId id;
  std::memset(&id, fill, sizeof(id));
  return id;
}

TEST(NcclIdExchangeTest, RankZeroMakesTheIdAndEveryRankGetsIt) {
  auto store = std::make_shared<store::HashStore>();
  constexpr int n = 4;
  std::vector<ncclUniqueId> got(n);
  std::vector<int> made(n, 0);
  std::vector<std::thread> ranks;
  for (int r = n - 1; r >= 0; --r) {  // the readers start first
    ranks.emplace_back([&, r] {
      got[r] = exchange_unique_id(*store, "nccl/world/unique_id", r,
                                  milliseconds(20000), [&] {
                                    ++made[r];
                                    return id_with(0x5a);
                                  });
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(made, (std::vector<int>{1, 0, 0, 0}));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(std::memcmp(&got[r], &got[0], sizeof(ncclUniqueId)), 0);
    EXPECT_EQ(reinterpret_cast<unsigned char*>(&got[r])[17], 0x5a);
  }
}

TEST(NcclIdExchangeTest, ARankWaitingForRankZeroTimesOutNamingTheKey) {
  store::HashStore store;
  try {
    exchange_unique_id(store, "nccl/world/1/unique_id", 2, milliseconds(50),
                       [] { return id_with(1); });
    FAIL() << "no timeout";
  } catch (const CommTimeoutError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("rank 2 waited for rank 0's NCCL unique "
                          "id at store key 'nccl/world/1/unique_id'"));
  }
}

TEST(NcclIdExchangeTest, AValueOfTheWrongSizeIsAClearError) {
  store::HashStore store;
  store.set("k", "short");
  EXPECT_THAT(error_of([&] {
                exchange_unique_id(store, "k", 1, milliseconds(50),
                                   [] { return id_with(1); });
              }),
              HasSubstr("has 5 bytes, expected 128"));
}

class NcclOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v : {"DLAUNCH_CUDA_DEVICE", "LOCAL_RANK",
                          "DLAUNCH_NCCL_CHECK", "TORCH_DISTRIBUTED_DEBUG"}) {
      unsetenv(v);
    }
  }
};

TEST_F(NcclOptionsTest, DeviceIsTheCallersElseDlaunchsElseLocalRankElseZero) {
  EXPECT_EQ(resolve_device(-1), 0);
  setenv("LOCAL_RANK", "3", 1);
  EXPECT_EQ(resolve_device(-1), 3);
  setenv("DLAUNCH_CUDA_DEVICE", "0", 1);  // --gpu-binding per-rank
  EXPECT_EQ(resolve_device(-1), 0);
  EXPECT_EQ(resolve_device(5), 5);
  setenv("DLAUNCH_CUDA_DEVICE", "gpu1", 1);
  EXPECT_THAT(error_of([] { resolve_device(-1); }),
              HasSubstr("DLAUNCH_CUDA_DEVICE is 'gpu1'; expected a CUDA "
                        "device ordinal"));
  unsetenv("DLAUNCH_CUDA_DEVICE");
  setenv("LOCAL_RANK", "-1", 1);
  EXPECT_THAT(error_of([] { resolve_device(-1); }),
              HasSubstr("LOCAL_RANK is '-1'"));
}

TEST_F(NcclOptionsTest, ArgumentCheckIsOffUnlessAskedFor) {
  EXPECT_FALSE(resolve_check_arguments(std::nullopt));
  EXPECT_TRUE(resolve_check_arguments(true));
  setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL", 1);
  EXPECT_TRUE(resolve_check_arguments(std::nullopt));
  EXPECT_FALSE(resolve_check_arguments(false));
  setenv("TORCH_DISTRIBUTED_DEBUG", "INFO", 1);
  EXPECT_FALSE(resolve_check_arguments(std::nullopt));
  setenv("DLAUNCH_NCCL_CHECK", "1", 1);
  EXPECT_TRUE(resolve_check_arguments(std::nullopt));
  setenv("DLAUNCH_NCCL_CHECK", "0", 1);
  EXPECT_FALSE(resolve_check_arguments(std::nullopt));
  setenv("DLAUNCH_NCCL_CHECK", "yes", 1);
  EXPECT_THAT(error_of([] { resolve_check_arguments(std::nullopt); }),
              HasSubstr("DLAUNCH_NCCL_CHECK is 'yes'; expected 1"));
}

TEST(NcclNoDeviceTest, CreatingAGroupWithoutAGpuSaysSoBeforeTouchingTheStore) {
  std::string why;
  if (visible_devices(&why) > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_FALSE(why.empty());
  GroupOptions o;
  auto store = std::make_shared<store::HashStore>();
  o.store = store;
  o.rank = 1;
  o.size = 2;
  std::string e = error_of([&] { create_process_group(o); });
  EXPECT_THAT(e, HasSubstr("backend 'nccl', group 'world', rank 1 of 2: no "
                           "CUDA device is visible"));
  EXPECT_THAT(e, HasSubstr("or use backend 'gloo'"));
  EXPECT_EQ(store->num_keys(), 0);
}

}  // namespace
}  // namespace dlaunch::comm::nccl
