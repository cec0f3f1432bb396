#include "workloads/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/testing/temp_dir.h"

namespace dlaunch::workloads {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }

  static Checkpoint sample() {
    Checkpoint c;
    c.epoch = 3;
    c.seed = 0x123456789abcdefull;
    c.world_size = 4;
    c.shape = {5, 3, 2};
    c.params = {1.5f, -2.25f, 0.0f, 3e-8f, -1e20f};
    c.momentum = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    return c;
  }

  ::dlaunch::testing::TempDir tmp_{"dl-ckpt-test"};
  fs::path dir_;
};

TEST_F(CheckpointTest, NoneWhenAbsent) {
  EXPECT_FALSE(load_checkpoint(dir_).has_value());
  EXPECT_FALSE(load_checkpoint(dir_ / "not-created").has_value());
}

TEST_F(CheckpointTest, RoundTripAndOverwrite) {
  Checkpoint c = sample();
  save_checkpoint(dir_ / "sub", c);  // creates the folder
  std::optional<Checkpoint> r = load_checkpoint(dir_ / "sub");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->epoch, 3);
  EXPECT_EQ(r->seed, c.seed);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->shape.in, 5);
  EXPECT_EQ(r->shape.hidden, 3);
  EXPECT_EQ(r->shape.out, 2);
  EXPECT_EQ(r->params, c.params);
  EXPECT_EQ(r->momentum, c.momentum);

  c.epoch = 4;
  c.params[0] = 9.0f;
  save_checkpoint(dir_ / "sub", c);
  r = load_checkpoint(dir_ / "sub");
  EXPECT_EQ(r->epoch, 4);
  EXPECT_EQ(r->params[0], 9.0f);
  // Only the checkpoint remains: no temporary files left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "sub")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(CheckpointTest, CorruptByteFailsChecksum) {
  save_checkpoint(dir_, sample());
  fs::path p = checkpoint_path(dir_);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(50);
    f.put('\x7f');
  }
  try {
    load_checkpoint(dir_);
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr(p.string()));
    EXPECT_THAT(e.what(), HasSubstr("checksum"));
  }
}

TEST_F(CheckpointTest, TruncatedOrForeignFile) {
  save_checkpoint(dir_, sample());
  fs::path p = checkpoint_path(dir_);
  fs::resize_file(p, 30);
  EXPECT_THROW(load_checkpoint(dir_), CheckpointError);
  std::ofstream(p, std::ios::trunc) << "hello world, not a checkpoint";
  try {
    load_checkpoint(dir_);
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a dl-sgd checkpoint"));
  }
}

TEST_F(CheckpointTest, UnwritableFolderNamesPath) {
  fs::path file = dir_ / "plain-file";
  std::ofstream(file) << "x";
  try {
    save_checkpoint(file / "ckpt", sample());
    FAIL() << "no exception";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr((file / "ckpt").string()));
  }
}

}  // namespace
}  // namespace dlaunch::workloads
