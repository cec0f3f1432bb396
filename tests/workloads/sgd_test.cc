#include "workloads/sgd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>

#include "tests/testing/temp_dir.h"
#include "tests/workloads/synthetic_data.h"
#include "workloads/checkpoint.h"
#include "workloads/replica.h"

namespace dlaunch::workloads {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using testing::synthetic;

class SgdTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }
  ::dlaunch::testing::TempDir tmp_{"dl-sgd-test"};
  fs::path dir_;
};

TEST(EpochOrderTest, PartitionsAreDisjointEqualAndSeeded) {
  const size_t n = 103;
  std::set<uint32_t> seen;
  for (int r = 0; r < 4; ++r) {
    std::vector<uint32_t> o = epoch_order(n, 7, 0, r, 4);
    EXPECT_EQ(o.size(), 25u);  // 103 / 4, remainder unused
    seen.insert(o.begin(), o.end());
    // The same part in another epoch is a reshuffle of the same samples.
    std::vector<uint32_t> o2 = epoch_order(n, 7, 1, r, 4);
    EXPECT_NE(o, o2);
    EXPECT_EQ(std::set<uint32_t>(o.begin(), o.end()),
              std::set<uint32_t>(o2.begin(), o2.end()));
    EXPECT_EQ(o, epoch_order(n, 7, 0, r, 4));
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_NE(epoch_order(n, 8, 0, 0, 4), epoch_order(n, 7, 0, 0, 4));
}

TEST(PrepareTest, NormalisesAndLimits) {
  Dataset d;
  d.n = 3;
  d.rows = 1;
  d.cols = 2;
  d.images = {0, 255, 128, 0, 1, 2};
  d.labels = {4, 5, 6};
  TrainData t = prepare(d, 2);
  EXPECT_EQ(t.n, 2u);
  EXPECT_EQ(t.dim, 2u);
  ASSERT_EQ(t.x.size(), 4u);
  EXPECT_NEAR(t.x[0], -0.1307f / 0.3081f, 1e-6);
  EXPECT_NEAR(t.x[1], (1.0f - 0.1307f) / 0.3081f, 1e-6);
  EXPECT_EQ(t.y, (std::vector<uint8_t>{4, 5}));
}

TEST_F(SgdTest, LearnsSyntheticClasses) {
  TrainData train = synthetic(4000, 50, 1);
  TrainData test = synthetic(500, 50, 2);
  SgdOptions o;
  o.epochs = 3;
  o.lr = 0.05f;
  std::vector<EpochStats> seen;
  o.on_epoch = [&](const EpochStats& s) { seen.push_back(s); };
  SgdResult r = train_sgd(nullptr, train, test, o);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2].epoch, 3);
  EXPECT_EQ(seen[2].epochs, 3);
  EXPECT_LT(seen[2].loss, seen[0].loss);
  EXPECT_GT(seen[2].test_acc, 0.9);
  EXPECT_GT(seen[2].samples_per_s, 0);
  EXPECT_EQ(r.history.size(), 3u);
  EXPECT_EQ(r.resumed_epoch, 0);
}

// Stopped after epoch 2 and restarted with the same checkpoint folder, a run
// ends with exactly the weights of an uninterrupted one.
TEST_F(SgdTest, ResumeMatchesUninterrupted) {
  TrainData train = synthetic(600, 40, 3);
  TrainData test = synthetic(100, 40, 4);
  SgdOptions o;
  o.epochs = 4;
  o.checkpoint_dir = dir_ / "full";
  SgdResult full = train_sgd(nullptr, train, test, o);
  ASSERT_EQ(load_checkpoint(dir_ / "full")->epoch, 4);

  o.checkpoint_dir = dir_ / "split";
  o.epochs = 2;
  SgdResult first = train_sgd(nullptr, train, test, o);
  EXPECT_EQ(first.history.size(), 2u);
  EXPECT_NE(first.params, full.params);
  o.epochs = 4;
  SgdResult second = train_sgd(nullptr, train, test, o);
  EXPECT_EQ(second.resumed_epoch, 2);
  ASSERT_EQ(second.history.size(), 2u);
  EXPECT_EQ(second.history[0].epoch, 3);
  EXPECT_EQ(second.params, full.params);
  std::optional<Checkpoint> c = load_checkpoint(dir_ / "split");
  EXPECT_EQ(c->params, full.params);

  // A finished run restarted again trains nothing and keeps its weights.
  SgdResult third = train_sgd(nullptr, train, test, o);
  EXPECT_EQ(third.resumed_epoch, 4);
  EXPECT_TRUE(third.history.empty());
  EXPECT_EQ(third.params, full.params);
}

TEST_F(SgdTest, ResumeWithOtherSeedIsAnError) {
  TrainData train = synthetic(100, 20, 3);
  SgdOptions o;
  o.epochs = 1;
  o.checkpoint_dir = dir_;
  train_sgd(nullptr, train, train, o);
  o.seed = 99;
  o.epochs = 2;
  try {
    train_sgd(nullptr, train, train, o);
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("--seed 1234"));
    EXPECT_THAT(e.what(), HasSubstr(checkpoint_path(dir_).string()));
  }
}

// Without a device (or CUDA in the build) --device cuda fails at once,
// saying why and naming --device cpu.
TEST(SgdDeviceTest, CudaWithoutADeviceNamesTheFix) {
  const std::string why = cuda_unavailable();
  if (why.empty()) GTEST_SKIP() << "a CUDA device is visible (gpu tests)";
#ifdef DLAUNCH_WITH_CUDA
  EXPECT_THAT(why, HasSubstr("no CUDA device is visible"));
  EXPECT_THAT(why, HasSubstr("cudaGetDeviceCount"));
#else
  EXPECT_THAT(why, HasSubstr("DLAUNCH_WITH_CUDA=OFF"));
#endif
  EXPECT_THAT(why, HasSubstr("--device cpu"));
  TrainData d = synthetic(64, 20, 1);
  SgdOptions o;
  o.epochs = 1;
  o.device = comm::DeviceType::kCuda;
  try {
    train_sgd(nullptr, d, d, o);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(e.what(), why);
  }
}

TEST(SgdRealDataTest, FashionMnistSubsetLearns) {
  if (!fs::exists(fs::path(kDefaultDataDir) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  TrainData train = prepare(load_mnist_split(kDefaultDataDir, "train"), 5000);
  TrainData test = prepare(load_mnist_split(kDefaultDataDir, "t10k"), 2000);
  SgdOptions o;
  o.epochs = 2;
  SgdResult r = train_sgd(nullptr, train, test, o);
  ASSERT_EQ(r.history.size(), 2u);
  // Chance is 0.1; two epochs over 5000 samples reach well above 0.6.
  EXPECT_GT(r.history[1].test_acc, 0.6);
  EXPECT_LT(r.history[1].loss, r.history[0].loss);
}

}  // namespace
}  // namespace dlaunch::workloads
