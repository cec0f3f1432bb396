#include "comm/work_queue.h"

#include <exception>
#include <utility>

#include "comm/check.h"
#include "comm/process_group.h"

namespace dlaunch::comm {
namespace {

using std::chrono::milliseconds;

std::string ms_text(milliseconds t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + " s";
  return std::to_string(t.count()) + " ms";
}

}  // namespace

// One submitted operation; shared by the queue and the Work, which may
// outlive the queue.
struct WorkQueue::Task {
  std::string what;
  std::function<void()> fn;
  std::mutex mu;  // guards done and error
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

namespace {

// The Work of a queued operation: completion is the task's done flag.
class QueuedWork : public Work {
 public:
  QueuedWork(std::shared_ptr<WorkQueue::Task> t, milliseconds destroy_wait)
      : task_(std::move(t)), destroy_wait_(destroy_wait) {}

  // Waits for the operation (bounded, never throws): the caller's buffers
  // must stay valid while it runs.
  ~QueuedWork() override {
    std::unique_lock lock(task_->mu);
    task_->cv.wait_for(lock, destroy_wait_, [&] { return task_->done; });
  }

  void wait(milliseconds timeout) override {
    std::unique_lock lock(task_->mu);
    if (!task_->cv.wait_for(lock, addable_timeout(timeout),
                            [&] { return task_->done; })) {
      throw CommTimeoutError(task_->what + ": not completed after " +
                             ms_text(timeout) +
                             "; it keeps running and the Work can be waited "
                             "on again");
    }
    if (task_->error) std::rethrow_exception(task_->error);
  }

  bool is_completed() override {
    std::lock_guard lock(task_->mu);
    return task_->done;
  }

 private:
  std::shared_ptr<WorkQueue::Task> task_;
  milliseconds destroy_wait_;
};

}  // namespace

void WorkQueue::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  thread_ = std::thread([this] { loop(); });
  thread_id_ = thread_.get_id();
}

void WorkQueue::stop() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  thread_id_ = {};
}

std::unique_ptr<Work> WorkQueue::submit(std::string what,
                                        std::function<void()> fn,
                                        milliseconds destroy_wait) {
  auto task = std::make_shared<Task>();
  task->what = std::move(what);
  task->fn = std::move(fn);
  {
    std::lock_guard lock(mu_);
    DLAUNCH_CHECK(thread_.joinable() && !stopping_,
                  "WorkQueue::submit() before start() or after stop()");
    queue_.push_back(task);
    ++submitted_;
  }
  cv_.notify_one();
  return std::make_unique<QueuedWork>(std::move(task), destroy_wait);
}

void WorkQueue::drain(milliseconds progress_timeout) {
  // Never started: nothing was submitted (every blocking collective
  // passes here, so a group without asynchronous calls takes no lock).
  if (on_queue_thread() || !started()) return;
  std::unique_lock lock(mu_);
  while (finished_count_ < submitted_) {
    const uint64_t before = finished_count_;
    if (!finished_.wait_for(lock, progress_timeout,
                            [&] { return finished_count_ != before; })) {
      const std::string running = running_ ? running_->what : "(none)";
      throw CommTimeoutError(
          "a blocking call waited " + ms_text(progress_timeout) +
          " for the asynchronous operations issued before it (" +
          std::to_string(submitted_ - finished_count_) +
          " outstanding; running: " + running + ")");
    }
  }
}

// The thread: runs tasks in order; once stopping, runs what is left.
void WorkQueue::loop() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = task;
    }
    std::exception_ptr error;
    try {
      task->fn();
    } catch (...) {
      error = std::current_exception();
    }
    task->fn = nullptr;  // drops what the operation captured
    {
      std::lock_guard lock(task->mu);
      task->error = error;
      task->done = true;
    }
    task->cv.notify_all();
    {
      std::lock_guard lock(mu_);
      running_.reset();
      ++finished_count_;
    }
    finished_.notify_all();
  }
}

}  // namespace dlaunch::comm
