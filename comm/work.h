#pragma once

#include <algorithm>
#include <chrono>

namespace dlaunch::comm {

// `t` as a condition variable's wait_for can take: now + milliseconds::max()
// overflows the clock (the wait ended at once); such waits last 100 years.
inline std::chrono::milliseconds addable_timeout(std::chrono::milliseconds t) {
  return std::min<std::chrono::milliseconds>(t, std::chrono::hours(24 * 36525));
}

// The handle of an asynchronous operation (isend/irecv, and the i-forms of
// the collectives). Owned by the caller; it may outlive its group.
// Destroying an incomplete Work waits for it (bounded by the group timeout).
// One thread at a time.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completes. Throws CommError if it failed, or
  // CommTimeoutError naming the operation and peer after `timeout` (the
  // operation keeps running; the Work can be waited on again).
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // True once the operation finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
};

}  // namespace dlaunch::comm
