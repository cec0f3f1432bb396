// Failure paths of the gloo backend: mismatched arguments across ranks, bad
// ranks and tags, p2p size mismatches, timeouts, a peer that goes away
// mid-operation, and pending sends at destruction.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <latch>
#include <thread>
#include <vector>

#include "tests/comm/rank_threads.h"

namespace dlaunch::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using testing::run_ranks;

// Runs `f`, expecting a CommError whose message contains every `parts`.
template <class F>
void expect_comm_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no CommError";
  } catch (const CommError& e) {
    for (const char* p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

TEST(GlooErrorsTest, SizesThatDifferAcrossRanksFailEveryRank) {
  run_ranks(3, [](ProcessGroup& pg) {
    std::vector<float> v(pg.rank() == 1 ? 5 : 4, 1.0f);
    expect_comm_error([&] { pg.all_reduce(Tensor::of(v)); },
                      {"all_reduce on group 'world'",
                       "rank 1 passed 5 elements of float32, rank 0 passed 4 "
                       "elements of float32"});
    // Nothing moved, so the group is still usable.
    std::vector<float> w(4, 1.0f);
    pg.all_reduce(Tensor::of(w));
    EXPECT_EQ(w[0], 3.0f);
  });
}

TEST(GlooErrorsTest, SmallAndLargeSizesAcrossRanksFailEveryRank) {
  // Rank 0's all_reduce is small enough to travel with the argument check,
  // rank 1's is not: the check still catches it on both.
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> v(pg.rank() == 1 ? (1 << 20) : 4, 1.0f);
    expect_comm_error([&] { pg.all_reduce(Tensor::of(v)); },
                      {"rank 1 passed 1048576 elements of float32, rank 0 "
                       "passed 4 elements"});
  });
}

TEST(GlooErrorsTest, SmallAndLargeSizesFailEveryRankOverTcpToo) {
  // The same between hosts (shared memory off): rank 0's payload goes in
  // its Gloo message, which rank 1's check receives without overrunning.
  setenv("DLAUNCH_COMM_SHM_MIN_BYTES", "off", 1);
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> v(pg.rank() == 1 ? (1 << 20) : 4, 1.0f);
    expect_comm_error([&] { pg.all_reduce(Tensor::of(v)); },
                      {"rank 1 passed 1048576 elements of float32, rank 0 "
                       "passed 4 elements"});
  });
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
}

TEST(GlooErrorsTest, AllReduceOfANullOrGpuTensorIsAnErrorNotACrash) {
  // Small enough to travel with the argument check: nothing may be read
  // from the tensor before its check has passed, on either path.
  for (const char* shm : {"1048576", "off"}) {
    setenv("DLAUNCH_COMM_SHM_MIN_BYTES", shm, 1);
    run_ranks(2, [](ProcessGroup& pg) {
      Tensor null{nullptr, 4, DType::kF32, {}};
      expect_comm_error([&] { pg.all_reduce(null); },
                        {"has 4 elements but a null data pointer"});
      float host[4] = {};
      Tensor gpu = Tensor::of(host, 4);
      gpu.device = Device{DeviceType::kCuda, 0};
      expect_comm_error([&] { pg.all_reduce(gpu); },
                        {"the gloo backend takes CPU tensors"});
    });
  }
  unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES");
}

// Values no enum names (a cast of user input) and counts whose bytes wrap
// are errors on every rank, not an abort (dtype_size's check) or a transfer
// of the wrapped size (4 bytes moved; a crash in all_reduce).
TEST(GlooErrorsTest, UnknownEnumsAndWrappingCountsAreErrors) {
  run_ranks(2, [](ProcessGroup& pg) {
    float f[4] = {};
    Tensor odd = Tensor::of(f, 4);
    odd.dtype = static_cast<DType>(77);
    expect_comm_error([&] { pg.all_reduce(odd); },
                      {"t has no dtype this library knows (value 77)"});
    expect_comm_error(
        [&] { pg.all_reduce(Tensor::of(f, 4), static_cast<ReduceOp>(99)); },
        {"ReduceOp value 99 is none this library knows"});
    Tensor huge = Tensor::of(f, (size_t{1} << 62) + 1);
    const char* wraps = "more bytes than an address can span";
    expect_comm_error([&] { pg.all_reduce(huge); }, {wraps});
    expect_comm_error([&] { pg.broadcast(huge, 0); }, {wraps});
    if (pg.rank() == 0) {
      expect_comm_error([&] { pg.send(huge, 1, 5); }, {wraps});
    } else {
      expect_comm_error([&] { pg.recv(huge, 0, 5); }, {wraps});
    }
    pg.all_reduce(Tensor::of(f, 4));  // the group is still fine
  });
}

// wait(milliseconds::max()) waits: now + max overflowed the clock, and an
// asynchronous collective's wait timed out at once.
TEST(GlooErrorsTest, WaitingForEverWaits) {
  run_ranks(2, [](ProcessGroup& pg) {
    float f[4] = {1, 1, 1, 1};
    if (pg.rank() == 1) std::this_thread::sleep_for(milliseconds(200));
    auto w = pg.iall_reduce(Tensor::of(f, 4));
    w->wait(milliseconds::max());
    EXPECT_EQ(f[0], 2.0f);
  });
}

TEST(GlooErrorsTest, DtypesThatDifferAcrossRanksFailEveryRank) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<int32_t> i(4);
    std::vector<float> f(4);
    Tensor t = pg.rank() == 0 ? Tensor::of(f) : Tensor::of(i);
    expect_comm_error([&] { pg.broadcast(t, 0); },
                      {"broadcast", "rank 1 passed 4 elements of int32"});
  });
}

TEST(GlooErrorsTest, DifferentCollectivesAreNamed) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> v(4);
    if (pg.rank() == 0) {
      expect_comm_error([&] { pg.all_reduce(Tensor::of(v)); },
                        {"rank 1 called broadcast while rank 0 called "
                         "all_reduce"});
    } else {
      expect_comm_error([&] { pg.broadcast(Tensor::of(v), 0); },
                        {"rank 0 called all_reduce while rank 1 called "
                         "broadcast"});
    }
  });
}

TEST(GlooErrorsTest, BadRootOnOneRankFailsEveryRank) {
  run_ranks(3, [](ProcessGroup& pg) {
    std::vector<float> v(4);
    int root = pg.rank() == 2 ? 7 : 0;
    if (pg.rank() == 2) {
      expect_comm_error([&] { pg.reduce(Tensor::of(v), root); },
                        {"root 7 is out of range", "valid: 0..2"});
    } else {
      expect_comm_error([&] { pg.reduce(Tensor::of(v), root); },
                        {"rank 2 rejected its arguments"});
    }
  });
}

TEST(GlooErrorsTest, BitwiseOpOnFloatsAndWrongListSizes) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<double> v(4);
    expect_comm_error([&] { pg.all_reduce(Tensor::of(v), ReduceOp::kBxor); },
                      {"bxor", "integer dtypes only", "float64"});
    std::vector<float> out(2);
    std::vector<Tensor> in{Tensor::of(out)};  // needs 2
    expect_comm_error([&] { pg.all_gather(in, Tensor::of(out)); },
                      {"one tensor per rank (2), got 1"});
    Tensor gpu = Tensor::of(out);
    gpu.device = Device{DeviceType::kCuda, 0};
    expect_comm_error([&] { pg.all_reduce(gpu); },
                      {"CPU tensors", "cuda:0", "nccl backend"});
  });
}

TEST(GlooErrorsTest, PointToPointArgumentErrors) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> v(4);
    expect_comm_error([&] { pg.isend(Tensor::of(v), 2); },
                      {"rank 2 is out of range", "0..1"});
    expect_comm_error([&] { pg.irecv(Tensor::of(v), pg.rank()); },
                      {"cannot send to or receive from itself"});
    expect_comm_error([&] { pg.isend(Tensor::of(v), 1 - pg.rank(), -1); },
                      {"tag must be in 0..65535"});
  });
}

TEST(GlooErrorsTest, TagReusedWhileInFlightIsRejected) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> a(4, 1.0f), b(4, 2.0f);
    if (pg.rank() == 0) {
      auto w = pg.isend(Tensor::of(a), 1, 5);
      expect_comm_error([&] { pg.isend(Tensor::of(b), 1, 5); },
                        {"isend to rank 1 with tag 5 is still in flight",
                         "wait() on its Work first"});
      pg.barrier();  // rank 1 posts its recv only now
      w->wait(pg.timeout());
      pg.isend(Tensor::of(b), 1, 5)->wait(pg.timeout());  // free again
    } else {
      pg.barrier();
      pg.recv(Tensor::of(a), 0, 5);
      pg.recv(Tensor::of(b), 0, 5);
      EXPECT_EQ(a[0], 1.0f);
      EXPECT_EQ(b[0], 2.0f);
    }
  });
}

TEST(GlooErrorsTest, SendRecvSizeMismatchFailsBothSidesAndLeavesTagUsable) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> big(8, 7.0f), small(4, -1.0f);
    if (pg.rank() == 0) {
      expect_comm_error([&] { pg.send(Tensor::of(big), 1, 2); },
                        {"send to rank 1 (tag 2)",
                         "matching recv on rank 1 has 4 elements of float32",
                         "this rank has 8 elements of float32"});
      std::vector<float> four(4, 7.0f);
      pg.send(Tensor::of(four), 1, 2);
    } else {
      expect_comm_error([&] { pg.recv(Tensor::of(small), 0, 2); },
                        {"recv from rank 0 (tag 2)",
                         "matching send on rank 0 has 8 elements"});
      EXPECT_EQ(small[0], -1.0f);  // untouched by the failed recv
      pg.recv(Tensor::of(small), 0, 2);
      EXPECT_EQ(small[0], 7.0f);
    }
  });
}

TEST(GlooErrorsTest, ZeroLengthTensorsAndP2pDtypeMismatch) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<float> none;
    pg.all_reduce(Tensor::of(none));
    pg.broadcast(Tensor::of(none), 1);
    const int peer = 1 - pg.rank();
    auto s = pg.isend(Tensor::of(none), peer, 4);
    auto r = pg.irecv(Tensor::of(none), peer, 4);
    s->wait(pg.timeout());
    r->wait(pg.timeout());
    // Same byte count, different dtype: still a mismatch.
    std::vector<float> f(2, 1.0f);
    std::vector<int32_t> i(2, 5);
    if (pg.rank() == 0) {
      expect_comm_error([&] { pg.send(Tensor::of(f), 1, 6); },
                        {"2 elements of int32", "2 elements of float32"});
    } else {
      expect_comm_error([&] { pg.recv(Tensor::of(i), 0, 6); },
                        {"2 elements of float32", "2 elements of int32"});
      EXPECT_EQ(i[0], 5);
    }
  });
}

TEST(GlooErrorsTest, WorkWaitTimesOutAndCanBeWaitedAgain) {
  run_ranks(
      2,
      [](ProcessGroup& pg) {
        std::vector<int64_t> v{pg.rank() == 0 ? 42 : 0};
        if (pg.rank() == 1) {
          auto w = pg.irecv(Tensor::of(v), 0, 1);
          EXPECT_FALSE(w->is_completed());
          auto start = std::chrono::steady_clock::now();
          try {
            w->wait(milliseconds(100));
            ADD_FAILURE() << "wait returned before the send was posted";
          } catch (const CommTimeoutError& e) {
            EXPECT_THAT(e.what(), HasSubstr("recv from rank 0 (tag 1)"));
            EXPECT_THAT(e.what(), HasSubstr("timed out after 100 ms"));
          }
          // Hang guard, far below the group timeout: the wait's own 100 ms.
          EXPECT_LT(std::chrono::steady_clock::now() - start,
                    std::chrono::seconds(30));
          pg.barrier();
          w->wait(pg.timeout());
          EXPECT_TRUE(w->is_completed());
          EXPECT_EQ(v[0], 42);
        } else {
          pg.barrier();
          pg.send(Tensor::of(v), 1, 1);
        }
      },
      std::chrono::seconds(120));
}

// Timeouts and departures, on each path the argument check can take: the
// shared-memory channel (ranks on one host, the default here) and Gloo
// messages (between hosts; shared memory off).
class GlooPathErrorsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam()) setenv("DLAUNCH_COMM_SHM_MIN_BYTES", "off", 1);
  }
  void TearDown() override { unsetenv("DLAUNCH_COMM_SHM_MIN_BYTES"); }
};
INSTANTIATE_TEST_SUITE_P(Paths, GlooPathErrorsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "SharedMemory" : "Tcp";
                         });

TEST_P(GlooPathErrorsTest, CollectiveTimeoutNamesTheMissingRank) {
  // The world joins with a generous timeout (40 s); the sub-group under
  // test has 1.5 s (its set-up meets under it too: 3 ranks on 2 cores),
  // and rank 2 never calls all_reduce on it.
  std::latch others_failed(2);
  std::atomic<int> timed_out{0};
  auto rank = [&](ProcessGroup& world) {
    auto pg = world.new_group({0, 1, 2}, milliseconds(1500));
    std::vector<float> v(4);
    if (pg->rank() == 2) {
      others_failed.wait();  // leaves only once the others have failed
      return;
    }
    auto start = std::chrono::steady_clock::now();
    bool mine = false;  // this rank's own timeout ended the call
    try {
      pg->all_reduce(Tensor::of(v));
      ADD_FAILURE() << "all_reduce without rank 2 returned";
    } catch (const CommTimeoutError& e) {
      ++timed_out;
      mine = true;
      EXPECT_THAT(e.what(), HasSubstr("all_reduce on group 'world/1'"));
      EXPECT_THAT(e.what(), HasSubstr("waiting for rank 2 to call all_reduce"));
      EXPECT_THAT(e.what(), HasSubstr("1/2 peers arrived"));
    } catch (const CommError& e) {
      // The other waiting rank timed out first and left (on a loaded
      // machine its clock may run ahead by more than the shared-memory
      // channel's slack): this one fails on its leaving, naming that
      // first failure.
      EXPECT_THAT(e.what(), HasSubstr("has left the group"));
      EXPECT_THAT(e.what(), HasSubstr("first failure"));
      EXPECT_THAT(e.what(), HasSubstr("waiting for rank 2 to call all_reduce"));
    }
    auto elapsed = std::chrono::steady_clock::now() - start;
    if (mine) {
      EXPECT_GE(elapsed, milliseconds(1400));
    }
    // The sub-group's timeout ended it, not the world's (a bound that a
    // loaded machine cannot miss).
    EXPECT_LT(elapsed, seconds(20));
    // A failed group refuses further collectives with the cause.
    expect_comm_error([&] { pg->barrier(); },
                      {"unusable after an earlier failure"});
    others_failed.count_down();
  };
  run_ranks(3, rank, seconds(40));
  EXPECT_GE(timed_out.load(), 1) << "neither waiting rank timed out";
}

TEST_P(GlooPathErrorsTest, PeerGoneMidAllReduceFailsOthersFastNamingIt) {
  // Rank 2 tears its group down (closing its sockets, as a dying process
  // does) while ranks 0 and 1 are in all_reduce; the timeout is 40 s, the
  // others must fail in well under that (20 s: a bound that a loaded
  // machine cannot miss).
  auto rank = [](ProcessGroup& pg) {
    std::vector<float> v(1 << 16, 1.0f);
    pg.all_reduce(Tensor::of(v));
    if (pg.rank() == 2) return;  // run_ranks destroys the group
    auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 1000; ++i) pg.all_reduce(Tensor::of(v));
      ADD_FAILURE() << "all_reduce kept succeeding without rank 2";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("all_reduce on group 'world'"));
      EXPECT_THAT(e.what(), HasSubstr("rank 2"));
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
  };
  run_ranks(3, rank, seconds(40));
}

TEST(GlooErrorsTest, PendingSendIsDrainedWhenTheGroupIsDestroyed) {
  const size_t n = 4 << 20;  // 16 MiB of float
  auto store = std::make_shared<store::HashStore>();
  std::latch sender_destroyed(1);
  std::jthread receiver([&] {
    auto pg = make_process_group("gloo", store, 1, 2, std::chrono::seconds(20));
    // Posts its recv only once the sender's group is gone.
    sender_destroyed.wait();
    std::vector<float> v(n);
    pg->recv(Tensor::of(v), 0, 0);
    for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(v[i], float(i % 1000)) << i;
  });
  {
    auto pg = make_process_group("gloo", store, 0, 2, std::chrono::seconds(20));
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float(i % 1000);
    auto w = pg->isend(Tensor::of(v), 1, 0);
    pg.reset();  // destroy the group with the send in flight
    sender_destroyed.count_down();
    w.reset();  // the Work's destructor drains it
  }
  receiver.join();
}

}  // namespace
}  // namespace dlaunch::comm
