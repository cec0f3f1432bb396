// The workloads' communication code over real Gloo groups: N threads, one
// rank each, joined through an in-process HashStore.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>

#include "tests/comm/rank_threads.h"
#include "tests/workloads/synthetic_data.h"
#include "workloads/bench.h"
#include "workloads/collectives.h"
#include "workloads/op_runner.h"
#include "workloads/p2p.h"
#include "workloads/ring_allreduce.h"
#include "workloads/sgd.h"

namespace dlaunch::workloads {
namespace {

using comm::ProcessGroup;
using comm::testing::run_ranks;
using ::testing::HasSubstr;
using ::testing::Not;

class WorldSizes : public ::testing::TestWithParam<int> {};

TEST_P(WorldSizes, CollectivesAllPass) {
  const int n = GetParam();
  std::vector<std::string> outs(n);
  std::vector<int> failed(n, -1);
  run_ranks(n, [&](ProcessGroup& pg) {
    std::ostringstream out;
    failed[pg.rank()] = run_collectives(pg, out);
    outs[pg.rank()] = out.str();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(failed[r], 0) << outs[r];
  EXPECT_THAT(outs[0], HasSubstr("PASS all_reduce(sum) float32 on world"));
  EXPECT_THAT(outs[0], HasSubstr("PASS all_to_all float32 on group"));
  EXPECT_THAT(outs[0], HasSubstr("PASS barrier on group"));
  EXPECT_THAT(outs[0], Not(HasSubstr("FAIL")));
  // Each rank says what it holds; ranks outside {0, 1} only on the world.
  EXPECT_THAT(outs[n - 1],
              HasSubstr("rank " + std::to_string(n - 1) + " world(" +
                        std::to_string(n) + ") broadcast float32: ["));
  if (n > 2) {
    EXPECT_THAT(outs[n - 1], Not(HasSubstr("group{0,1}")));
  }
}

TEST_P(WorldSizes, RingAllReduceMatchesAllReduce) {
  const int n = GetParam();
  run_ranks(n, [&](ProcessGroup& pg) {
    std::vector<float> send(37), ring(37), ref;
    for (size_t i = 0; i < send.size(); ++i) {
      send[i] = static_cast<float>(pg.rank() * 3 + i % 7);
    }
    ring_all_reduce(pg, send, ring);
    ref = send;
    pg.all_reduce(comm::Tensor::of(ref));
    EXPECT_EQ(ring, ref) << "rank " << pg.rank();
  });
}

// dl-bench's yardstick for large sizes: a rate, not a timing assertion.
TEST(BenchMemcpyTest, MeasuresARate) {
  const double gbs = memcpy_gbs(1 << 20, 2);
  EXPECT_GT(gbs, 0.0);
  EXPECT_TRUE(std::isfinite(gbs));
}

TEST_P(WorldSizes, BenchSweepHasNoWrongValues) {
  const int n = GetParam();
  std::string table;
  std::vector<int64_t> wrong(n, -1);
  run_ranks(n, [&](ProcessGroup& pg) {
    BenchOptions o;
    o.min_bytes = 8;
    o.max_bytes = 4096;
    o.factor = 8;
    o.iters = 2;
    o.warmup = 1;
    std::ostringstream out;
    wrong[pg.rank()] = run_bench(pg, o, out);
    if (pg.rank() == 0) table = out.str();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(wrong[r], 0) << table;
  // One row per size for all_reduce: 8, 64, 512, 4096.
  EXPECT_THAT(table, HasSubstr("# all_reduce: " + std::to_string(n)));
  EXPECT_THAT(
      table, HasSubstr("          64            16     float     sum      -1"));
  EXPECT_THAT(
      table, HasSubstr("        4096          1024     float    none       0"));
}

INSTANTIATE_TEST_SUITE_P(Ranks, WorldSizes, ::testing::Values(1, 2, 3, 4));

// Every dtype and reduction through the runner's check, on 3 ranks.
TEST(OpRunnerTest, EveryDtypeAndReduction) {
  run_ranks(3, [&](ProcessGroup& pg) {
    for (comm::DType t :
         {comm::DType::kF32, comm::DType::kF64, comm::DType::kF16,
          comm::DType::kBF16, comm::DType::kI8, comm::DType::kU8,
          comm::DType::kI32, comm::DType::kI64}) {
      for (comm::ReduceOp op :
           {comm::ReduceOp::kSum, comm::ReduceOp::kProduct,
            comm::ReduceOp::kMin, comm::ReduceOp::kMax, comm::ReduceOp::kAvg}) {
        for (BenchOp b :
             {BenchOp::kAllReduce, BenchOp::kReduceScatter, BenchOp::kReduce}) {
          OpRunner r(pg, b, 33, t, op, 1);
          r.fill();
          r.run();
          EXPECT_EQ(r.wrong(), 0)
              << bench_op_name(b) << " " << comm::dtype_name(t) << " "
              << comm::reduce_op_name(op) << " rank " << pg.rank() << " "
              << r.describe(40);
        }
      }
    }
  });
}

// The check itself can fail: a rank that skips the operation keeps its
// sentinel and is counted wrong.
TEST(OpRunnerTest, DetectsWrongResult) {
  run_ranks(2, [&](ProcessGroup& pg) {
    OpRunner r(pg, BenchOp::kAllGather, 8, comm::DType::kF32,
               comm::ReduceOp::kSum, 0);
    r.fill();
    EXPECT_EQ(r.wrong(), 8);  // not run: every value is the sentinel
    r.run();
    EXPECT_EQ(r.wrong(), 0);
  });
}

TEST(P2pTest, SeedsExamplesAndPingPong) {
  std::vector<std::string> outs(3);
  run_ranks(3, [&](ProcessGroup& pg) {
    std::ostringstream out;
    float a = p2p_blocking(pg, out);
    float b = p2p_nonblocking(pg, out);
    EXPECT_EQ(a, pg.rank() <= 1 ? 1.0f : 0.0f);
    EXPECT_EQ(b, pg.rank() <= 1 ? 1.0f : 0.0f);
    std::vector<PingPongRow> rows = ping_pong(pg, {1, 1000, 100000}, 3, 1);
    ASSERT_EQ(rows.size(), 3u);
    if (pg.rank() <= 1) {
      for (const PingPongRow& r : rows) {
        EXPECT_TRUE(r.ok);
        EXPECT_GT(r.latency_us, 0);
      }
    }
    outs[pg.rank()] = out.str();
  });
  EXPECT_THAT(outs[1], HasSubstr("blocking: rank 1 has data 1"));
  EXPECT_THAT(outs[1], HasSubstr("non-blocking: rank 1 has data 1"));
  EXPECT_THAT(outs[2], HasSubstr("blocking: rank 2 has data 0"));
}

using testing::synthetic;

// N ranks with global batch B end with the weights of one rank with batch B
// stepping through the same samples: batch k of the single rank is the
// concatenation of batch k of every rank.
void check_equivalence(int n, bool per_parameter) {
  // 1000 samples: 1000/n per rank is not a multiple of the per-rank batch,
  // so the last, partial batch is covered too.
  TrainData train = synthetic(1000, 64, 5);
  TrainData test = synthetic(200, 64, 6);
  SgdOptions o;
  o.epochs = 2;
  o.global_batch = 32;
  o.per_parameter = per_parameter;

  std::vector<float> multi;
  std::mutex mu;
  run_ranks(n, [&](ProcessGroup& pg) {
    SgdResult r = train_sgd(&pg, train, test, o);
    if (pg.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      multi = r.params;
    }
  });

  const int per_rank = o.global_batch / n;
  SgdOptions single = o;
  single.order = [&](int epoch) {
    std::vector<std::vector<uint32_t>> parts;
    for (int r = 0; r < n; ++r) {
      parts.push_back(epoch_order(train.n, o.seed, epoch, r, n));
    }
    std::vector<uint32_t> order;
    for (size_t s = 0; s < parts[0].size(); s += per_rank) {
      for (int r = 0; r < n; ++r) {
        size_t end = std::min(parts[r].size(), s + per_rank);
        order.insert(order.end(), parts[r].begin() + s, parts[r].begin() + end);
      }
    }
    return order;
  };
  SgdResult one = train_sgd(nullptr, train, test, single);
  ASSERT_EQ(one.params.size(), multi.size());
  double max_rel = 0;
  for (size_t i = 0; i < multi.size(); ++i) {
    double d = std::abs(static_cast<double>(multi[i]) - one.params[i]);
    max_rel =
        std::max(max_rel, d / std::max(1e-3, std::abs(1.0 * one.params[i])));
  }
  EXPECT_LT(max_rel, 1e-4) << n << " ranks";
  // Not trivially equal to the initial weights.
  Mlp init(MlpShape{64, 128, 10});
  init.init(o.seed);
  EXPECT_NE(std::vector<float>(init.params().begin(), init.params().end()),
            one.params);
}

TEST(SgdEquivalenceTest, TwoRanksMatchOneRank) { check_equivalence(2, false); }
TEST(SgdEquivalenceTest, FourRanksMatchOneRank) { check_equivalence(4, false); }
TEST(SgdEquivalenceTest, PerParameterFourRanksMatchOneRank) {
  check_equivalence(4, true);
}

// --device cuda all-reduces over nccl: a gloo group is refused before any
// device is touched, naming the flag that fixes it.
TEST(SgdDeviceTest, CudaWithAGlooGroupNamesTheBackend) {
  TrainData d = testing::synthetic(64, 20, 1);
  SgdOptions o;
  o.epochs = 1;
  o.device = comm::DeviceType::kCuda;
  run_ranks(2, [&](ProcessGroup& pg) {
    try {
      train_sgd(&pg, d, d, o);
      ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("the group is 'gloo'"));
      EXPECT_THAT(e.what(), HasSubstr("pass --backend nccl"));
    }
  });
}

}  // namespace
}  // namespace dlaunch::workloads
