// Small collectives between ranks on one host allocate nothing once a group
// has run each of them: the argument check and the data that travels with
// it reuse the group's buffers, and no message is formatted unless a call
// fails (a malloc and a string per call were a measurable part of a 4 KiB
// gather's 1-3 us). Counts this thread's operator new calls.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo/process_group.h"
#include "comm/gloo/shm_sync.h"
#include "tests/comm/rank_threads.h"
#include "tests/testing/cpus.h"

namespace {
thread_local bool counting = false;
thread_local size_t allocations = 0;
}  // namespace

// The replacements pair malloc with free, which GCC cannot see through.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace dlaunch::comm {
namespace {

using testing::run_ranks;

// Every collective once at 4 KiB per rank (1 KiB for the splitting ones'
// pieces), with matching arguments.
void each_once(ProcessGroup& pg, Tensor t, std::span<const Tensor> pieces_a,
               std::span<const Tensor> pieces_b) {
  const int r = pg.rank();
  pg.broadcast(t, 0);
  pg.reduce(t, 1, ReduceOp::kSum);
  pg.all_reduce(t, ReduceOp::kMax);
  pg.gather(pieces_b[r], pieces_a, 0);
  pg.scatter(pieces_a[r], pieces_b, 1);
  pg.all_gather(pieces_a, pieces_b[r]);
  pg.reduce_scatter(pieces_a[r], pieces_b, ReduceOp::kSum);
  pg.all_to_all(pieces_a, pieces_b);
  pg.barrier();
}

std::vector<Tensor> split(std::vector<float>& v, int n) {
  std::vector<Tensor> out;
  const size_t each = v.size() / n;
  for (int j = 0; j < n; ++j) {
    out.push_back(Tensor{v.data() + j * each, each, DType::kF32, {}});
  }
  return out;
}

// `one_cpu`: every rank pinned to the first CPU of the process's mask, so
// that each wait finds its peer on its CPU and looks at moving off it (a
// bound rank stays: the look itself must not allocate); the counted calls
// start after the move interval the warm-up used.
void expect_no_allocation(int n, bool one_cpu = false) {
  const std::vector<int> cpus = dlaunch::testing::allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  run_ranks(n, [&](ProcessGroup& pg) {
    if (one_cpu) {
      ASSERT_TRUE(dlaunch::testing::pin_to({cpus[0]}));
    }
    std::vector<float> a(1024, 1.0f), b(1024, 2.0f), c(1024, 3.0f);
    std::vector<Tensor> pa = split(a, pg.size()), pb = split(b, pg.size());
    each_once(pg, Tensor::of(c), pa, pb);  // the group's buffers grow here
    if (one_cpu) {
      std::this_thread::sleep_for(gloo::kMoveEvery +
                                  std::chrono::milliseconds(20));
    }
    counting = true;
    allocations = 0;
    for (int i = 0; i < 20; ++i) each_once(pg, Tensor::of(c), pa, pb);
    counting = false;
    EXPECT_EQ(allocations, 0u) << "rank " << pg.rank() << " of " << n;
    EXPECT_EQ(std::string(gloo::last_path(pg)), "shm-check");
  });
}

TEST(GlooAllocation, SmallCollectivesAllocateNothingOnTwoRanks) {
  expect_no_allocation(2);
}

TEST(GlooAllocation, SmallCollectivesAllocateNothingOnFourRanks) {
  expect_no_allocation(4);
}

TEST(GlooAllocation, SmallCollectivesAllocateNothingWhenRanksShareACpu) {
  expect_no_allocation(2, /*one_cpu=*/true);
}

}  // namespace
}  // namespace dlaunch::comm
