// dl-sgd's CUDA replica on a real GPU against the CPU one: the same data,
// order, initialisation and batch give the same losses, weights (within
// float rounding) and test accuracy; checkpoints move between them. Each
// test skips, saying why, without a GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "comm/init.h"
#include "comm/store/hash_store.h"
#include "tests/testing/temp_dir.h"
#include "tests/workloads/synthetic_data.h"
#include "workloads/checkpoint.h"
#include "workloads/replica.h"
#include "workloads/sgd.h"

namespace dlaunch::workloads {
namespace {

namespace fs = std::filesystem;
using testing::synthetic;

class SgdCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("DLAUNCH_CUDA_DEVICE");
    unsetenv("LOCAL_RANK");
    if (std::string why = cuda_unavailable(); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

TEST_F(SgdCudaTest, MatchesTheCpuReplicaOnSyntheticData) {
  TrainData train = synthetic(3000, 60, 1);
  TrainData test = synthetic(700, 60, 2);  // 700: a short last eval chunk
  SgdOptions o;
  o.epochs = 3;
  o.lr = 0.05f;
  o.global_batch = 100;  // 3000 / 100 steps, then 30 of 64 below
  SgdResult cpu = train_sgd(nullptr, train, test, o);
  o.device = comm::DeviceType::kCuda;
  SgdResult gpu = train_sgd(nullptr, train, test, o);
  ASSERT_EQ(gpu.history.size(), 3u);
  for (size_t e = 0; e < 3; ++e) {
    EXPECT_NEAR(gpu.history[e].loss, cpu.history[e].loss,
                1e-3 * cpu.history[e].loss)
        << "epoch " << e + 1;
    EXPECT_NEAR(gpu.history[e].test_acc, cpu.history[e].test_acc, 0.005);
  }
  EXPECT_GT(gpu.history[2].test_acc, 0.9);
  EXPECT_LT(max_abs_diff(gpu.params, cpu.params), 1e-3);

  // A batch that does not divide the data: a shorter last step.
  o.global_batch = 64;
  SgdResult gpu64 = train_sgd(nullptr, train, test, o);
  o.device = comm::DeviceType::kCpu;
  SgdResult cpu64 = train_sgd(nullptr, train, test, o);
  EXPECT_LT(max_abs_diff(gpu64.params, cpu64.params), 1e-3);
}

// A checkpoint written by the CUDA replica resumes on it (and is the same
// layout as the CPU's): two runs of one epoch end where one of two does.
TEST_F(SgdCudaTest, ResumesFromItsCheckpoint) {
  ::dlaunch::testing::TempDir tmp("sgd-cuda-test");
  TrainData train = synthetic(1000, 40, 3);
  TrainData test = synthetic(200, 40, 4);
  SgdOptions o;
  o.device = comm::DeviceType::kCuda;
  o.epochs = 2;
  SgdResult full = train_sgd(nullptr, train, test, o);
  o.checkpoint_dir = tmp.path() / "split";
  o.epochs = 1;
  train_sgd(nullptr, train, test, o);
  ASSERT_EQ(load_checkpoint(o.checkpoint_dir)->epoch, 1);
  o.epochs = 2;
  SgdResult second = train_sgd(nullptr, train, test, o);
  EXPECT_EQ(second.resumed_epoch, 1);
  EXPECT_LT(max_abs_diff(second.params, full.params), 1e-6);
  // The CPU replica continues from the same file.
  o.device = comm::DeviceType::kCpu;
  o.epochs = 3;
  SgdResult cpu = train_sgd(nullptr, train, test, o);
  EXPECT_EQ(cpu.resumed_epoch, 2);
  EXPECT_EQ(cpu.history.size(), 1u);
}

// Through a one-rank nccl group: the checkpoint header and state go through
// device memory (host_collective, Replica::state).
TEST_F(SgdCudaTest, TrainsOverAOneRankNcclGroup) {
  ::dlaunch::testing::TempDir tmp("sgd-cuda-nccl");
  auto store = std::make_shared<comm::store::HashStore>();
  auto pg = comm::make_process_group("nccl", store, 0, 1,
                                     std::chrono::milliseconds(60000));
  TrainData train = synthetic(1000, 40, 5);
  TrainData test = synthetic(200, 40, 6);
  SgdOptions o;
  o.device = comm::DeviceType::kCuda;
  o.epochs = 1;
  o.checkpoint_dir = tmp.path();
  SgdResult one = train_sgd(pg.get(), train, test, o);
  o.epochs = 2;
  SgdResult two = train_sgd(pg.get(), train, test, o);
  EXPECT_EQ(two.resumed_epoch, 1);
  ASSERT_EQ(two.history.size(), 1u);
  EXPECT_GT(two.history[0].test_acc, 0.5);
  // A CPU run of the same group is refused, naming the backend.
  o.device = comm::DeviceType::kCpu;
  EXPECT_THROW(train_sgd(pg.get(), train, test, o), std::invalid_argument);
}

// The bar: one epoch of Fashion-MNIST on the GPU within 0.5 points
// of the CPU's test accuracy. The data: $DLAUNCH_FASHION_MNIST (where
// scripts/gpu-check unpacked it), else Debian's folder.
TEST_F(SgdCudaTest, FashionMnistEpochWithinHalfAPointOfTheCpu) {
  const char* env = std::getenv("DLAUNCH_FASHION_MNIST");
  const fs::path dir = env && *env ? env : kDefaultDataDir;
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "no Fashion-MNIST in " << dir
                 << " (install dataset-fashion-mnist or set "
                    "DLAUNCH_FASHION_MNIST)";
  }
  TrainData train = prepare(load_mnist_split(dir, "train"));
  TrainData test = prepare(load_mnist_split(dir, "t10k"));
  SgdOptions o;
  o.epochs = 1;
  SgdResult cpu = train_sgd(nullptr, train, test, o);
  o.device = comm::DeviceType::kCuda;
  SgdResult gpu = train_sgd(nullptr, train, test, o);
  EXPECT_NEAR(gpu.history[0].test_acc, cpu.history[0].test_acc, 0.005);
  EXPECT_GT(gpu.history[0].test_acc, 0.7);
}

}  // namespace
}  // namespace dlaunch::workloads
