// Every collective and p2p call of the gloo backend, for every dtype and
// ReduceOp, on 1..8 ranks run as threads over loopback TCP, checked against
// a reference computed in double / int64.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <initializer_list>
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

constexpr size_t kNumel = 37;

std::string label(DType d, ReduceOp op, int rank) {
  return std::string(dtype_name(d)) + " " + std::string(reduce_op_name(op)) +
         " on rank " + std::to_string(rank);
}

std::vector<double> values_for(ReduceOp op, int rank, size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(op, rank, i);
  return v;
}

class GlooCollectivesTest : public ::testing::TestWithParam<int> {};

// all_reduce of every dtype and op, for each of `sizes`, on `n` ranks, with
// comm's path-choosing knobs set as given for the group's creation.
// Each all_reduce must take `path` (gloo::last_path; "local" on one rank).
void all_reduce_every_dtype_and_op(int n, std::initializer_list<size_t> sizes,
                                   const char* fused_bytes,
                                   const char* shm_min_bytes,
                                   const std::string& path) {
  if (fused_bytes) setenv("DLAUNCH_COMM_FUSED_BYTES", fused_bytes, 1);
  if (shm_min_bytes) setenv("DLAUNCH_COMM_SHM_MIN_BYTES", shm_min_bytes, 1);
  run_ranks(n, [&](ProcessGroup& pg) {
    for (size_t numel : sizes) {
      for (DType d : kAllDtypes) {
        for (ReduceOp op : kAllOps) {
          if (!op_applies(d, op)) continue;
          Buffer b(d, values_for(op, pg.rank(), numel));
          pg.all_reduce(b.t, op);
          EXPECT_EQ(gloo::last_path(pg), n == 1 ? "local" : path)
              << label(d, op, pg.rank());
          auto got = b.values();
          for (size_t i = 0; i < numel; ++i) {
            expect_close(d, got[i], expected(d, op, n, i),
                         label(d, op, pg.rank()) + " element " +
                             std::to_string(i) + " of " +
                             std::to_string(numel));
          }
        }
      }
    }
  });
  unsetenv("DLAUNCH_COMM_FUSED_BYTES");
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
}

// The default between ranks on one host: the data travels with the
// argument check through the shared-memory channel.
TEST_P(GlooCollectivesTest, AllReduceEveryDtypeAndOp) {
  all_reduce_every_dtype_and_op(GetParam(), {kNumel}, nullptr, nullptr,
                                "shm-check");
}

// The path between hosts (shared memory off): the data travels with the
// argument check in one Gloo message per peer.
TEST_P(GlooCollectivesTest, AllReduceEveryDtypeAndOpFusedOverTcp) {
  all_reduce_every_dtype_and_op(GetParam(), {kNumel}, nullptr, "off", "tcp");
}

// The same through Gloo's ring (the path for large all_reduces between
// hosts).
TEST_P(GlooCollectivesTest, AllReduceEveryDtypeAndOpThroughTheRing) {
  all_reduce_every_dtype_and_op(GetParam(), {kNumel}, "0", "off", "tcp");
}

// And through chunked shared memory (the path for large all_reduces between
// ranks on one host), with uneven chunks.
TEST_P(GlooCollectivesTest, AllReduceEveryDtypeAndOpThroughSharedMemory) {
  all_reduce_every_dtype_and_op(GetParam(), {kNumel, size_t{3}, size_t{1031}},
                                "0", "1", "shm-chunks");
}

TEST_P(GlooCollectivesTest, ReduceEveryDtypeAndOpLeavesNonRootsAlone) {
  const int n = GetParam();
  run_ranks(n, [&](ProcessGroup& pg) {
    const int root = n - 1;
    for (DType d : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        if (!op_applies(d, op)) continue;
        auto mine = values_for(op, pg.rank(), kNumel);
        Buffer b(d, mine);
        auto sent = b.values();
        pg.reduce(b.t, root, op);
        auto got = b.values();
        for (size_t i = 0; i < kNumel; ++i) {
          double want = pg.rank() == root ? expected(d, op, n, i) : sent[i];
          expect_close(d, got[i], want, label(d, op, pg.rank()));
        }
      }
    }
  });
}

TEST_P(GlooCollectivesTest, ReduceScatterEveryDtypeAndOp) {
  const int n = GetParam();
  run_ranks(n, [&](ProcessGroup& pg) {
    for (DType d : kAllDtypes) {
      for (ReduceOp op : kAllOps) {
        if (!op_applies(d, op)) continue;
        // in[j] holds elements j*kNumel .. (j+1)*kNumel-1 of one long
        // vector, so rank j's result is that slice reduced over ranks.
        std::vector<Buffer> in;
        std::vector<Tensor> views;
        for (int j = 0; j < n; ++j) {
          std::vector<double> v(kNumel);
          for (size_t i = 0; i < kNumel; ++i) {
            v[i] = value(op, pg.rank(), j * kNumel + i);
          }
          in.emplace_back(d, v);
        }
        for (auto& b : in) views.push_back(b.t);
        Buffer out(d, kNumel);
        pg.reduce_scatter(out.t, views, op);
        auto got = out.values();
        for (size_t i = 0; i < kNumel; ++i) {
          expect_close(d, got[i], expected(d, op, n, pg.rank() * kNumel + i),
                       label(d, op, pg.rank()));
        }
      }
    }
  });
}

TEST_P(GlooCollectivesTest, BroadcastScatterGatherEveryDtype) {
  const int n = GetParam();
  run_ranks(n, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    for (DType d : kAllDtypes) {
      const std::string what =
          std::string(dtype_name(d)) + " rank " + std::to_string(r);
      // broadcast from the middle rank
      const int broot = n / 2;
      Buffer b(d, values_for(ReduceOp::kSum, r, kNumel));
      pg.broadcast(b.t, broot);
      EXPECT_EQ(b.values(),
                Buffer(d, values_for(ReduceOp::kSum, broot, kNumel)).values())
          << "broadcast " << what;

      // scatter from the last rank: rank j gets values_for(kSum, j)
      const int sroot = n - 1;
      std::vector<Buffer> parts;
      std::vector<Tensor> views;
      if (r == sroot) {
        for (int j = 0; j < n; ++j) {
          parts.emplace_back(d, values_for(ReduceOp::kSum, j, kNumel));
        }
        for (auto& p : parts) views.push_back(p.t);
      }
      Buffer out(d, kNumel);
      pg.scatter(out.t, views, sroot);
      EXPECT_EQ(out.values(),
                Buffer(d, values_for(ReduceOp::kSum, r, kNumel)).values())
          << "scatter " << what;

      // gather to rank 0
      Buffer in(d, values_for(ReduceOp::kSum, r, kNumel));
      std::vector<Buffer> slots;
      std::vector<Tensor> slot_views;
      if (r == 0) {
        for (int j = 0; j < n; ++j) slots.emplace_back(d, kNumel);
        for (auto& s : slots) slot_views.push_back(s.t);
      }
      pg.gather(in.t, slot_views, 0);
      if (r == 0) {
        for (int j = 0; j < n; ++j) {
          EXPECT_EQ(slots[j].values(),
                    Buffer(d, values_for(ReduceOp::kSum, j, kNumel)).values())
              << "gather slot " << j << " " << what;
        }
      }
    }
  });
}

TEST_P(GlooCollectivesTest, AllGatherAndUnevenAllToAllEveryDtype) {
  const int n = GetParam();
  // rank s sends (s + t) % 3 + 1 elements to rank t
  auto count = [](int s, int t) {
    return static_cast<size_t>((s + t) % 3 + 1);
  };
  auto payload = [](int s, int t, size_t i) {
    return static_cast<double>((s * 7 + t * 3 + i) % 50);
  };
  run_ranks(n, [&](ProcessGroup& pg) {
    const int r = pg.rank();
    for (DType d : kAllDtypes) {
      Buffer in(d, values_for(ReduceOp::kSum, r, kNumel));
      std::vector<Buffer> out;
      std::vector<Tensor> views;
      for (int j = 0; j < n; ++j) out.emplace_back(d, kNumel);
      for (auto& b : out) views.push_back(b.t);
      pg.all_gather(views, in.t);
      for (int j = 0; j < n; ++j) {
        EXPECT_EQ(out[j].values(),
                  Buffer(d, values_for(ReduceOp::kSum, j, kNumel)).values())
            << "all_gather slot " << j << " on rank " << r << " "
            << dtype_name(d);
      }

      std::vector<Buffer> sends, recvs;
      std::vector<Tensor> send_views, recv_views;
      for (int t = 0; t < n; ++t) {
        std::vector<double> v(count(r, t));
        for (size_t i = 0; i < v.size(); ++i) v[i] = payload(r, t, i);
        sends.emplace_back(d, v);
        recvs.emplace_back(d, count(t, r));
      }
      for (auto& b : sends) send_views.push_back(b.t);
      for (auto& b : recvs) recv_views.push_back(b.t);
      pg.all_to_all(recv_views, send_views);
      for (int s = 0; s < n; ++s) {
        std::vector<double> want(count(s, r));
        for (size_t i = 0; i < want.size(); ++i) want[i] = payload(s, r, i);
        EXPECT_EQ(recvs[s].values(), Buffer(d, want).values())
            << "all_to_all from " << s << " on rank " << r << " "
            << dtype_name(d);
      }
    }
  });
}

// all_to_all in place (`out` is `in`, as torch's all_to_all(list, list)),
// over TCP and through shared memory: a block received over TCP once
// overwrote one not yet sent (3 ranks and more).
TEST_P(GlooCollectivesTest, InPlaceAllToAllOnEveryPath) {
  const int n = GetParam();
  for (const char* shm_min : {"off", "0"}) {
    setenv("DLAUNCH_COMM_SHM_MIN_BYTES", shm_min, 1);
    run_ranks(n, [&](ProcessGroup& pg) {
      const int r = pg.rank();
      for (size_t numel : {size_t{4}, size_t{1} << 16}) {
        std::vector<Buffer> blocks;
        std::vector<Tensor> views;
        for (int t = 0; t < n; ++t) {
          blocks.emplace_back(DType::kI32,
                              std::vector<double>(numel, r * 100 + t));
        }
        for (auto& b : blocks) views.push_back(b.t);
        pg.all_to_all(views, views);
        for (int s = 0; s < n; ++s) {
          EXPECT_EQ(blocks[s].values(), std::vector<double>(numel, s * 100 + r))
              << "from rank " << s << " on rank " << r << ", " << numel
              << " elements, DLAUNCH_COMM_SHM_MIN_BYTES=" << shm_min
              << " (path " << gloo::last_path(pg) << ")";
        }
      }
    });
  }
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
}

// In place with uneven splits: `in` and `out` are views of one buffer at
// different offsets, so an output block (the own one included) overlaps
// inputs still to be sent.
TEST_P(GlooCollectivesTest, InPlaceAllToAllWithUnevenSplits) {
  const int n = GetParam();
  // Circulant, not symmetric: every rank sends and receives as much, but
  // its own block sits at another offset in `out` than in `in`.
  auto count = [n](int s, int t) {
    return static_cast<size_t>((t - s + n) % n + 1);
  };
  auto payload = [](int s, int t, size_t i) {
    return static_cast<int32_t>(s * 1000 + t * 10 + static_cast<int>(i));
  };
  for (const char* shm_min : {"off", "0"}) {
    setenv("DLAUNCH_COMM_SHM_MIN_BYTES", shm_min, 1);
    run_ranks(n, [&](ProcessGroup& pg) {
      const int r = pg.rank();
      size_t total = 0;
      for (int t = 0; t < n; ++t) total += count(r, t);
      std::vector<int32_t> buf(total);
      std::vector<Tensor> ins, outs;
      size_t off = 0;
      for (int t = 0; t < n; ++t) {
        for (size_t i = 0; i < count(r, t); ++i)
          buf[off + i] = payload(r, t, i);
        ins.push_back(Tensor::of(buf.data() + off, count(r, t)));
        off += count(r, t);
      }
      off = 0;
      for (int s = 0; s < n; ++s) {
        outs.push_back(Tensor::of(buf.data() + off, count(s, r)));
        off += count(s, r);
      }
      pg.all_to_all(outs, ins);
      off = 0;
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < count(s, r); ++i) {
          EXPECT_EQ(buf[off + i], payload(s, r, i))
              << "from rank " << s << " element " << i << " on rank " << r
              << ", DLAUNCH_COMM_SHM_MIN_BYTES=" << shm_min;
        }
        off += count(s, r);
      }
    });
  }
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
}

TEST_P(GlooCollectivesTest, BarrierAndPointToPointRing) {
  const int n = GetParam();
  run_ranks(n, [&](ProcessGroup& pg) {
    pg.barrier();
    if (n == 1) return;
    const int r = pg.rank();
    const int right = (r + 1) % n;
    const int left = (r - 1 + n) % n;
    for (DType d : kAllDtypes) {
      // isend/irecv around the ring, waited in the order that would
      // deadlock without eager progress (send first on every rank).
      Buffer out(d, values_for(ReduceOp::kSum, r, kNumel));
      Buffer in(d, kNumel);
      auto s = pg.isend(out.t, right, 3);
      auto q = pg.irecv(in.t, left, 3);
      s->wait(pg.timeout());
      q->wait(pg.timeout());
      EXPECT_TRUE(s->is_completed());
      EXPECT_TRUE(q->is_completed());
      EXPECT_EQ(in.values(),
                Buffer(d, values_for(ReduceOp::kSum, left, kNumel)).values());
    }
    // Blocking send/recv between even and odd neighbours.
    if (r % 2 == 0 && r + 1 < n) {
      std::vector<int64_t> v{1, 2, 3, r};
      pg.send(Tensor::of(v), r + 1, 9);
      pg.recv(Tensor::of(v), r + 1, 9);
      EXPECT_EQ(v, (std::vector<int64_t>{r + 1, 4, 5, 6}));
    } else if (r % 2 == 1) {
      std::vector<int64_t> v(4);
      pg.recv(Tensor::of(v), r - 1, 9);
      EXPECT_EQ(v, (std::vector<int64_t>{1, 2, 3, r - 1}));
      v = {r, 4, 5, 6};
      pg.send(Tensor::of(v), r - 1, 9);
    }
    pg.barrier();
  });
}

TEST_P(GlooCollectivesTest, LargeFloatAllReduceSpansManySegments) {
  const int n = GetParam();
  const size_t numel = (1 << 18) + 3;  // > Gloo's 1 MiB segment, odd size
  run_ranks(n, [&](ProcessGroup& pg) {
    std::vector<float> v(numel);
    for (size_t i = 0; i < numel; ++i) {
      v[i] = static_cast<float>((i % 100) + pg.rank());
    }
    pg.all_reduce(Tensor::of(v), ReduceOp::kSum);
    const float rank_sum = static_cast<float>(n * (n - 1) / 2);
    for (size_t i = 0; i < numel; i += 997) {
      ASSERT_EQ(v[i], static_cast<float>(n * (i % 100)) + rank_sum) << i;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCollectivesTest,
                         ::testing::Range(1, 9), [](const auto& info) {
                           return "ranks" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace dlaunch::comm
