// The nccl backend on a real GPU, world size 1 (NCCL refuses two ranks on
// one device, and the test machine has one): every operation, the async
// Work, sub-groups, the argument check, and the CPU-tensor and bitwise-op
// errors through a live group. Skips, saying why, without a GPU.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/init.h"
#include "comm/nccl/process_group.h"
#include "comm/store/hash_store.h"

namespace dlaunch::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr Device kGpu{DeviceType::kCuda, 0};

// A device buffer of `n` floats, filled from and read back to the host.
struct DeviceFloats {
  explicit DeviceFloats(size_t n) : n(n) {
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p); }
  void fill(const std::vector<float>& v) {
    ASSERT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> read() const {
    std::vector<float> v(n);
    EXPECT_EQ(
        cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost),
        cudaSuccess);
    return v;
  }
  Tensor t(size_t off = 0, size_t count = 0) const {
    return Tensor{static_cast<float*>(p) + off, count ? count : n - off,
                  DType::kF32, kGpu};
  }
  float* p = nullptr;
  size_t n;
};

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (nccl::visible_devices(&why) == 0) {
      GTEST_SKIP() << "no CUDA device (" << why << ")";
    }
    unsetenv("DLAUNCH_CUDA_DEVICE");
    unsetenv("LOCAL_RANK");
    store_ = std::make_shared<store::HashStore>();
    pg_ = make_process_group("nccl", store_, 0, 1, milliseconds(60000));
  }
  std::shared_ptr<store::HashStore> store_;
  std::unique_ptr<ProcessGroup> pg_;
};

TEST_F(NcclGpuTest, EveryCollectiveOnOneRank) {
  EXPECT_EQ(pg_->backend(), "nccl");
  DeviceFloats a(1000);
  a.fill(std::vector<float>(1000, 2.5f));
  pg_->all_reduce(a.t());
  pg_->all_reduce(a.t(), ReduceOp::kAvg);
  pg_->broadcast(a.t(), 0);
  pg_->reduce(a.t(), 0, ReduceOp::kMax);
  for (float v : a.read()) ASSERT_EQ(v, 2.5f);

  DeviceFloats out(8), in(8);
  in.fill({1, 2, 3, 4, 5, 6, 7, 8});
  Tensor list_out[] = {out.t()};
  pg_->all_gather(list_out, in.t());
  EXPECT_EQ(out.read(), in.read());
  Tensor list_in[] = {in.t()};
  out.fill(std::vector<float>(8, 0));
  pg_->reduce_scatter(out.t(), list_in);
  EXPECT_EQ(out.read(), in.read());
  out.fill(std::vector<float>(8, 0));
  pg_->all_to_all(list_out, list_in);
  EXPECT_EQ(out.read(), in.read());
  out.fill(std::vector<float>(8, 0));
  pg_->scatter(out.t(), list_in, 0);
  EXPECT_EQ(out.read(), in.read());
  out.fill(std::vector<float>(8, 0));
  pg_->gather(in.t(), list_out, 0);
  EXPECT_EQ(out.read(), in.read());
  pg_->barrier();
}

TEST_F(NcclGpuTest, AsyncWorkCompletesInCallOrder) {
  DeviceFloats a(1 << 20);
  a.fill(std::vector<float>(1 << 20, 1.0f));
  std::vector<std::unique_ptr<Work>> w;
  for (int i = 0; i < 10; ++i) w.push_back(pg_->iall_reduce(a.t()));
  w.push_back(pg_->ibarrier());
  w.back()->wait(milliseconds(60000));
  for (auto& x : w) EXPECT_TRUE(x->is_completed());
  for (auto& x : w) x->wait(milliseconds(1));
  EXPECT_EQ(a.read()[12345], 1.0f);
}

TEST_F(NcclGpuTest, SendAndReceiveToItselfGoAsOneNcclGroup) {
  DeviceFloats a(64), b(64);
  a.fill(std::vector<float>(64, 9.0f));
  auto s = pg_->isend(a.t(), 0);
  auto r = pg_->irecv(b.t(), 0);
  r->wait(milliseconds(60000));
  s->wait(milliseconds(60000));
  EXPECT_EQ(b.read(), a.read());
}

TEST_F(NcclGpuTest, CpuTensorsAndBitwiseOpsAreClearErrors) {
  std::vector<float> host(4, 1.0f);
  try {
    pg_->all_reduce(Tensor::of(host));
    FAIL() << "a CPU tensor was accepted";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_reduce #0 on group 'world'"));
    EXPECT_THAT(e.what(), HasSubstr("CPU tensor"));
  }
  DeviceFloats a(4);
  a.fill(host);
  try {
    pg_->all_reduce(a.t(), ReduceOp::kBxor);
    FAIL() << "bxor was accepted";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no bitwise reductions"));
  }
  pg_->all_reduce(a.t());  // still usable
  EXPECT_EQ(a.read(), host);
}

TEST_F(NcclGpuTest, SubGroupsSplitTheCommunicator) {
  auto sub = pg_->new_group({0});
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->name(), "world/1");
  DeviceFloats a(16);
  a.fill(std::vector<float>(16, 4.0f));
  sub->all_reduce(a.t(), ReduceOp::kAvg);
  EXPECT_EQ(a.read()[3], 4.0f);
}

TEST_F(NcclGpuTest, TheDebugArgumentCheckRunsOverGloo) {
  setenv("DLAUNCH_NCCL_CHECK", "1", 1);
  auto checked = make_process_group(
      "nccl", std::make_shared<store::HashStore>(), 0, 1, milliseconds(60000));
  unsetenv("DLAUNCH_NCCL_CHECK");
  DeviceFloats a(16);
  a.fill(std::vector<float>(16, 1.0f));
  checked->all_reduce(a.t());
  EXPECT_EQ(a.read()[0], 1.0f);
}

}  // namespace
}  // namespace dlaunch::comm
