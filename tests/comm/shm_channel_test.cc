// The shared-memory meeting point of ranks on one host: every post is read
// intact by every peer across many calls (the two alternating slots), late
// ranks are named at the deadline, and ranks that leave (closing, or a
// process that dies without closing) fail their waiters at once.
#include "comm/gloo/shm_channel.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "comm/gloo/shm_sync.h"
#include "tests/testing/cpus.h"
#include "tests/testing/subprocess.h"

namespace dlaunch::comm::gloo {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using dlaunch::testing::allowed_cpus;

std::string unique_base() {
  std::random_device rd;
  return "/dlaunch-channel-test-" + std::to_string(::getpid()) + "-" +
         std::to_string(rd()) + "-";
}

// `n` channels of one group, all created and mapped.
std::vector<std::unique_ptr<ShmChannel>> make_group(const std::string& base,
                                                    int n, size_t slot) {
  std::vector<std::unique_ptr<ShmChannel>> out;
  std::string error;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::make_unique<ShmChannel>(base, r, n, slot, error));
    EXPECT_TRUE(out.back()->ok()) << error;
  }
  for (auto& c : out) EXPECT_TRUE(c->open_peers(error)) << error;
  for (auto& c : out) c->unlink();
  return out;
}

TEST(ShmChannelTest, EveryPeerReadsEveryPostIntactAcrossManyCalls) {
  constexpr int kRanks = 3;
  constexpr int kCalls = 2000;
  constexpr size_t kPayload = 4096;
  auto chans = make_group(unique_base(), kRanks, 8 + kPayload);
  std::vector<std::thread> threads;
  std::vector<int> bad(kRanks, 0);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      ShmChannel& ch = *chans[r];
      std::vector<char> payload(kPayload);
      for (int call = 0; call < kCalls; ++call) {
        const uint64_t word = uint64_t(call) << 8 | uint64_t(r);
        std::memset(payload.data(), (call * 7 + r) & 0xff, kPayload);
        ch.post({reinterpret_cast<const char*>(&word), 8}, payload);
        // Ranks arrive out of step so that some waits sleep.
        if ((call + r) % 97 == 0) std::this_thread::sleep_for(milliseconds(1));
        ch.wait(Clock::now() + std::chrono::seconds(20));
        for (int j = 0; j < kRanks; ++j) {
          uint64_t got;
          std::memcpy(&got, ch.slot(j), 8);
          const char* p = ch.slot(j) + 8;
          const char want = static_cast<char>((call * 7 + j) & 0xff);
          if (got != (uint64_t(call) << 8 | uint64_t(j)) || p[0] != want ||
              p[kPayload - 1] != want) {
            ++bad[r];
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(bad[r], 0) << "rank " << r;
}

TEST(ShmChannelTest, LateRanksAreNamedAtTheDeadline) {
  auto chans = make_group(unique_base(), 3, 64);
  chans[1]->post({}, {});  // rank 1 arrives, rank 2 never does
  chans[0]->post({}, {});
  auto start = Clock::now();
  try {
    chans[0]->wait(start + milliseconds(300));
    ADD_FAILURE() << "wait returned without rank 2";
  } catch (const ShmChannel::WaitError& e) {
    EXPECT_TRUE(e.timed_out);
    EXPECT_EQ(e.ranks, std::vector<int>{2});
  }
  EXPECT_GE(Clock::now() - start, milliseconds(290));
}

// Rank 1 closes while rank 0 sleeps in its wait (seen in /proc): the wait
// fails naming rank 1, long before its deadline (not timed out).
TEST(ShmChannelTest, ARankThatClosesFailsItsWaitersAtOnce) {
  auto chans = make_group(unique_base(), 2, 64);
  chans[0]->post({}, {});
  std::atomic<pid_t> waiter_tid{0};
  std::optional<ShmChannel::WaitError> error;
  std::thread waiter([&] {
    waiter_tid = ::gettid();
    try {
      chans[0]->wait(Clock::now() + std::chrono::seconds(20));
    } catch (const ShmChannel::WaitError& e) {
      error = e;
    }
  });
  EXPECT_TRUE(dlaunch::testing::eventually(
      [&] {
        return waiter_tid != 0 &&
               dlaunch::testing::process_state(waiter_tid) == 'S';
      },
      std::chrono::seconds(10)))
      << "rank 0 never slept in its wait";
  chans[1]->close();
  waiter.join();
  ASSERT_TRUE(error.has_value()) << "wait returned after rank 1 left";
  EXPECT_FALSE(error->timed_out);
  EXPECT_EQ(error->ranks, std::vector<int>{1});
}

TEST(ShmChannelTest, AProcessThatDiesWithoutClosingIsSeen) {
  const std::string base = unique_base();
  std::string error;
  ShmChannel mine(base, 0, 2, 64, error);
  ASSERT_TRUE(mine.ok()) << error;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 1 in another process: joins, then is killed mid-job. Its
    // channel object is never destroyed, so only its death can tell.
    std::string err;
    auto* peer = new ShmChannel(base, 1, 2, 64, err);
    char c = peer->ok() && peer->open_peers(err) ? 1 : 0;
    if (::write(ready[1], &c, 1) != 1) _exit(1);
    ::pause();  // until killed
    _exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(c, 1);
  ASSERT_TRUE(mine.open_peers(error)) << error;
  mine.unlink();
  ::shm_unlink((base + "1").c_str());  // the child will not live to do it
  mine.post({}, {});
  ::kill(child, SIGKILL);  // not reaped yet: a zombie counts as gone too
  // Not timed out: the death was seen, long before the deadline.
  try {
    mine.wait(Clock::now() + std::chrono::seconds(20));
    ADD_FAILURE() << "wait returned after rank 1 died";
  } catch (const ShmChannel::WaitError& e) {
    EXPECT_FALSE(e.timed_out);
    EXPECT_EQ(e.ranks, std::vector<int>{1});
  }
  EXPECT_TRUE(dlaunch::testing::wait_exit(child, std::chrono::seconds(10)));
}

// A waiter's spinning is bounded: SpinWait gives up (the caller then
// sleeps on the futex) after its pause and yield budgets, with or without
// a peer on its core, and reset() starts the budget over.
TEST(SpinWaitTest, GivesUpAfterItsBudgetAndResetStartsOver) {
  for (bool shares_core : {false, true}) {
    SpinWait spin;
    const auto start = Clock::now();
    while (spin.once(shares_core)) {
      ASSERT_LT(Clock::now() - start, std::chrono::seconds(30))
          << "SpinWait never gave up";
    }
    EXPECT_FALSE(spin.once(shares_core));
    spin.reset();
    EXPECT_TRUE(spin.once(shares_core));
  }
}

// move_off_cpu moves the thread to a free CPU of its mask, publishes it,
// and gives the mask back; a thread with one CPU, none free, fewer CPUs
// than ranks, or a rank whose CPU is unknown stays.
TEST(MoveOffCpuTest, MovesToAFreeCpuAndKeepsTheMask) {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: nowhere to move";
  std::thread([&] {
    std::atomic<int32_t> where{-7};
    ASSERT_TRUE(dlaunch::testing::pin_to({cpus[0]}));
    EXPECT_EQ(move_off_cpu(cpus[0], {}, where), -1) << "a bound thread moved";
    EXPECT_EQ(::sched_getcpu(), cpus[0]);
    ASSERT_TRUE(dlaunch::testing::pin_to(cpus));
    EXPECT_EQ(move_off_cpu(cpus[0], cpus, where), -1) << "onto a taken CPU";
    const std::vector<int> unknown = {cpus[0], -1};
    EXPECT_EQ(move_off_cpu(cpus[0], unknown, where), -1)
        << "moved with a rank's CPU unknown";
    std::vector<int> crowd(cpus.size() + 1, cpus[0]);
    EXPECT_EQ(move_off_cpu(cpus[0], crowd, where), -1)
        << "moved with more ranks than CPUs";
    EXPECT_EQ(where.load(), -7);
    const int free_cpu = cpus.back();
    std::vector<int> taken(cpus.begin(), cpus.end() - 1);
    EXPECT_EQ(move_off_cpu(cpus[0], taken, where), free_cpu);
    EXPECT_EQ(where.load(), free_cpu);
    EXPECT_EQ(allowed_cpus(), cpus) << "the mask was not given back";
  }).join();
}

// At most one move per kMoveEvery on each thread.
TEST(MoveOffCpuTest, OneTryPerIntervalPerThread) {
  std::thread([] {
    const auto start = Clock::now();
    EXPECT_TRUE(cpu_move_due());
    const bool again = cpu_move_due();
    // (A thread kept off the CPU for the whole interval may try again.)
    if (Clock::now() - start < kMoveEvery) {
      EXPECT_FALSE(again);
    }
    std::thread([] { EXPECT_TRUE(cpu_move_due()); }).join();
  }).join();
}

// Every rank of a channel counts the CPUs the ranks may use together (the
// union of their masks), so that decisions made from it agree: ranks
// pinned to one CPU each count 2, ranks pinned to the same one count 1.
TEST(ShmChannelTest, EveryRankCountsTheCpusOfAllRanks) {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU";
  for (bool apart : {true, false}) {
    const std::string base = unique_base();
    std::vector<std::unique_ptr<ShmChannel>> chans(2);
    std::atomic<int> made{0};
    std::vector<std::thread> threads;
    std::vector<int> counted(2, -1);
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        // EXPECT, not ASSERT: the peer waits for this rank's channel.
        EXPECT_TRUE(dlaunch::testing::pin_to({cpus[apart ? r : 0]}));
        std::string error;
        chans[r] = std::make_unique<ShmChannel>(base, r, 2, 64, error);
        made.fetch_add(1);  // before any ASSERT: the peer waits for it
        ASSERT_TRUE(chans[r]->ok()) << error;
        while (made.load() < 2) std::this_thread::yield();
        ASSERT_TRUE(chans[r]->open_peers(error)) << error;
        counted[r] = chans[r]->cpus();
      });
    }
    for (auto& t : threads) t.join();
    for (auto& c : chans) c->unlink();
    EXPECT_EQ(counted, std::vector<int>(2, apart ? 2 : 1))
        << (apart ? "ranks apart" : "ranks on one CPU");
  }
}

// Two ranks that start on one CPU while their masks allow more: the higher
// rank moves off it at a wait that finds its peer there, so that each has
// a core (before, they handed one core back and forth, a context switch
// per meeting, until the kernel separated them tens of milliseconds
// later). Where each ends is the scheduler's call (a busy machine may put
// them together again), so the test asserts the move (or that the kernel
// separated them first).
TEST(ShmChannelTest, RanksThatStartOnOneCpuMoveApart) {
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: nowhere to move";
  auto chans = make_group(unique_base(), 2, 64);
  std::atomic<int> pinned{0};
  std::vector<int> ended(2, -1);
  const uint64_t moves_before = cpu_moves();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const bool on_one = dlaunch::testing::pin_to({cpus[0]});
      pinned.fetch_add(1);  // before any ASSERT: the peer waits for it
      ASSERT_TRUE(on_one);
      while (pinned.load() < 2) std::this_thread::yield();
      // The thread stays on cpus[0] until something moves it.
      ASSERT_TRUE(dlaunch::testing::pin_to(cpus));
      ShmChannel& ch = *chans[r];
      for (int call = 0; call < 200; ++call) {
        ch.post({}, {});
        ch.wait(Clock::now() + std::chrono::seconds(20));
      }
      ended[r] = ::sched_getcpu();
    });
  }
  for (auto& t : threads) t.join();
  // On a busy machine the kernel may pull one rank to the other CPU first
  // (the other CPU just went idle), and then no move is due.
  EXPECT_TRUE(cpu_moves() >= moves_before + 1 || ended[0] != ended[1])
      << "no rank moved off CPU " << ended[0];
}

// Two ranks meeting `calls` times (or, with `until_slept`, until both have
// slept for sharing a CPU: each post says whether its rank has, so both
// stop after the same call), each thread pinned to its CPU in `cpus`;
// every post must be read intact. Returns each rank's shared_sleeps().
std::vector<uint64_t> meet_pinned(const std::vector<int>& cpus, int calls,
                                  bool until_slept) {
  auto chans = make_group(unique_base(), 2, 64);
  std::vector<int> bad(2, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      EXPECT_TRUE(dlaunch::testing::pin_to({cpus[r]}));
      ShmChannel& ch = *chans[r];
      const auto stop = Clock::now() + std::chrono::seconds(20);
      // Each post's second word: 1 once its rank slept, 2 past the bound.
      for (uint64_t call = 0;; ++call) {
        const uint64_t state = Clock::now() > stop      ? 2
                               : ch.shared_sleeps() > 0 ? 1
                                                        : 0;
        const uint64_t post[2] = {call << 8 | uint64_t(r), state};
        ch.post({reinterpret_cast<const char*>(post), sizeof(post)}, {});
        ch.wait(Clock::now() + std::chrono::seconds(20));
        uint64_t got[2];
        std::memcpy(got, ch.slot(1 - r), sizeof(got));
        if (got[0] != (call << 8 | uint64_t(1 - r))) ++bad[r];
        if (state == 2 || got[1] == 2) break;
        if (until_slept ? state == 1 && got[1] == 1
                        : call + 1 >= uint64_t(calls)) {
          break;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad, std::vector<int>(2, 0)) << "posts read wrong";
  return {chans[0]->shared_sleeps(), chans[1]->shared_sleeps()};
}

// Ranks on one CPU hand it over with sched_yield(), which pushes each
// one's scheduling deadline further out: after a millisecond of meetings
// that all found the peer on its CPU, a rank sleeps on the futex once
// (its wake-up resets the deadline and may move it to an idle CPU). Ranks
// on CPUs of their own never do.
TEST(ShmChannelTest, RanksSharingACpuSleepNowAndThenOthersNever) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  const std::vector<uint64_t> shared =
      meet_pinned({cpus[0], cpus[0]}, 0, /*until_slept=*/true);
  EXPECT_GT(shared[0], 0u) << "rank 0 never slept while sharing a CPU";
  EXPECT_GT(shared[1], 0u) << "rank 1 never slept while sharing a CPU";
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: no rank has its own";
  EXPECT_EQ(meet_pinned({cpus[0], cpus[1]}, 20000, false),
            std::vector<uint64_t>(2, 0));
}

// Every rank takes part in every call: a peer that left fails the call
// even while this rank still waits for another one (stopped, or slow),
// not at the deadline.
TEST(ShmChannelTest, APeerThatLeavesFailsAWaitForAnother) {
  auto chans = make_group(unique_base(), 3, 64);
  chans[0]->post({}, {});
  chans[2]->post({}, {});
  chans[2]->close();  // rank 1 never posts
  try {
    chans[0]->wait(Clock::now() + std::chrono::seconds(20));
    ADD_FAILURE() << "wait returned without rank 1";
  } catch (const ShmChannel::WaitError& e) {
    EXPECT_FALSE(e.timed_out) << "waited for rank 1 until the deadline";
    EXPECT_EQ(e.ranks, std::vector<int>{2});
  }
}

// A pipelined step waits for one rank; when it fails it names every rank
// that left, so that the one that failed first is among them.
TEST(ShmChannelTest, AWaitForOneRankNamesEveryPeerThatLeft) {
  auto chans = make_group(unique_base(), 3, 64);
  chans[1]->close();  // failed first
  chans[2]->close();  // left because of it
  try {
    chans[0]->wait_for(2, 1, Clock::now() + std::chrono::seconds(20));
    ADD_FAILURE() << "wait_for returned without rank 2";
  } catch (const ShmChannel::WaitError& e) {
    EXPECT_FALSE(e.timed_out);
    EXPECT_EQ(e.ranks, (std::vector<int>{1, 2}));
  }
}

// A peer that finished the call may leave at once; a waiter that sees it
// gone first must still take the post it waits for.
TEST(ShmChannelTest, APeerLeavingAfterTheCallFailsNobody) {
  auto chans = make_group(unique_base(), 3, 64);
  for (auto& c : chans) c->post({}, {});
  chans[2]->close();
  EXPECT_NO_THROW(chans[0]->wait(Clock::now() + std::chrono::seconds(20)));
  EXPECT_NO_THROW(
      chans[1]->wait_for(0, 1, Clock::now() + std::chrono::seconds(20)));
}

// The first failure recorded is the one every rank reads, also after its
// writer and rank 0 (whose segment holds it) have gone; later ones and
// over-long ones do not overwrite or overrun it.
TEST(ShmChannelTest, TheFirstFailureOutlivesItsWriterAndRankZero) {
  auto chans = make_group(unique_base(), 3, 64);
  EXPECT_EQ(chans[2]->first_failure(), "");
  EXPECT_TRUE(chans[1]->record_failure("rank 1: the root cause"));
  EXPECT_FALSE(chans[0]->record_failure("rank 0: rank 1 has left"));
  EXPECT_FALSE(chans[2]->record_failure(std::string(10000, 'x')));
  chans[1].reset();
  chans[0].reset();
  EXPECT_EQ(chans[2]->first_failure(), "rank 1: the root cause");

  auto other = make_group(unique_base(), 2, 64);
  EXPECT_TRUE(other[1]->record_failure(std::string(10000, 'y')));
  EXPECT_EQ(other[0]->first_failure(),
            std::string(ShmChannel::kFailureBytes, 'y'));
}

}  // namespace
}  // namespace dlaunch::comm::gloo
