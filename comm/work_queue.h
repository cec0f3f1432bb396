#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/work.h"

namespace dlaunch::comm {

// One thread that runs a group's asynchronous operations in the order they
// were submitted, each completing the Work submit() returned (torch's
// async_op=True on a CPU backend). Owned by the group: start() before the
// first submit(), stop() (or the destructor) runs what is queued and joins.
// submit(), drain() and stop() are called by the group's user thread; Works
// may be waited on from any one thread and may outlive the queue.
class WorkQueue {
 public:
  WorkQueue() = default;
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  ~WorkQueue() { stop(); }

  // Starts the thread; a no-op when it runs already.
  void start();
  // Runs every queued operation to completion (each bounded by its own
  // timeout), then joins the thread. Idempotent.
  void stop();
  bool started() const { return thread_.joinable(); }

  // Queues `fn`, which runs on the queue's thread after every operation
  // submitted before it; `what` names it in messages ("all_reduce #3 on
  // group 'world' (rank 0 of 2)"). An exception thrown by `fn` is rethrown
  // by the Work's wait(). The returned Work's destructor waits for it at
  // most `destroy_wait` (the group's timeout). Needs start().
  std::unique_ptr<Work> submit(std::string what, std::function<void()> fn,
                               std::chrono::milliseconds destroy_wait);

  // Blocks until every submitted operation has finished, so that a blocking
  // call that follows runs after them (call order). Returns at once when
  // nothing is outstanding or when called on the queue's own thread. Throws
  // CommTimeoutError naming the running operation when none finishes within
  // `progress_timeout`.
  void drain(std::chrono::milliseconds progress_timeout);

  // True on the queue's own thread (inside a submitted operation).
  bool on_queue_thread() const {
    return std::this_thread::get_id() == thread_id_;
  }

  // One submitted operation (defined in work_queue.cc).
  struct Task;

 private:
  void loop();

  std::mutex mu_;                     // guards the members below
  std::condition_variable cv_;        // tasks queued or stopping
  std::condition_variable finished_;  // a task finished
  std::deque<std::shared_ptr<Task>> queue_;
  std::shared_ptr<Task> running_;
  uint64_t submitted_ = 0;
  uint64_t finished_count_ = 0;
  bool stopping_ = false;
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace dlaunch::comm
