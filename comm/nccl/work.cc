// The communicator's state, the watchdog, and the Work of an operation.

#include <string>
#include <thread>

#include "comm/nccl/nccl_group.h"

namespace dlaunch::comm::nccl {
namespace {

std::string ms_text(milliseconds t) {
  if (t.count() % 1000 == 0) return std::to_string(t.count() / 1000) + " s";
  return std::to_string(t.count()) + " ms";
}

void fail_op(OpState& op, const std::string& why, bool timed_out) {
  {
    std::lock_guard lock(op.mu);
    op.error = why;
    op.timed_out = timed_out;
  }
  op.status.store(OpState::kFailed, std::memory_order_release);
}

}  // namespace

void check_nccl(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  throw CommError(what + ": " + result_text(r, last ? last : ""));
}

void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw CommError(what + ": CUDA error " + cudaGetErrorName(e) + " (" +
                  cudaGetErrorString(e) + ")");
}

// NCCL offers no event for a non-blocking communicator's state: poll, with a
// yield, as torch does (set-up only, never per operation on a settled comm).
void settle(ncclComm_t comm, const std::string& what,
            Clock::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) check_nccl(r, what, comm);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) check_nccl(state, what, comm);
    if (Clock::now() > deadline) {
      throw CommTimeoutError(what +
                             ": not finished by its deadline (a rank did not "
                             "join, or is slow to); the communicator is "
                             "aborted");
    }
    std::this_thread::yield();
  }
}

CommState::~CommState() {
  std::lock_guard lock(mu);
  finish_locked();
  for (cudaEvent_t e : free_events) cudaEventDestroy(e);
  if (barrier_buf != nullptr) cudaFree(barrier_buf);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void CommState::finish_locked() {
  while (!pending.empty() && broken.empty()) {
    auto& op = pending.front();
    if (op->status.load() == OpState::kDone ||
        cudaEventQuery(op->done_event) == cudaSuccess) {
      op->status.store(OpState::kDone);
      pending.pop_front();
    } else if (Clock::now() > op->deadline) {
      abort_locked(op->what +
                       " was still running when its group was "
                       "destroyed and timed out after " +
                       ms_text(timeout) + "; the communicator is aborted",
                   true);
    } else {
      std::this_thread::yield();
    }
  }
  if (comm == nullptr) return;
  // A non-blocking communicator finalises asynchronously; bounded like the
  // operations.
  try {
    check_nccl(ncclCommFinalize(comm), "ncclCommFinalize on " + where(), comm);
    settle(comm, "ncclCommFinalize on " + where(), Clock::now() + timeout);
    ncclCommDestroy(comm);
  } catch (const CommError&) {
    ncclCommAbort(comm);
  }
  comm = nullptr;
}

void CommState::abort_locked(const std::string& why, bool timed_out) {
  if (broken.empty()) {
    broken = why;
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;  // aborting frees it
  }
  for (auto& op : pending) fail_op(*op, why, timed_out);
  for (auto& op : p2p_ops) fail_op(*op, why, timed_out);
  pending.clear();  // each OpState's event is released by its Work
  p2p_ops.clear();
  p2p_calls.clear();
}

void CommState::finish_call_locked(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return;
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    // Refused before anything was enqueued: the communicator is intact.
    check_nccl(r, what, comm);
  }
  try {
    if (r != ncclInProgress) check_nccl(r, what, comm);
    settle(comm, what, Clock::now() + timeout);
  } catch (const CommError& e) {
    abort_locked(std::string(e.what()) + "; the communicator is aborted");
    throw CommError(broken);
  }
}

void CommState::flush_p2p_locked() {
  if (p2p_calls.empty()) return;
  auto calls = std::move(p2p_calls);
  auto ops = std::move(p2p_ops);
  p2p_calls.clear();
  p2p_ops.clear();
  const std::string what = ops.size() == 1 ? ops.front()->what
                                           : std::to_string(ops.size()) +
                                                 " point-to-point calls from " +
                                                 ops.front()->what;
  try {
    if (!broken.empty()) throw CommError(broken);
    check_cuda(cudaSetDevice(device), "cudaSetDevice on " + where());
    ncclResult_t r = ncclGroupStart();
    for (auto& call : calls) {
      if (r == ncclSuccess) r = call();
    }
    ncclResult_t end = ncclGroupEnd();
    finish_call_locked(r != ncclSuccess ? r : end, what);
    for (auto& op : ops) {
      op->done_event = take_event_locked();
      check_cuda(cudaEventRecord(op->done_event, stream),
                 "cudaEventRecord on " + where());
      pending.push_back(op);
    }
  } catch (const CommError& e) {
    for (auto& op : ops) fail_op(*op, e.what(), false);
    throw;
  }
}

cudaEvent_t CommState::take_event_locked() {
  if (!free_events.empty()) {
    cudaEvent_t e = free_events.back();
    free_events.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
             "cudaEventCreate on " + where());
  return e;
}

void CommState::poll_locked() {
  if (!broken.empty()) return;
  if (!p2p_ops.empty() && Clock::now() > p2p_ops.front()->deadline) {
    abort_locked(p2p_ops.front()->what + " was never waited on within " +
                     ms_text(timeout) + "; the communicator is aborted",
                 true);
    return;
  }
  if (pending.empty()) return;
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm, &state);
  if (state != ncclSuccess && state != ncclInProgress) {
    const char* last = ncclGetLastError(comm);
    abort_locked(pending.front()->what +
                 " failed: " + result_text(state, last ? last : "") +
                 "; the communicator is aborted");
    return;
  }
  while (!pending.empty()) {
    auto& op = pending.front();
    if (op->status.load(std::memory_order_acquire) == OpState::kDone ||
        (op->done_event && cudaEventQuery(op->done_event) == cudaSuccess)) {
      op->status.store(OpState::kDone, std::memory_order_release);
      pending.pop_front();
      continue;
    }
    if (Clock::now() > op->deadline) {
      abort_locked(op->what + " timed out after " + ms_text(timeout) +
                       " (a rank did not call it, or died); the "
                       "communicator is aborted",
                   true);
    }
    return;
  }
}

void Watchdog::start(std::shared_ptr<CommState> s, milliseconds interval) {
  s_ = std::move(s);
  interval_ = interval;
  stopping_ = false;
  thread_ = std::thread([this] {
    cudaSetDevice(s_->device);
    std::unique_lock lock(mu_);
    // A periodic look: NCCL reports asynchronous errors only when asked.
    while (!cv_.wait_for(lock, interval_, [&] { return stopping_; })) {
      std::lock_guard state(s_->mu);
      s_->poll_locked();
    }
  });
}

void Watchdog::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

NcclWork::~NcclWork() {
  try {
    if (!is_completed()) wait(s_->timeout);
  } catch (const std::exception&) {
    // Reported by wait() to whoever waits; a destructor cannot.
  }
  // A completed operation's event goes back to the pool; a failed one's is
  // destroyed (the comm was aborted); a pending one's (past a wait timeout)
  // stays with the operation, which the group still tracks.
  std::lock_guard lock(s_->mu);
  const int st = op_->status.load();
  if (st == OpState::kPending || op_->done_event == nullptr) return;
  if (st == OpState::kDone) {
    s_->free_events.push_back(op_->done_event);
  } else {
    cudaEventDestroy(op_->done_event);
  }
  op_->done_event = nullptr;
}

bool NcclWork::is_completed() {
  int st = op_->status.load(std::memory_order_acquire);
  if (st != OpState::kPending) return true;
  if (op_->done_event == nullptr) {  // a batched p2p call: give it to NCCL
    std::lock_guard lock(s_->mu);
    try {
      if (op_->done_event == nullptr) s_->flush_p2p_locked();
    } catch (const CommError&) {
      return true;  // failed; wait() reports it
    }
    if (op_->status.load() != OpState::kPending) return true;
  }
  if (cudaEventQuery(op_->done_event) == cudaSuccess) {
    op_->status.store(OpState::kDone, std::memory_order_release);
    return true;
  }
  return false;
}

void NcclWork::wait(milliseconds timeout) {
  const auto until = Clock::now() + addable_timeout(timeout);
  for (uint64_t spins = 0;; ++spins) {
    if (is_completed()) break;
    // The clock and the yield only every so often: a small operation
    // completes within microseconds.
    if ((spins & 1023) != 1023) continue;
    const auto now = Clock::now();
    if (now > op_->deadline) {
      std::lock_guard lock(s_->mu);
      if (op_->status.load() == OpState::kPending) {
        s_->abort_locked(op_->what + " timed out after " +
                             ms_text(s_->timeout) +
                             " (a rank did not call it, or died); the "
                             "communicator is aborted",
                         true);
      }
      continue;
    }
    if (now > until) {
      throw CommTimeoutError(op_->what + ": not completed after " +
                             ms_text(timeout) +
                             "; it keeps running and the Work can be waited "
                             "on again");
    }
    std::this_thread::yield();
  }
  if (op_->status.load(std::memory_order_acquire) == OpState::kFailed) {
    std::lock_guard lock(op_->mu);
    if (op_->timed_out) throw CommTimeoutError(op_->error);
    throw CommError(op_->error);
  }
}

}  // namespace dlaunch::comm::nccl
