// The asynchronous collectives of the gloo backend (torch's async_op=True):
// every collective's i-form, call order between asynchronous and blocking
// calls, errors and timeouts through Work::wait(), and a group destroyed with
// work outstanding. Ranks are threads over loopback TCP.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "tests/comm/rank_threads.h"

namespace dlaunch::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::run_ranks;

constexpr milliseconds kLong{20000};

TEST(GlooAsyncTest, EveryCollectiveHasAnAsyncFormAndAllMayBeOutstanding) {
  constexpr int n = 3;
  run_ranks(n, [](ProcessGroup& pg) {
    const int r = pg.rank();
    std::vector<int32_t> ar(5, r + 1), bc(4, r == 1 ? 42 : 0), rd(3, r + 1);
    std::vector<int32_t> ag_in(2, 10 * r), ag_out(2 * n, -1);
    std::vector<int32_t> rs_in(n, r + 1), rs_out(1, -1);
    std::vector<int32_t> a2a_in(n), a2a_out(n, -1);
    for (int j = 0; j < n; ++j) a2a_in[j] = 100 * r + j;
    std::vector<int32_t> sc_in(n), sc_out(1, -1);
    for (int j = 0; j < n; ++j) sc_in[j] = 7 * j;
    std::vector<int32_t> ga_in(1, r * r), ga_out(n, -1);
    auto views = [](std::vector<int32_t>& v, size_t parts) {
      std::vector<Tensor> out;
      const size_t each = v.size() / parts;
      for (size_t i = 0; i < parts; ++i) {
        out.push_back(Tensor::of(v.data() + i * each, each));
      }
      return out;
    };
    std::vector<std::unique_ptr<Work>> w;
    w.push_back(pg.iall_reduce(Tensor::of(ar)));
    w.push_back(pg.ibroadcast(Tensor::of(bc), 1));
    w.push_back(pg.ireduce(Tensor::of(rd), 2, ReduceOp::kMax));
    w.push_back(pg.iall_gather(views(ag_out, n), Tensor::of(ag_in)));
    w.push_back(pg.ireduce_scatter(Tensor::of(rs_out), views(rs_in, n)));
    w.push_back(pg.iall_to_all(views(a2a_out, n), views(a2a_in, n)));
    // The lists are copied: passing temporaries is allowed.
    w.push_back(pg.iscatter(Tensor::of(sc_out), views(sc_in, n), 0));
    w.push_back(pg.igather(Tensor::of(ga_in), views(ga_out, n), 0));
    w.push_back(pg.ibarrier());
    for (auto& x : w) x->wait(kLong);
    for (int32_t v : ar) EXPECT_EQ(v, 1 + 2 + 3);
    for (int32_t v : bc) EXPECT_EQ(v, 42);
    for (int32_t v : rd) EXPECT_EQ(v, r == 2 ? 3 : r + 1);
    for (int j = 0; j < n; ++j) {
      EXPECT_EQ(ag_out[2 * j], 10 * j);
      EXPECT_EQ(ag_out[2 * j + 1], 10 * j);
      EXPECT_EQ(a2a_out[j], 100 * j + r);
      if (r == 0) {
        EXPECT_EQ(ga_out[j], j * j);
      }
    }
    EXPECT_EQ(rs_out[0], 1 + 2 + 3);
    EXPECT_EQ(sc_out[0], 7 * r);
  });
}

// The result of sum-then-product differs from product-then-sum, so the
// values prove the order the operations ran in.
TEST(GlooAsyncTest, AsyncAndBlockingCallsRunInCallOrder) {
  run_ranks(3, [](ProcessGroup& pg) {
    std::vector<int64_t> x(1000, pg.rank() + 1);                  // 1, 2, 3
    auto w1 = pg.iall_reduce(Tensor::of(x), ReduceOp::kSum);      // 6
    auto w2 = pg.iall_reduce(Tensor::of(x), ReduceOp::kProduct);  // 216
    // Blocking: runs after both, on this thread, without a wait() first.
    pg.all_reduce(Tensor::of(x), ReduceOp::kMax);  // 216
    EXPECT_TRUE(w1->is_completed());
    EXPECT_TRUE(w2->is_completed());
    for (int64_t v : x) ASSERT_EQ(v, 216);
    auto w3 = pg.iall_reduce(Tensor::of(x), ReduceOp::kSum);  // 648
    w3->wait(kLong);
    w2->wait(kLong);  // waiting again on a completed Work is fine
    for (int64_t v : x) ASSERT_EQ(v, 648);
  });
}

TEST(GlooAsyncTest, BadArgumentsSurfaceThroughWaitAndTheGroupStaysUsable) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> f(4, 1.0f);
    auto bad = pg.iall_reduce(Tensor::of(f), ReduceOp::kBand);
    auto good = pg.iall_reduce(Tensor::of(f), ReduceOp::kSum);
    try {
      bad->wait(kLong);
      ADD_FAILURE() << "a bitwise op on float32 did not fail";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("band"));
    }
    good->wait(kLong);
    for (float v : f) EXPECT_EQ(v, 2.0f);
  });
}

// Rank 1 joins only after rank 0's short wait() timed out: the timeout names
// the operation, and the same Work then completes.
TEST(GlooAsyncTest, WaitWithAShortTimeoutThrowsAndTheWorkCompletesLater) {
  std::promise<void> timed_out;
  auto seen = timed_out.get_future().share();
  run_ranks(2, [&](ProcessGroup& pg) {
    std::vector<int32_t> x(8, pg.rank() + 1);
    if (pg.rank() == 0) {
      auto w = pg.iall_reduce(Tensor::of(x));
      try {
        w->wait(milliseconds(100));
        ADD_FAILURE() << "completed without rank 1";
      } catch (const CommTimeoutError& e) {
        EXPECT_THAT(e.what(), HasSubstr("all_reduce #0"));
        EXPECT_THAT(e.what(), HasSubstr("group 'world'"));
      }
      EXPECT_FALSE(w->is_completed());
      timed_out.set_value();
      w->wait(kLong);
    } else {
      seen.wait();
      pg.all_reduce(Tensor::of(x));
    }
    for (int32_t v : x) EXPECT_EQ(v, 3);
  });
}

// A peer that never joins: the operation fails at the group's timeout, the
// Work reports it, and later calls fail at once naming the earlier failure.
TEST(GlooAsyncTest, APeerThatNeverComesFailsTheWorkAtTheGroupTimeout) {
  auto store = std::make_shared<store::HashStore>();
  store->set_timeout(kLong);
  std::promise<void> done;
  auto finished = done.get_future().share();
  std::thread peer([&] {
    auto pg = make_process_group("gloo", store, 1, 2, milliseconds(1000));
    finished.wait();  // stays connected but never calls the collective
  });
  {
    auto pg = make_process_group("gloo", store, 0, 2, milliseconds(1000));
    std::vector<int32_t> x(8, 1);
    auto w = pg->iall_reduce(Tensor::of(x));
    try {
      w->wait(kLong);
      ADD_FAILURE() << "completed without rank 1";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("all_reduce"));
      EXPECT_THAT(e.what(), HasSubstr("rank 1"));
    }
    EXPECT_THROW(pg->all_reduce(Tensor::of(x)), CommError);
  }
  done.set_value();
  peer.join();
}

// Destroying a group runs its queued operations first; their Works outlive
// the group and are complete.
TEST(GlooAsyncTest, AGroupDestroyedWithWorkOutstandingCompletesIt) {
  constexpr int n = 2;
  auto store = std::make_shared<store::HashStore>();
  store->set_timeout(kLong);
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> bufs(n, std::vector<int32_t>(64));
  std::vector<std::vector<std::unique_ptr<Work>>> works(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      bufs[r].assign(64, 1);
      auto pg = make_process_group("gloo", store, r, n, kLong);
      for (int i = 0; i < 5; ++i) {
        works[r].push_back(pg->iall_reduce(Tensor::of(bufs[r])));
      }
    });  // pg destroyed here, with up to five operations outstanding
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    for (auto& w : works[r]) {
      EXPECT_TRUE(w->is_completed());
      w->wait(milliseconds(1));
    }
    for (int32_t v : bufs[r]) EXPECT_EQ(v, 32);  // 1 doubled five times
  }
}

}  // namespace
}  // namespace dlaunch::comm
