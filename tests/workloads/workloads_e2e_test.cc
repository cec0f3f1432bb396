// Each workload as real processes under build/bin/dlaunch with 2 and 4
// ranks: the launcher's env contract, comm::init_process_group over the TCP
// store and Gloo over loopback.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/testing/bin.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "workloads/checkpoint.h"
#include "workloads/idx.h"
#include "workloads/replica.h"

namespace dlaunch::workloads {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kTimeout = std::chrono::seconds(120);

using ::dlaunch::testing::bin;
using ::dlaunch::testing::describe;

// Runs `args` under dlaunch with `nproc` workers on this node.
testing::CommandResult launch(
    int nproc, std::vector<std::string> args,
    std::vector<std::string> launcher_flags = {},
    const std::map<std::string, std::string>& env = {}) {
  testing::CommandOptions o;
  o.argv = {bin("dlaunch"), "--nproc-per-node", std::to_string(nproc)};
  o.argv.insert(o.argv.end(), launcher_flags.begin(), launcher_flags.end());
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = env;
  o.env["DLAUNCH_COMM_TIMEOUT"] = "60";
  return testing::run_command(o, kTimeout);
}

class Nproc : public ::testing::TestWithParam<int> {};

TEST_P(Nproc, P2p) {
  auto r = launch(GetParam(), {bin("dl-p2p")});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("blocking: rank 1 has data 1"));
  EXPECT_THAT(r.out, HasSubstr("non-blocking: rank 1 has data 1"));
  EXPECT_THAT(r.out, HasSubstr("blocking: rank 0 has data 1"));
  // Ranks on one host: point to point through shared memory.
  EXPECT_THAT(r.out, HasSubstr("blocking: rank 1 has data 1 (path shm-p2p)"));
}

TEST_P(Nproc, P2pPingPong) {
  auto r = launch(GetParam(), {bin("dl-p2p"), "--ping-pong", "-b", "8", "-e",
                               "64K", "-n", "5", "-w", "1"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("latency(us)"));
  EXPECT_THAT(r.out, HasSubstr("32768"));  // 8 * 4^6
  EXPECT_THAT(r.out, Not(HasSubstr("WRONG")));
}

TEST_P(Nproc, Collectives) {
  auto r = launch(GetParam(), {bin("dl-collectives")});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("PASS all_reduce(sum) float32 on world(" +
                               std::to_string(GetParam()) + ")"));
  EXPECT_THAT(r.out,
              HasSubstr("PASS reduce_scatter(sum) float32 on group{0,1}"));
  EXPECT_THAT(r.out, HasSubstr("all collectives passed"));
  EXPECT_THAT(r.out, Not(HasSubstr("FAIL")));
}

TEST_P(Nproc, RingAllReduce) {
  auto r = launch(GetParam(), {bin("dl-ring-allreduce"), "--count", "100"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("PASS ring all-reduce on " +
                               std::to_string(GetParam()) + " ranks"));
  EXPECT_THAT(r.out, HasSubstr("matches all_reduce (send/recv path shm-p2p)"));
}

TEST_P(Nproc, Bench) {
  auto r = launch(GetParam(), {bin("dl-bench"), "-b", "64", "-e", "64K", "-f",
                               "32", "-n", "2", "-w", "1"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("# all_reduce: " + std::to_string(GetParam())));
  EXPECT_THAT(r.out, HasSubstr("# sendrecv"));
  EXPECT_THAT(r.out, HasSubstr("Out of bounds values : 0 OK"));
  // Ranks on one host: small collectives travel with the argument check.
  EXPECT_THAT(r.out, HasSubstr("#  path: shm-check"));
}

// -o pingpong: ranks 0 and 1 bounce one buffer (checked on both); dl-bench
// names the path, and DLAUNCH_COMM_SHM_MIN_BYTES=off forces TCP.
TEST(BenchPingPong, RunsBetweenRanksZeroAndOneAndNamesItsPath) {
  for (const char* shm : {"", "off"}) {
    auto r = launch(3,
                    {bin("dl-bench"), "-b", "8", "-e", "4K", "-f", "512", "-n",
                     "3", "-w", "1", "-o", "pingpong,broadcast"},
                    {}, {{"DLAUNCH_COMM_SHM_MIN_BYTES", shm}});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_THAT(r.out, HasSubstr("# pingpong: 3 ranks"));
    EXPECT_THAT(r.out, HasSubstr("Out of bounds values : 0 OK"));
    EXPECT_THAT(r.out, HasSubstr(*shm ? "#  path: tcp" : "#  path: shm-p2p"));
    if (!*shm) {
      EXPECT_THAT(r.out, HasSubstr("#  path: shm-check"));
    }
    if (*shm) {
      EXPECT_THAT(r.out, Not(HasSubstr("shm-")));
    }
  }
}

// DLAUNCH_COMM_CMA=on on one rank only: the group agrees to keep single
// copy off. Each rank once decided alone: the ranks' channel posts drifted
// apart, a 4 MiB broadcast hung until the timeout or the next call read a
// stale slot ("rank 1 called broadcast while rank 0 called all_reduce").
TEST(BenchSingleCopy, OneRankAskingForItKeepsItOffForTheGroup) {
  for (const char* on_rank : {"0", "1"}) {
    auto r = launch(2, {"sh", "-c",
                        std::string("if [ \"$RANK\" = ") + on_rank +
                            " ]; then export DLAUNCH_COMM_CMA=on; fi; exec " +
                            bin("dl-bench") +
                            " -o all_reduce,broadcast,gather,broadcast -b 4M "
                            "-e 4M -n 3 -w 1"});
    ASSERT_EQ(r.exit_code, 0) << "on rank " << on_rank << ": " << describe(r);
    EXPECT_THAT(r.out, HasSubstr("Out of bounds values : 0 OK"));
    EXPECT_THAT(r.out, Not(HasSubstr("shm-cma")));
  }
}

TEST_P(Nproc, SgdSubset) {
  if (!fs::exists(fs::path(kDefaultDataDir) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  testing::TempDir dir("dl-sgd-e2e");
  auto r = launch(GetParam(), {bin("dl-sgd"), "--epochs", "2", "--limit-train",
                               "4000", "--limit-test", "1000",
                               "--checkpoint-dir", (dir / "ckpt").string()});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("epoch 1/2 loss "));
  EXPECT_THAT(r.out, HasSubstr("epoch 2/2 loss "));
  EXPECT_THAT(r.out, HasSubstr(" test_acc "));
  EXPECT_EQ(load_checkpoint(dir / "ckpt")->epoch, 2);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Nproc, ::testing::Values(2, 4));

// Rank 0 fails after epoch 2; dlaunch restarts the group, which resumes
// from the checkpoint and ends with the weights of an uninterrupted run.
TEST(SgdUnderDlaunch, RestartResumesFromCheckpoint) {
  if (!fs::exists(fs::path(kDefaultDataDir) / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  testing::TempDir dir("dl-sgd-e2e");
  std::vector<std::string> common = {
      bin("dl-sgd"), "--epochs",     "3",  "--limit-train",
      "2000",        "--limit-test", "500"};
  auto full_args = common;
  full_args.insert(full_args.end(),
                   {"--checkpoint-dir", (dir / "full").string()});
  auto full = launch(2, full_args);
  ASSERT_EQ(full.exit_code, 0) << describe(full);

  auto failing_args = common;
  failing_args.insert(failing_args.end(),
                      {"--checkpoint-dir", (dir / "restarted").string(),
                       "--exit-after-epoch", "2"});
  auto restarted = launch(2, failing_args, {"--max-restarts", "1"});
  ASSERT_EQ(restarted.exit_code, 0) << describe(restarted);
  EXPECT_THAT(restarted.err + restarted.out,
              HasSubstr("--exit-after-epoch 2: exiting"));
  EXPECT_THAT(restarted.out, HasSubstr("resuming after epoch 2"));
  EXPECT_THAT(restarted.out, HasSubstr("epoch 3/3"));

  auto a = load_checkpoint(dir / "full");
  auto b = load_checkpoint(dir / "restarted");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->epoch, 3);
  EXPECT_EQ(a->params, b->params);
  EXPECT_EQ(a->momentum, b->momentum);
}

// Started without the launcher, a worker that needs a world says how to
// start it.
TEST(WorkloadsAlone, NeedTheLauncher) {
  testing::CommandOptions o;
  o.argv = {bin("dl-collectives")};
  o.unset_env = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  auto r = testing::run_command(o, kTimeout);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("dlaunch --nproc-per-node 2"));
}

// One line each, naming the flag, the value and the valid range (CLI11's
// own checks printed "not in range 0.000000 to 17976931348623157...").
TEST(WorkloadsAlone, BadFlagsExit2) {
  const std::string positive = "is not valid; use a whole number from 1 to ";
  struct Case {
    std::vector<std::string> argv;
    std::string expect = "";
  };
  for (const Case& c : std::vector<Case>{
           {{bin("dl-bench"), "-b", "12Q"}},
           {{bin("dl-bench"), "-d", "float32"}},
           {{bin("dl-bench"), "-o", "allreduce"},
            "-o: unknown operation 'allreduce'; valid: all, "},
           {{bin("dl-bench"), "-o", "all_reduce,nosuch"},
            "-o: unknown operation 'nosuch'; valid: all, "},
           {{bin("dl-bench"), "-n", "0"}, "--iters: '0' " + positive},
           {{bin("dl-bench"), "-w", "-1"},
            "--warmup_iters: '-1' is not valid; use a whole number from 0 to "
            "2147483647"},
           {{bin("dl-p2p"), "-n", "x"}, "--iters: 'x' " + positive},
           {{bin("dl-ring-allreduce"), "--count", "0"},
            "--count: '0' " + positive},
           {{bin("dl-sgd"), "--epochs", "0"},
            "--epochs: '0' " + positive + "2147483647"},
           {{bin("dl-sgd"), "--epochs", "99999999999"}, "'99999999999' "},
           {{bin("dl-sgd"), "--batch-size", "-3"}, "--batch-size: '-3' "},
           {{bin("dl-sgd"), "--nosuch"}, "dl-sgd: "},
           {{bin("dl-sgd"), "--backend", "mpi"}},
           {{bin("dl-sgd"), "--device", "tpu"}},
           {{bin("dl-sgd"), "--device", "cuda", "--backend", "gloo"}},
           {{bin("dl-sgd"), "--device", "cpu", "--backend", "nccl"}}}) {
    testing::CommandOptions o;
    o.argv = c.argv;
    o.unset_env = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
    auto r = testing::run_command(o, kTimeout);
    const std::string what = c.argv[0] + " " + c.argv[1];
    EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.err;
    EXPECT_FALSE(r.err.empty());
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << what;
  }
}

TEST(WorkloadsAlone, SgdRunsInOneProcessAndNamesMissingData) {
  testing::TempDir dir("dl-sgd-alone");
  testing::CommandOptions o;
  o.argv = {bin("dl-sgd"), "--data", (dir / "nothing").string()};
  o.unset_env = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID"};
  auto r = testing::run_command(o, kTimeout);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr((dir / "nothing").string()));
  EXPECT_THAT(r.err, HasSubstr("dataset-fashion-mnist"));
}

// dl-sgd --device cuda where it cannot train on a GPU (no device here, or
// a build without CUDA): status 1 before any data is read, naming the fix.
TEST(WorkloadsAlone, SgdOnCudaWithoutADeviceNamesTheFix) {
  if (cuda_unavailable().empty()) GTEST_SKIP() << "a CUDA device is visible";
  testing::TempDir dir("dl-sgd-cuda");
  testing::CommandOptions o;
  o.argv = {bin("dl-sgd"), "--device", "cuda", "--data",
            (dir / "nothing").string()};
  o.unset_env = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID"};
  auto r = testing::run_command(o, kTimeout);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("dl-sgd: error: --device cuda: "));
  EXPECT_THAT(r.err, HasSubstr("--device cpu"));
  EXPECT_THAT(r.err, Not(HasSubstr("nothing")));  // failed before the data
}

}  // namespace
}  // namespace dlaunch::workloads
