// The Work contract of WorkQueue, the thread that runs a CPU group's
// asynchronous operations: call order, completion, timed waits, errors
// through wait(), drain() and destruction with work outstanding.
#include "comm/work_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <vector>

#include "comm/process_group.h"

namespace dlaunch::comm {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr milliseconds kLong{20000};

TEST(WorkQueueTest, RunsInSubmissionOrderOnItsOwnThread) {
  WorkQueue q;
  q.start();
  std::vector<int> order;
  std::vector<std::unique_ptr<Work>> works;
  bool off_thread = true;
  for (int i = 0; i < 100; ++i) {
    works.push_back(q.submit(
        "op " + std::to_string(i),
        [&, i] {
          off_thread = off_thread && q.on_queue_thread();
          order.push_back(i);
        },
        kLong));
  }
  EXPECT_FALSE(q.on_queue_thread());
  for (auto& w : works) w->wait(kLong);
  for (auto& w : works) EXPECT_TRUE(w->is_completed());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_TRUE(off_thread);
}

TEST(WorkQueueTest, WaitTimesOutNamingTheOperationAndCanBeWaitedAgain) {
  WorkQueue q;
  q.start();
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  auto w = q.submit(
      "all_reduce #7 on group 'g'", [opened] { opened.wait(); }, kLong);
  EXPECT_FALSE(w->is_completed());
  try {
    w->wait(milliseconds(50));
    FAIL() << "wait() returned while the operation was blocked";
  } catch (const CommTimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("all_reduce #7 on group 'g'"));
    EXPECT_THAT(e.what(), HasSubstr("50 ms"));
  }
  gate.set_value();
  w->wait(kLong);
  EXPECT_TRUE(w->is_completed());
}

TEST(WorkQueueTest, ErrorsSurfaceThroughWaitAndLaterWorkStillRuns) {
  WorkQueue q;
  q.start();
  auto bad = q.submit(
      "op", [] { throw CommError("bad argument on rank 1"); }, kLong);
  bool ran = false;
  auto good = q.submit(
      "op", [&] { ran = true; }, kLong);
  try {
    bad->wait(kLong);
    FAIL() << "the error did not surface";
  } catch (const CommTimeoutError&) {
    FAIL() << "a failure reported as a timeout";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad argument on rank 1"));
  }
  EXPECT_TRUE(bad->is_completed());
  good->wait(kLong);
  EXPECT_TRUE(ran);
}

TEST(WorkQueueTest, DrainWaitsForEarlierWorkAndBoundsTheWait) {
  WorkQueue q;
  q.drain(milliseconds(1));  // not started, nothing outstanding
  q.start();
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  bool second_ran = false;
  std::promise<void> began;
  auto w1 = q.submit(
      "broadcast #0",
      [opened, &began] {
        began.set_value();
        opened.wait();
      },
      kLong);
  auto w2 = q.submit(
      "barrier #1", [&] { second_ran = true; }, kLong);
  // The queue's thread has taken the first operation (a loaded machine may
  // start it later than the drain below would wait).
  began.get_future().wait();
  try {
    q.drain(milliseconds(50));
    FAIL() << "drain() returned with work outstanding";
  } catch (const CommTimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 outstanding"));
    EXPECT_THAT(e.what(), HasSubstr("running: broadcast #0"));
  }
  gate.set_value();
  q.drain(kLong);
  // After drain() every earlier operation has finished, without a wait().
  EXPECT_TRUE(w1->is_completed());
  EXPECT_TRUE(w2->is_completed());
  EXPECT_TRUE(second_ran);
}

TEST(WorkQueueTest, DrainOnTheQueueThreadDoesNotWaitForItself) {
  WorkQueue q;
  q.start();
  auto w = q.submit(
      "op", [&] { q.drain(milliseconds(50)); }, kLong);
  w->wait(kLong);
}

TEST(WorkQueueTest, DestroyingTheQueueRunsWhatIsQueuedAndWorksOutliveIt) {
  std::vector<std::unique_ptr<Work>> works;
  std::vector<int> order;
  {
    WorkQueue q;
    q.start();
    for (int i = 0; i < 10; ++i) {
      works.push_back(q.submit(
          "op", [&, i] { order.push_back(i); }, kLong));
    }
  }
  ASSERT_EQ(order.size(), 10u);
  for (auto& w : works) {
    EXPECT_TRUE(w->is_completed());
    w->wait(milliseconds(1));
  }
}

TEST(WorkQueueTest, StopIsIdempotentAndTheQueueRestarts) {
  WorkQueue q;
  q.stop();
  q.start();
  EXPECT_TRUE(q.started());
  q.stop();
  q.stop();
  EXPECT_FALSE(q.started());
  q.start();
  q.submit(
       "op", [] {}, kLong)
      ->wait(kLong);
}

}  // namespace
}  // namespace dlaunch::comm
