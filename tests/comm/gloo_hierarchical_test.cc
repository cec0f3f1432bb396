// Hierarchical all_reduce on groups that span hosts: two hosts simulated on
// one machine through the test-only DLAUNCH_COMM_TEST_HOSTS (host of each
// world rank), ranks of a host contiguous or interleaved, every dtype and
// ReduceOp checked against the reference; the path asserted.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "comm/gloo/process_group.h"
#include "tests/comm/rank_threads.h"
#include "tests/comm/tensor_values.h"

namespace dlaunch::comm {
namespace {

using testing::Buffer;
using testing::expect_close;
using testing::expected;
using testing::kAllDtypes;
using testing::kAllOps;
using testing::op_applies;
using testing::run_ranks;
using testing::value;

// Every dtype and op on `n` ranks placed on hosts as `hosts` says, with
// `numel` elements; every call must take `path`.
void all_reduce_on_hosts(int n, const char* hosts, size_t numel,
                         const char* fused, const std::string& path) {
  setenv("DLAUNCH_COMM_TEST_HOSTS", hosts, 1);
  setenv("DLAUNCH_COMM_FUSED_BYTES", fused, 1);
  run_ranks(n, [&](ProcessGroup& pg) {
    for (DType d : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        if (!op_applies(d, op)) continue;
        std::vector<double> v(numel);
        for (size_t i = 0; i < numel; ++i) v[i] = value(op, pg.rank(), i);
        Buffer b(d, v);
        pg.all_reduce(b.t, op);
        const std::string what = std::string(hosts) + ": " +
                                 std::string(dtype_name(d)) + " " +
                                 std::string(reduce_op_name(op)) + " on rank " +
                                 std::to_string(pg.rank());
        EXPECT_EQ(gloo::last_path(pg), path) << what;
        auto got = b.values();
        for (size_t i = 0; i < numel; ++i) {
          expect_close(d, got[i], expected(d, op, n, i), what);
        }
      }
    }
  });
  unsetenv("DLAUNCH_COMM_TEST_HOSTS");
  unsetenv("DLAUNCH_COMM_FUSED_BYTES");
}

TEST(GlooHierarchicalTest, TwoHostsContiguous) {
  all_reduce_on_hosts(4, "a,a,b,b", 1031, "0", "hierarchical");
}

TEST(GlooHierarchicalTest, TwoHostsInterleavedAndUneven) {
  all_reduce_on_hosts(5, "a,b,a,b,a", 1031, "0", "hierarchical");
}

// Data large enough for the hosts' shared-memory segment steps.
TEST(GlooHierarchicalTest, TwoHostsLarge) {
  all_reduce_on_hosts(4, "a,b,b,a", 300000, "0", "hierarchical");
}

// Small all-reduces stay fused with the check (one message per peer), and
// a host per rank has nothing to combine: both flat over TCP.
TEST(GlooHierarchicalTest, FlatWhereHierarchyGainsNothing) {
  all_reduce_on_hosts(4, "a,a,b,b", 37, "524288", "tcp");
  all_reduce_on_hosts(3, "a,b,c", 1031, "0", "tcp");
}

// One host (the override naming one host for all): shared memory.
TEST(GlooHierarchicalTest, OneHostUsesSharedMemory) {
  all_reduce_on_hosts(3, "a,a,a", 1031, "0", "shm-chunks");
}

}  // namespace
}  // namespace dlaunch::comm
