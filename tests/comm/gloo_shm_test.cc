// Every collective over shared memory (ranks on one host) gives the same
// bytes as over TCP: every op x dtype x ReduceOp on 2, 3 and 4 ranks, with
// the data travelling with the argument check, through pipelined segment
// steps (one step and many), and on sub-groups that mix ranks. Each call's
// path is asserted through last_path().
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/gloo/process_group.h"
#include "comm/init.h"
#include "comm/store/hash_store.h"
#include "tests/comm/rank_threads.h"
#include "tests/comm/tensor_values.h"

namespace dlaunch::comm {
namespace {

using testing::Buffer;
using testing::error_of;
using ::testing::HasSubstr;
using testing::kAllDtypes;
using testing::kAllOps;
using testing::op_applies;
using testing::run_ranks;
using testing::value;

// What one rank saw: a digest of each call's output and the path it took.
struct Trace {
  std::vector<std::string> calls;
  std::vector<uint64_t> digests;
  std::vector<std::string> paths;
};

uint64_t digest(const Tensor& t, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(t.data);
  for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

Buffer filled(DType d, ReduceOp op, int rank, size_t numel, int salt = 0) {
  std::vector<double> v(numel);
  for (size_t i = 0; i < numel; ++i) v[i] = value(op, rank + salt, i);
  return Buffer(d, v);
}

std::vector<Tensor> views(std::vector<Buffer>& bufs) {
  std::vector<Tensor> out;
  for (auto& b : bufs) out.push_back(b.t);
  return out;
}

// Runs every collective for every dtype (and every ReduceOp that applies)
// on `pg` with tensors of about `numel` elements, recording each output.
void every_collective(ProcessGroup& pg, size_t numel, Trace& trace) {
  const int n = pg.size();
  const int r = pg.rank();
  auto record = [&](const std::string& call, uint64_t h) {
    trace.calls.push_back(call);
    trace.digests.push_back(h);
    trace.paths.push_back(gloo::last_path(pg));
  };
  for (DType d : kAllDtypes) {
    const std::string dn(dtype_name(d));
    const int root = n - 1;
    Buffer b = filled(d, ReduceOp::kSum, r, numel);
    pg.broadcast(b.t, root);
    record("broadcast " + dn, digest(b.t));

    std::vector<Buffer> parts;
    for (int j = 0; j < n; ++j)
      parts.push_back(filled(d, ReduceOp::kSum, j, numel, 7 * r));
    Buffer one(d, numel);
    pg.scatter(one.t, views(parts), 0);
    record("scatter " + dn, digest(one.t));

    std::vector<Buffer> got;
    for (int j = 0; j < n; ++j) got.emplace_back(d, numel);
    Buffer mine = filled(d, ReduceOp::kMax, r, numel);
    pg.gather(mine.t, views(got), n / 2);
    uint64_t h = 1;
    if (r == n / 2) {
      for (auto& g : got) h = digest(g.t, h);
    }
    record("gather " + dn, h);

    for (auto& g : got) std::memset(g.raw.data(), 0, g.raw.size());
    pg.all_gather(views(got), mine.t);
    h = 1;
    for (auto& g : got) h = digest(g.t, h);
    record("all_gather " + dn, h);

    // Uneven blocks: rank s sends rank t numel + (s + 2t) % 3 elements.
    std::vector<Buffer> a2a_in, a2a_out;
    for (int j = 0; j < n; ++j) {
      a2a_in.push_back(
          filled(d, ReduceOp::kSum, r * n + j, numel + (r + 2 * j) % 3));
      a2a_out.emplace_back(d, numel + (j + 2 * r) % 3);
    }
    pg.all_to_all(views(a2a_out), views(a2a_in));
    h = 1;
    for (auto& g : a2a_out) h = digest(g.t, h);
    record("all_to_all " + dn, h);

    for (ReduceOp op : kAllOps) {
      if (!op_applies(d, op)) continue;
      const std::string on = dn + " " + std::string(reduce_op_name(op));
      Buffer red = filled(d, op, r, numel);
      pg.reduce(red.t, root, op);
      record("reduce " + on, digest(red.t));

      Buffer all = filled(d, op, r, numel);
      pg.all_reduce(all.t, op);
      record("all_reduce " + on, digest(all.t));

      std::vector<Buffer> ins;
      for (int j = 0; j < n; ++j) ins.push_back(filled(d, op, r + j, numel));
      Buffer out(d, numel);
      pg.reduce_scatter(out.t, views(ins), op);
      record("reduce_scatter " + on, digest(out.t));
    }
  }
  pg.barrier();
  record("barrier", 0);
}

struct Env {
  const char* fused;
  const char* shm_min;
  const char* cma = "off";   // DLAUNCH_COMM_CMA (single copy)
  const char* refused = "";  // DLAUNCH_COMM_TEST_CMA_REFUSED
};

// Every rank's trace of every_collective on `n` ranks (or on the sub-group
// of `sub` ranks of an n-rank world), with the path knobs set as given.
std::map<int, Trace> traces(int n, size_t numel, Env env,
                            const std::vector<int>& sub = {}) {
  if (env.fused) setenv("DLAUNCH_COMM_FUSED_BYTES", env.fused, 1);
  if (env.shm_min) setenv("DLAUNCH_COMM_SHM_MIN_BYTES", env.shm_min, 1);
  setenv("DLAUNCH_COMM_CMA", env.cma, 1);
  setenv("DLAUNCH_COMM_TEST_CMA_REFUSED", env.refused, 1);
  std::map<int, Trace> out;
  std::mutex mu;
  run_ranks(n, [&](ProcessGroup& world) {
    Trace t;
    if (sub.empty()) {
      every_collective(world, numel, t);
    } else if (auto g = world.new_group(sub)) {
      every_collective(*g, numel, t);
    }
    std::lock_guard lock(mu);
    out[world.rank()] = std::move(t);
  });
  unsetenv("DLAUNCH_COMM_FUSED_BYTES");
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
  unsetenv("DLAUNCH_COMM_CMA");
  unsetenv("DLAUNCH_COMM_TEST_CMA_REFUSED");
  return out;
}

// Same calls, same bytes; every call (but the barrier) on `shm` took
// `path` (the calls that only move data `moving`, when given), every one on
// `tcp` took TCP.
void expect_same(const std::map<int, Trace>& tcp,
                 const std::map<int, Trace>& shm, const std::string& path,
                 const std::string& moving = "") {
  ASSERT_EQ(tcp.size(), shm.size());
  for (const auto& [rank, want] : tcp) {
    const Trace& got = shm.at(rank);
    ASSERT_EQ(got.calls, want.calls) << "rank " << rank;
    for (size_t i = 0; i < want.calls.size(); ++i) {
      const std::string what =
          "rank " + std::to_string(rank) + ": " + want.calls[i];
      EXPECT_EQ(got.digests[i], want.digests[i]) << what;
      if (want.calls[i] == "barrier") continue;
      EXPECT_EQ(want.paths[i], "tcp") << what;
      const bool moves = !want.calls[i].starts_with("reduce") &&
                         !want.calls[i].starts_with("all_reduce");
      EXPECT_EQ(got.paths[i], moves && !moving.empty() ? moving : path) << what;
    }
  }
}

const Env kTcp{nullptr, "off"};
const Env kWithCheck{nullptr, nullptr};  // the default
const Env kChunks{"0", "1"};             // nothing travels with the check
const Env kSingleCopy{"0", "1", "on"};   // ... and single copy is on
const Env kCopyOff{"0", "1", "off"};     // ... and single copy is off

class GlooShmTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooShmTest, WithTheCheckEqualsTcp) {
  const int n = GetParam();
  expect_same(traces(n, 37, kTcp), traces(n, 37, kWithCheck), "shm-check");
}

TEST_P(GlooShmTest, OneChunkStepEqualsTcp) {
  const int n = GetParam();
  expect_same(traces(n, 37, kTcp), traces(n, 37, kChunks), "shm-chunks");
}

// 2.2 MB of f64: nine steps, more than a segment holds (the writer waits
// for its readers); 1.1 MB of f32: five; 280 KB of u8 (within the
// segments' window): one, but two (the last partial) for broadcast and
// reduce where every rank has a CPU (2 ranks on this 2-CPU machine).
TEST_P(GlooShmTest, ManyChunkStepsEqualTcp) {
  const int n = GetParam();
  const size_t numel = 280000;
  expect_same(traces(n, numel, kTcp), traces(n, numel, kChunks), "shm-chunks");
}

// Broadcast, scatter, gather, all_gather and all_to_all read (and write)
// the peers' memory directly (process_vm_readv/writev); the reductions
// still take the segments. 24 KB of f64 splits each transfer at a page.
TEST_P(GlooShmTest, SingleCopyEqualsTcp) {
  const int n = GetParam();
  for (size_t numel : {size_t{37}, size_t{3001}}) {
    expect_same(traces(n, numel, kTcp), traces(n, numel, kSingleCopy),
                "shm-chunks", "shm-cma");
  }
}

// A copy the kernel refuses on one rank (as under ptrace restrictions;
// simulated) sends every rank to the segments, for that call and the
// group's later ones, with the same bytes.
TEST_P(GlooShmTest, SingleCopyOffEqualsTcp) {
  const int n = GetParam();
  expect_same(traces(n, 3001, kTcp), traces(n, 3001, kCopyOff), "shm-chunks");
}

TEST_P(GlooShmTest, RefusedSingleCopyFallsBackToTheSegments) {
  const int n = GetParam();
  Env refused = kSingleCopy;
  refused.refused = "1";  // rank 1 only
  expect_same(traces(n, 3001, kTcp), traces(n, 3001, refused), "shm-chunks");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooShmTest, ::testing::Values(2, 3, 4),
                         ::testing::PrintToStringParamName());

TEST(GlooShmSubGroupTest, SubGroupsMixingRanksEqualTcp) {
  for (const std::vector<int>& sub :
       {std::vector<int>{1, 3}, std::vector<int>{0, 2, 3}}) {
    expect_same(traces(4, 37, kTcp, sub), traces(4, 37, kWithCheck, sub),
                "shm-check");
    expect_same(traces(4, 3000, kTcp, sub), traces(4, 3000, kChunks, sub),
                "shm-chunks");
    expect_same(traces(4, 3000, kTcp, sub), traces(4, 3000, kSingleCopy, sub),
                "shm-chunks", "shm-cma");
  }
}

// Outputs of 8 MiB and more per rank leave the segments through
// non-temporal stores, here into destinations that start off a cache line
// (the stores' aligned part and its unaligned head and tail): every byte
// lands where it should, on 2 and 3 ranks.
TEST(GlooShmLargeTest, StreamedOutputsHoldTheirSources) {
  const size_t piece = (8 << 20) + 4097;
  auto byte = [](int rank, int part, size_t i) {
    return static_cast<uint8_t>(rank * 31 + part * 7 + i * 13 + (i >> 12));
  };
  auto filled_piece = [&](int rank, int part) {
    std::vector<uint8_t> v(piece + 1);
    for (size_t i = 0; i < piece; ++i) v[i + 1] = byte(rank, part, i);
    return v;
  };
  auto holds = [&](const std::vector<uint8_t>& v, int rank, int part) {
    for (size_t i = 0; i < piece; ++i) {
      if (v[i + 1] != byte(rank, part, i)) return false;
    }
    return true;
  };
  auto at1 = [&](std::vector<uint8_t>& v) {  // one byte off the allocation
    return Tensor::of(v.data() + 1, piece);
  };
  setenv("DLAUNCH_COMM_FUSED_BYTES", "0", 1);
  setenv("DLAUNCH_COMM_CMA", "off", 1);
  for (int n : {2, 3}) {
    run_ranks(n, [&](ProcessGroup& pg) {
      const int r = pg.rank();
      std::vector<std::vector<uint8_t>> in, out;
      for (int j = 0; j < n; ++j) {
        in.push_back(filled_piece(r, j));
        out.emplace_back(piece + 1, 0);
      }
      auto list = [&](std::vector<std::vector<uint8_t>>& bufs) {
        std::vector<Tensor> t;
        for (auto& b : bufs) t.push_back(at1(b));
        return t;
      };
      const std::string who =
          std::to_string(n) + " ranks, rank " + std::to_string(r) + ": ";

      std::vector<uint8_t> b = filled_piece(r, 0);
      pg.broadcast(at1(b), 1);
      EXPECT_EQ(gloo::last_path(pg), "shm-chunks");
      EXPECT_TRUE(holds(b, 1, 0)) << who << "broadcast";

      std::vector<uint8_t> one(piece + 1, 0);
      auto ins = list(in);
      pg.scatter(at1(one), ins, 0);
      EXPECT_TRUE(holds(one, 0, r)) << who << "scatter";

      auto outs = list(out);
      pg.gather(at1(in[0]), r == n - 1 ? outs : std::vector<Tensor>{}, n - 1);
      for (int j = 0; r == n - 1 && j < n; ++j) {
        EXPECT_TRUE(holds(out[j], j, 0)) << who << "gather from " << j;
      }

      pg.all_gather(outs, at1(in[1]));
      for (int j = 0; j < n; ++j) {
        EXPECT_TRUE(holds(out[j], j, 1)) << who << "all_gather from " << j;
      }

      pg.all_to_all(outs, ins);
      EXPECT_EQ(gloo::last_path(pg), "shm-chunks");
      for (int j = 0; j < n; ++j) {
        EXPECT_TRUE(holds(out[j], j, r)) << who << "all_to_all from " << j;
      }
    });
  }
  unsetenv("DLAUNCH_COMM_FUSED_BYTES");
  unsetenv("DLAUNCH_COMM_CMA");
}

// The default path at 1 MiB and above: segment steps without any knob
// (single copy is opt-in).
TEST(GlooShmPathTest, LargeDataTakesTheSegmentsByDefault) {
  run_ranks(2, [&](ProcessGroup& pg) {
    std::vector<float> v(1 << 19, 1.0f);
    pg.broadcast(Tensor::of(v), 0);
    EXPECT_EQ(gloo::last_path(pg), "shm-chunks");
    std::vector<float> small(1024, 1.0f);
    pg.broadcast(Tensor::of(small), 0);
    EXPECT_EQ(gloo::last_path(pg), "shm-check");
  });
}

// Below DLAUNCH_COMM_SHM_MIN_BYTES the data goes with the check, at it
// through the segments, also for a threshold that is no multiple of 64
// (964-996 B went through the segments with 1000).
TEST(GlooShmPathTest, TheThresholdHoldsToTheByte) {
  setenv("DLAUNCH_COMM_SHM_MIN_BYTES", "1000", 1);
  run_ranks(2, [&](ProcessGroup& pg) {
    for (size_t floats : {size_t{240}, size_t{249}, size_t{250}}) {
      std::vector<float> v(floats, 1.0f);
      pg.all_reduce(Tensor::of(v), ReduceOp::kSum);
      EXPECT_EQ(v[0], 2.0f);
      EXPECT_EQ(gloo::last_path(pg),
                floats * 4 < 1000 ? "shm-check" : "shm-chunks")
          << floats * 4 << " bytes";
      pg.broadcast(Tensor::of(v), 0);
      EXPECT_EQ(gloo::last_path(pg),
                floats * 4 < 1000 ? "shm-check" : "shm-chunks")
          << "broadcast of " << floats * 4 << " bytes";
    }
  });
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
}

// DLAUNCH_COMM_FUSED_BYTES=off fuses nothing, as 0 does (it once meant the
// largest budget: every all_reduce fused, "shm-check" here).
TEST(GlooShmPathTest, FusedBytesOffTurnsFusingOffLikeZero) {
  auto path_with = [](const char* fused) {
    setenv("DLAUNCH_COMM_FUSED_BYTES", fused, 1);
    std::string path;
    run_ranks(2, [&](ProcessGroup& pg) {
      std::vector<float> v(1024, 1.0f);
      pg.all_reduce(Tensor::of(v), ReduceOp::kSum);
      EXPECT_EQ(v[0], 2.0f);
      if (pg.rank() == 0) path = gloo::last_path(pg);
    });
    unsetenv("DLAUNCH_COMM_FUSED_BYTES");
    return path;
  };
  const std::string off = path_with("off");
  EXPECT_EQ(off, path_with("0"));
  EXPECT_NE(off, "shm-check");
}

// A DLAUNCH_COMM_CMA other than on or off is an error when the group is
// made, not single copy quietly left off.
TEST(GlooShmPathTest, ABadCmaValueIsAClearError) {
  auto store = std::make_shared<store::HashStore>();
  for (const char* bad : {"1", "yes", "ON"}) {
    setenv("DLAUNCH_COMM_CMA", bad, 1);
    EXPECT_THAT(error_of([&] {
                  make_process_group("gloo", store, 0, 1,
                                     std::chrono::seconds(5));
                }),
                HasSubstr(std::string("DLAUNCH_COMM_CMA is '") + bad +
                          "'; expected on or off"));
  }
  unsetenv("DLAUNCH_COMM_CMA");
}

}  // namespace
}  // namespace dlaunch::comm
