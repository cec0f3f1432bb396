#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "comm/tensor.h"
#include "comm/work.h"

namespace dlaunch::comm {

// A failed communication call: bad argument (rank out of range, mismatched
// sizes or dtypes, unsupported op for a dtype) or a failed peer. The message
// names the operation, the group and, where known, the peer rank.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The longest timeout comm accepts (DLAUNCH_COMM_TIMEOUT, InitOptions,
// GroupOptions, new_group): 7 days, as for dlaunch's duration flags. The
// shortest is 1 ms.
inline constexpr std::chrono::milliseconds kMaxTimeout =
    std::chrono::hours(24 * 7);
inline constexpr const char* kTimeoutRangeText = "1 ms to 7 days";

// A communication call ran past its timeout.
class CommTimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A set of ranks that communicate (torch.distributed's ProcessGroup). Ranks
// are group ranks, 0..size()-1. Collectives must be called by every member in
// the same order. A group is used by one thread at a time; separate groups may
// be used from separate threads.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl".
  virtual std::string_view backend() const = 0;
  // Unique among the job's groups ("world", "world/1", ...).
  virtual const std::string& name() const = 0;
  // Bound on every blocking call of this group.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Point to point. A send matches the receive with the same tag from the
  // same peer; sizes must agree.
  virtual std::unique_ptr<Work> isend(Tensor t, int dst, int tag = 0) = 0;
  virtual std::unique_ptr<Work> irecv(Tensor t, int src, int tag = 0) = 0;
  // Blocking: isend/irecv, then wait(timeout()). A backend may override
  // them to skip the Work (gloo over shared memory: the latency path).
  virtual void send(Tensor t, int dst, int tag = 0) {
    isend(t, dst, tag)->wait(timeout());
  }
  virtual void recv(Tensor t, int src, int tag = 0) {
    irecv(t, src, tag)->wait(timeout());
  }

  // Collectives (blocking; in place where torch's are). Each runs on the
  // caller's thread, after every asynchronous operation issued before it.
  virtual void broadcast(Tensor t, int root) = 0;
  // Result lands in `t` on `root`; other ranks' `t` is left as sent.
  virtual void reduce(Tensor t, int root, ReduceOp op = ReduceOp::kSum) = 0;
  virtual void all_reduce(Tensor t, ReduceOp op = ReduceOp::kSum) = 0;
  // `in` holds size() tensors on root (ignored elsewhere); rank i gets in[i].
  virtual void scatter(Tensor out, std::span<const Tensor> in, int root) = 0;
  // `out` holds size() tensors on root (ignored elsewhere).
  virtual void gather(Tensor in, std::span<const Tensor> out, int root) = 0;
  // `out` holds size() tensors; out[i] receives rank i's `in`.
  virtual void all_gather(std::span<const Tensor> out, Tensor in) = 0;
  // `in` holds size() tensors; `out` = reduction over ranks of in[rank()].
  virtual void reduce_scatter(Tensor out, std::span<const Tensor> in,
                              ReduceOp op = ReduceOp::kSum) = 0;
  // out[i] receives rank i's in[rank()]; both hold size() tensors.
  virtual void all_to_all(std::span<const Tensor> out,
                          std::span<const Tensor> in) = 0;
  virtual void barrier() = 0;

  // The same collectives, asynchronous (torch's async_op=True): each returns
  // at once with a Work and runs after the operations issued before it, in
  // call order (gloo: on a thread the group owns; nccl: on the group's CUDA
  // stream). The tensors' memory must stay valid until Work::wait() returns;
  // the tensor lists are copied. Errors, bad arguments included, surface
  // through wait(). Every rank must issue the same sequence of operations,
  // blocking and asynchronous alike.
  virtual std::unique_ptr<Work> ibroadcast(Tensor t, int root) = 0;
  virtual std::unique_ptr<Work> ireduce(Tensor t, int root,
                                        ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::unique_ptr<Work> iall_reduce(Tensor t,
                                            ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::unique_ptr<Work> iscatter(Tensor out, std::span<const Tensor> in,
                                         int root) = 0;
  virtual std::unique_ptr<Work> igather(Tensor in, std::span<const Tensor> out,
                                        int root) = 0;
  virtual std::unique_ptr<Work> iall_gather(std::span<const Tensor> out,
                                            Tensor in) = 0;
  virtual std::unique_ptr<Work> ireduce_scatter(
      Tensor out, std::span<const Tensor> in, ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::unique_ptr<Work> iall_to_all(std::span<const Tensor> out,
                                            std::span<const Tensor> in) = 0;
  virtual std::unique_ptr<Work> ibarrier() = 0;

  // Collective over this group: every member calls it with the same sorted,
  // distinct `ranks` (ranks of this group). Members get the new group (its
  // rank i is ranks[i]); non-members get nullptr, as torch's
  // NON_GROUP_MEMBER. The new group's blocking calls are bounded by
  // `timeout` (torch's new_group(ranks, timeout)); without it, by this
  // group's timeout().
  virtual std::unique_ptr<ProcessGroup> new_group(
      const std::vector<int>& ranks, std::chrono::milliseconds timeout) = 0;
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) {
    return new_group(ranks, timeout());
  }
};

}  // namespace dlaunch::comm
