// The asynchronous collectives (torch's async_op=True): each queues the
// blocking form on the group's WorkQueue, so that the caller's blocking calls
// never hop threads and the shared-memory path keeps its latency.

#include <string>
#include <utility>
#include <vector>

#include "comm/gloo/gloo_group.h"

namespace dlaunch::comm::gloo {

GlooProcessGroup::~GlooProcessGroup() { async_.stop(); }

std::unique_ptr<Work> GlooProcessGroup::enqueue(const char* op,
                                                std::function<void()> fn) {
  async_.start();
  std::string what = std::string(op) + " #" + std::to_string(async_seq_++) +
                     " (async) on " + g_->where();
  return async_.submit(std::move(what), std::move(fn), g_->timeout);
}

std::unique_ptr<Work> GlooProcessGroup::ibroadcast(Tensor t, int root) {
  return enqueue("broadcast", [this, t, root] { broadcast(t, root); });
}

std::unique_ptr<Work> GlooProcessGroup::ireduce(Tensor t, int root,
                                                ReduceOp rop) {
  return enqueue("reduce", [this, t, root, rop] { reduce(t, root, rop); });
}

std::unique_ptr<Work> GlooProcessGroup::iall_reduce(Tensor t, ReduceOp rop) {
  return enqueue("all_reduce", [this, t, rop] { all_reduce(t, rop); });
}

std::unique_ptr<Work> GlooProcessGroup::iscatter(Tensor out,
                                                 std::span<const Tensor> in,
                                                 int root) {
  return enqueue("scatter",
                 [this, out, in = std::vector<Tensor>(in.begin(), in.end()),
                  root] { scatter(out, in, root); });
}

std::unique_ptr<Work> GlooProcessGroup::igather(Tensor in,
                                                std::span<const Tensor> out,
                                                int root) {
  return enqueue("gather",
                 [this, in, out = std::vector<Tensor>(out.begin(), out.end()),
                  root] { gather(in, out, root); });
}

std::unique_ptr<Work> GlooProcessGroup::iall_gather(std::span<const Tensor> out,
                                                    Tensor in) {
  return enqueue("all_gather",
                 [this, out = std::vector<Tensor>(out.begin(), out.end()), in] {
                   all_gather(out, in);
                 });
}

std::unique_ptr<Work> GlooProcessGroup::ireduce_scatter(
    Tensor out, std::span<const Tensor> in, ReduceOp rop) {
  return enqueue("reduce_scatter",
                 [this, out, in = std::vector<Tensor>(in.begin(), in.end()),
                  rop] { reduce_scatter(out, in, rop); });
}

std::unique_ptr<Work> GlooProcessGroup::iall_to_all(
    std::span<const Tensor> out, std::span<const Tensor> in) {
  return enqueue("all_to_all",
                 [this, out = std::vector<Tensor>(out.begin(), out.end()),
                  in = std::vector<Tensor>(in.begin(), in.end())] {
                   all_to_all(out, in);
                 });
}

std::unique_ptr<Work> GlooProcessGroup::ibarrier() {
  return enqueue("barrier", [this] { barrier(); });
}

}  // namespace dlaunch::comm::gloo
