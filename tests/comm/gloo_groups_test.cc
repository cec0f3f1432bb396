// Sub-groups of the gloo backend: overlapping members, ranks outside a
// group, nested groups, groups used from separate threads, bad rank lists.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/comm/rank_threads.h"

namespace dlaunch::comm {
namespace {

using testing::run_ranks;

// Sum over the world ranks of a group's members, computed by all_reduce.
int64_t sum_of_world_ranks(ProcessGroup& g, int world_rank) {
  std::vector<int64_t> v{world_rank};
  g.all_reduce(Tensor::of(v), ReduceOp::kSum);
  return v[0];
}

TEST(GlooGroupsTest, OverlappingGroupsAndNonMembers) {
  run_ranks(6, [](ProcessGroup& world) {
    const int r = world.rank();
    auto a = world.new_group({0, 1, 2});
    auto b = world.new_group({2, 3, 4, 5});
    auto c = world.new_group({1, 3, 5});
    EXPECT_EQ(a != nullptr, r <= 2) << r;
    EXPECT_EQ(b != nullptr, r >= 2) << r;
    EXPECT_EQ(c != nullptr, r % 2 == 1) << r;
    if (a) {
      EXPECT_EQ(a->size(), 3);
      EXPECT_EQ(a->rank(), r);
      EXPECT_EQ(a->name(), "world/1");
      EXPECT_EQ(sum_of_world_ranks(*a, r), 0 + 1 + 2);
    }
    if (b) {
      EXPECT_EQ(b->size(), 4);
      EXPECT_EQ(b->rank(), r - 2);
      EXPECT_EQ(b->name(), "world/2");
      EXPECT_EQ(sum_of_world_ranks(*b, r), 2 + 3 + 4 + 5);
      // A group of a group: ranks 0 and 3 of b are world ranks 2 and 5.
      auto bb = b->new_group({0, 3});
      EXPECT_EQ(bb != nullptr, r == 2 || r == 5);
      if (bb) {
        EXPECT_EQ(bb->name(), "world/2/1");
        EXPECT_EQ(sum_of_world_ranks(*bb, r), 2 + 5);
        // p2p inside the nested group uses its own ranks.
        std::vector<int32_t> v{r};
        if (bb->rank() == 0) {
          bb->send(Tensor::of(v), 1, 0);
        } else {
          bb->recv(Tensor::of(v), 0, 0);
          EXPECT_EQ(v[0], 2);
        }
      }
    }
    if (c) {
      EXPECT_EQ(c->rank(), r / 2);
      EXPECT_EQ(sum_of_world_ranks(*c, r), 1 + 3 + 5);
      // broadcast from the group's root reaches only its members.
      std::vector<float> v{static_cast<float>(r)};
      c->broadcast(Tensor::of(v), 2);  // group rank 2 = world rank 5
      EXPECT_EQ(v[0], 5.0f);
    }
    // The world still works after (and independently of) its sub-groups.
    EXPECT_EQ(sum_of_world_ranks(world, r), 15);
  });
}

TEST(GlooGroupsTest, SeparateGroupsRunConcurrentlyOnSeparateThreads) {
  run_ranks(4, [](ProcessGroup& world) {
    const int r = world.rank();
    auto evens = world.new_group({0, 2});
    auto all = world.new_group({0, 1, 2, 3});
    std::atomic<int64_t> from_evens{-1};
    std::thread t([&] {
      if (evens) {
        for (int i = 0; i < 20; ++i) from_evens = sum_of_world_ranks(*evens, r);
      }
    });
    int64_t from_all = 0;
    for (int i = 0; i < 20; ++i) from_all = sum_of_world_ranks(*all, r);
    t.join();
    EXPECT_EQ(from_all, 6);
    if (evens) {
      EXPECT_EQ(from_evens.load(), 2);
    }
  });
}

TEST(GlooGroupsTest, SubGroupTakesItsOwnTimeout) {
  run_ranks(2, [](ProcessGroup& world) {
    auto g = world.new_group({0, 1}, std::chrono::milliseconds(1234));
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->timeout(), std::chrono::milliseconds(1234));
    EXPECT_EQ(world.new_group({0, 1})->timeout(), world.timeout());
  });
}

TEST(GlooGroupsTest, BadRankListsFailOnEveryRank) {
  run_ranks(3, [](ProcessGroup& world) {
    try {
      world.new_group({2, 0});
      ADD_FAILURE() << "unsorted ranks accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("sorted and distinct"),
                std::string::npos)
          << e.what();
    }
    try {
      world.new_group({0, 3});
      ADD_FAILURE() << "rank 3 of 3 accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 3 is out of range"),
                std::string::npos)
          << e.what();
    }
    // Ranks disagreeing on the list: every rank fails the same way.
    std::vector<int> ranks =
        world.rank() == 1 ? std::vector<int>{0, 1} : std::vector<int>{0, 2};
    try {
      world.new_group(ranks);
      ADD_FAILURE() << "different rank lists accepted";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 passed a different rank "
                                           "list"),
                std::string::npos)
          << e.what();
    }
    // The failed calls left the world usable.
    EXPECT_EQ(sum_of_world_ranks(world, world.rank()), 3);
  });
}

}  // namespace
}  // namespace dlaunch::comm
