#pragma once

// Internal to the nccl backend (not a public header): the communicator's
// shared state, its watchdog, the Work of an enqueued operation, and the
// NcclProcessGroup class.

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl/process_group.h"
#include "comm/nccl/types.h"
#include "comm/op.h"
#include "comm/process_group.h"

namespace dlaunch::comm::nccl {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// One enqueued operation: its completion event on the group's stream and
// its fate. Shared by the Work and the watchdog.
struct OpState {
  std::string what;  // "all_reduce #17 on group 'world' (rank 0 of 2, cuda:0)"
  cudaEvent_t done_event = nullptr;
  Clock::time_point deadline;
  enum : int { kPending, kDone, kFailed };
  std::atomic<int> status{kPending};
  std::mutex mu;           // guards error
  std::string error;       // set before status becomes kFailed
  bool timed_out = false;  // set with error: past its deadline
};

// The communicator, its stream and the operations in flight; shared by a
// group, its Works and its watchdog. The mutex serialises enqueueing with
// abort(): NCCL calls on an aborted communicator are undefined.
struct CommState {
  std::string name;
  int rank = 0;
  int size = 0;
  int device = 0;
  milliseconds timeout{0};
  ncclComm_t comm = nullptr;
  // A blocking stream: implicitly ordered with the legacy default stream, so
  // kernels the caller ran there before a call are done before it moves
  // data, and later ones see its result.
  cudaStream_t stream = nullptr;
  std::shared_ptr<void> owned;
  void* barrier_buf = nullptr;  // ibarrier()'s one element, on the device

  std::mutex mu;       // guards everything below
  std::string broken;  // first fatal error; non-empty: the comm is aborted
  std::deque<std::shared_ptr<OpState>> pending;  // in stream order
  std::vector<cudaEvent_t> free_events;
  // Point-to-point calls not yet given to NCCL: they go as one NCCL group
  // (ncclGroupStart/End) when a Work of theirs is waited on or polled, or
  // before the next collective, so that a rank may isend to its right and
  // irecv from its left before waiting on either (on one stream, ungrouped,
  // both ranks' sends would wait for receives queued behind them).
  std::vector<std::function<ncclResult_t()>> p2p_calls;
  std::vector<std::shared_ptr<OpState>> p2p_ops;

  std::string where() const {
    return "group '" + name + "' (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ", cuda:" + std::to_string(device) + ")";
  }
  ~CommState();
  // Aborts the communicator (once), fails every pending operation with
  // `why` (a timeout when `timed_out`) and refuses later calls. mu held.
  void abort_locked(const std::string& why, bool timed_out = false);
  // At destruction: waits for pending operations until their deadlines,
  // aborting past one, then releases the communicator. mu held.
  void finish_locked();
  // Marks completed operations done and fails the first one past its
  // deadline or any after NCCL reported an asynchronous error. mu held.
  void poll_locked();
  cudaEvent_t take_event_locked();
  // Gives the batched point-to-point calls to NCCL as one group and records
  // their events. Throws CommError (and aborts) when NCCL fails. mu held.
  void flush_p2p_locked();
  // Runs `r`'s follow-up: settles an in-progress non-blocking call, or
  // aborts and throws naming `what` on an error. mu held.
  void finish_call_locked(ncclResult_t r, const std::string& what);
};

// One thread per group that notices failures nobody waits on: NCCL's
// asynchronous errors (a peer died) and operations past their deadline,
// then aborts the communicator, so that no call hangs. Owned by the group:
// start() at creation, stop() (or the destructor) joins.
class Watchdog {
 public:
  ~Watchdog() { stop(); }
  void start(std::shared_ptr<CommState> s, milliseconds interval);
  void stop();

 private:
  std::shared_ptr<CommState> s_;
  milliseconds interval_{100};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// The Work of an NCCL operation: complete when its event fired on the
// group's stream. wait() spins on the event (as nccl-tests do: a blocking
// wait costs microseconds at small sizes) and fails when the watchdog failed
// the operation, or itself aborts the communicator past the operation's
// deadline.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<CommState> s, std::shared_ptr<OpState> op)
      : s_(std::move(s)), op_(std::move(op)) {}
  ~NcclWork() override;
  void wait(milliseconds timeout) override;
  bool is_completed() override;

 private:
  std::shared_ptr<CommState> s_;
  std::shared_ptr<OpState> op_;
};

// A ProcessGroup over one NCCL communicator on one GPU. Operations are
// enqueued on the group's stream from the caller's thread (no thread hop),
// each followed by an event; blocking calls wait for it. No host-side
// argument agreement unless check_arguments (then over a Gloo group). One
// thread at a time; Works may outlive the group.
class NcclProcessGroup : public ProcessGroup {
 public:
  NcclProcessGroup(
      std::shared_ptr<CommState> s, std::unique_ptr<ProcessGroup> check,
      milliseconds watchdog_interval,
      std::function<std::unique_ptr<ProcessGroup>(const std::string&)>
          make_check_group);
  ~NcclProcessGroup() override;

  int rank() const override { return s_->rank; }
  int size() const override { return s_->size; }
  std::string_view backend() const override { return "nccl"; }
  const std::string& name() const override { return s_->name; }
  milliseconds timeout() const override { return s_->timeout; }

  std::unique_ptr<Work> isend(Tensor t, int dst, int tag) override;
  std::unique_ptr<Work> irecv(Tensor t, int src, int tag) override;

  void broadcast(Tensor t, int root) override {
    ibroadcast(t, root)->wait(timeout());
  }
  void reduce(Tensor t, int root, ReduceOp op) override {
    ireduce(t, root, op)->wait(timeout());
  }
  void all_reduce(Tensor t, ReduceOp op) override {
    iall_reduce(t, op)->wait(timeout());
  }
  void scatter(Tensor out, std::span<const Tensor> in, int root) override {
    iscatter(out, in, root)->wait(timeout());
  }
  void gather(Tensor in, std::span<const Tensor> out, int root) override {
    igather(in, out, root)->wait(timeout());
  }
  void all_gather(std::span<const Tensor> out, Tensor in) override {
    iall_gather(out, in)->wait(timeout());
  }
  void reduce_scatter(Tensor out, std::span<const Tensor> in,
                      ReduceOp op) override {
    ireduce_scatter(out, in, op)->wait(timeout());
  }
  void all_to_all(std::span<const Tensor> out,
                  std::span<const Tensor> in) override {
    iall_to_all(out, in)->wait(timeout());
  }
  void barrier() override { ibarrier()->wait(timeout()); }

  std::unique_ptr<Work> ibroadcast(Tensor t, int root) override;
  std::unique_ptr<Work> ireduce(Tensor t, int root, ReduceOp op) override;
  std::unique_ptr<Work> iall_reduce(Tensor t, ReduceOp op) override;
  std::unique_ptr<Work> iscatter(Tensor out, std::span<const Tensor> in,
                                 int root) override;
  std::unique_ptr<Work> igather(Tensor in, std::span<const Tensor> out,
                                int root) override;
  std::unique_ptr<Work> iall_gather(std::span<const Tensor> out,
                                    Tensor in) override;
  std::unique_ptr<Work> ireduce_scatter(Tensor out, std::span<const Tensor> in,
                                        ReduceOp op) override;
  std::unique_ptr<Work> iall_to_all(std::span<const Tensor> out,
                                    std::span<const Tensor> in) override;
  std::unique_ptr<Work> ibarrier() override;

  using ProcessGroup::new_group;
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          milliseconds timeout) override;

 private:
  // What one rank passed, for the debug argument check.
  struct Call {
    Op kind = Op::kNone;
    DType dtype = DType::kF32;
    uint64_t numel = 0;
    int64_t root = -1;
    ReduceOp op = ReduceOp::kSum;
    uint64_t extra = 0;
  };
  // Throws a CommError naming `what` when `local_error` is non-empty or,
  // with the check on, when any rank's Call differs from rank 0's.
  void check(const std::string& what, const Call& c,
             const std::string& local_error);
  std::string name_op(const char* op);
  std::unique_ptr<Work> post(bool is_send, Tensor t, int peer, int tag);
  std::string check_root(int root) const;
  std::string check_list(std::span<const Tensor> list, const char* name,
                         const Tensor& like) const;
  // Enqueues `body` (NCCL calls on the group's stream) and its event.
  template <class F>
  std::unique_ptr<Work> enqueue(std::string what, F&& body);

  std::shared_ptr<CommState> s_;
  std::unique_ptr<ProcessGroup> check_;  // null: no argument check
  std::function<std::unique_ptr<ProcessGroup>(const std::string&)>
      make_check_group_;
  milliseconds watchdog_interval_;
  uint64_t seq_ = 0;
  int children_ = 0;
  Watchdog watchdog_;
};

// Throws CommError naming `what` unless `r` is ncclSuccess.
void check_nccl(ncclResult_t r, const std::string& what, ncclComm_t comm);
// Throws CommError naming `what` unless `e` is cudaSuccess.
void check_cuda(cudaError_t e, const std::string& what);
// Waits until a non-blocking communicator leaves ncclInProgress, at most
// until `deadline`; throws CommError (CommTimeoutError) naming `what`.
void settle(ncclComm_t comm, const std::string& what,
            Clock::time_point deadline);

}  // namespace dlaunch::comm::nccl
