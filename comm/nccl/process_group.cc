// Group set-up (create_process_group, new_group), the options read from the
// environment, and every operation of NcclProcessGroup.

#include "comm/nccl/process_group.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/nccl/nccl_group.h"

namespace dlaunch::comm::nccl {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

int env_int(const char* name, const char* hint) {
  const char* v = env(name);
  int out = 0;
  auto [end, ec] = std::from_chars(v, v + std::strlen(v), out);
  if (ec != std::errc() || *end != '\0' || out < 0) {
    throw CommError(std::string(name) + " is '" + v +
                    "'; expected a CUDA device ordinal (0, 1, ...)" + hint);
  }
  return out;
}

// True when the tensors lie back to back in one allocation, as NCCL's
// native all-gather, reduce-scatter, gather and scatter need.
bool contiguous(std::span<const Tensor> list) {
  for (size_t i = 1; i < list.size(); ++i) {
    if (static_cast<const char*>(list[i].data) !=
        static_cast<const char*>(list[0].data) + i * list[0].nbytes()) {
      return false;
    }
  }
  return true;
}

ncclConfig_t make_config(const std::string& name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: set-up and split return at once, so that they can be
  // bounded by the timeout and aborted (a blocking init waits forever for a
  // rank that never comes).
  c.blocking = 0;
  c.commName = name.c_str();
  return c;
}

}  // namespace

int resolve_device(int requested) {
  if (requested >= 0) return requested;
  if (env("DLAUNCH_CUDA_DEVICE")) {
    return env_int("DLAUNCH_CUDA_DEVICE",
                   " (dlaunch --gpu-binding per-rank sets it to 0)");
  }
  if (env("LOCAL_RANK")) {
    return env_int("LOCAL_RANK", " (dlaunch and torchrun set it)");
  }
  return 0;
}

bool resolve_check_arguments(std::optional<bool> requested) {
  if (requested) return *requested;
  if (const char* c = env("DLAUNCH_NCCL_CHECK")) {
    std::string_view v = c;
    if (v == "1") return true;
    if (v == "0") return false;
    throw CommError(std::string("DLAUNCH_NCCL_CHECK is '") + c +
                    "'; expected 1 (check every call's arguments across "
                    "ranks) or 0");
  }
  if (const char* d = env("TORCH_DISTRIBUTED_DEBUG")) {
    return std::string_view(d) == "DETAIL";
  }
  return false;
}

int visible_devices(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) {
      *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" +
             cudaGetErrorString(e) + ")";
    }
    cudaGetLastError();  // clear the sticky-free error for later calls
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found no device";
  return n;
}

std::unique_ptr<ProcessGroup> create_process_group(const GroupOptions& o) {
  if (!o.store || o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    throw CommError(
        "nccl::create_process_group needs a store and 0 <= rank "
        "< size; got rank " +
        std::to_string(o.rank) + " of " + std::to_string(o.size));
  }
  const std::string who = "backend 'nccl', group '" + o.name + "', rank " +
                          std::to_string(o.rank) + " of " +
                          std::to_string(o.size);
  std::string why;
  const int devices = visible_devices(&why);
  if (devices == 0) {
    throw CommError(who + ": no CUDA device is visible (" + why +
                    "); run on a machine with an NVIDIA GPU, one per rank, "
                    "or use backend 'gloo'");
  }
  const int device = resolve_device(o.device);
  if (device >= devices) {
    const char* cvd = env("CUDA_VISIBLE_DEVICES");
    throw CommError(
        who + ": CUDA device " + std::to_string(device) +
        " does not exist; this process sees " + std::to_string(devices) +
        " device(s) (CUDA_VISIBLE_DEVICES=" + (cvd ? cvd : "unset") +
        "); run at most one rank per GPU, or with dlaunch "
        "--gpu-binding per-rank");
  }
  const bool checking = resolve_check_arguments(o.check_arguments);
  if (checking && !o.make_check_group) {
    throw CommError(who +
                    ": the argument check is on but GroupOptions has no "
                    "make_check_group");
  }
  check_cuda(cudaSetDevice(device),
             who + ": cudaSetDevice(" + std::to_string(device) + ")");
  const auto deadline = Clock::now() + o.timeout;

  auto s = std::make_shared<CommState>();
  s->name = o.name;
  s->rank = o.rank;
  s->size = o.size;
  s->device = device;
  s->timeout = o.timeout;
  s->owned = o.owned;
  ncclUniqueId id = exchange_unique_id(
      *o.store, "nccl/" + o.name + "/unique_id", o.rank, o.timeout, [&] {
        ncclUniqueId made;
        check_nccl(ncclGetUniqueId(&made), who + ": ncclGetUniqueId", nullptr);
        return made;
      });
  ncclConfig_t config = make_config(o.name);
  const std::string init = "ncclCommInitRankConfig on " + s->where();
  ncclResult_t r =
      ncclCommInitRankConfig(&s->comm, o.size, id, o.rank, &config);
  try {
    if (r != ncclSuccess && r != ncclInProgress) check_nccl(r, init, s->comm);
    settle(s->comm, init, deadline);
  } catch (const CommError&) {
    if (s->comm != nullptr) ncclCommAbort(s->comm);
    s->comm = nullptr;
    throw;
  }
  check_cuda(cudaStreamCreate(&s->stream), "cudaStreamCreate on " + s->where());
  std::unique_ptr<ProcessGroup> check;
  if (checking) check = o.make_check_group(o.name + "/nccl-check");
  return std::make_unique<NcclProcessGroup>(
      std::move(s), std::move(check), o.watchdog_interval, o.make_check_group);
}

NcclProcessGroup::NcclProcessGroup(
    std::shared_ptr<CommState> s, std::unique_ptr<ProcessGroup> check,
    milliseconds watchdog_interval,
    std::function<std::unique_ptr<ProcessGroup>(const std::string&)>
        make_check_group)
    : s_(std::move(s)),
      check_(std::move(check)),
      make_check_group_(std::move(make_check_group)),
      watchdog_interval_(watchdog_interval) {
  watchdog_.start(s_, watchdog_interval_);
}

// Works may outlive the group: the communicator goes with the last owner
// of the state (CommState's destructor waits for what is in flight).
NcclProcessGroup::~NcclProcessGroup() {
  watchdog_.stop();
  std::lock_guard lock(s_->mu);
  try {
    s_->flush_p2p_locked();
  } catch (const CommError&) {
    // Their Works report it.
  }
}

std::string NcclProcessGroup::name_op(const char* op) {
  return std::string(op) + " #" + std::to_string(seq_++) + " on " + s_->where();
}

std::string NcclProcessGroup::check_root(int root) const {
  if (root < 0 || root >= size()) {
    return "root " + std::to_string(root) + " is out of range for a group of " +
           std::to_string(size()) + ". ";
  }
  return {};
}

std::string NcclProcessGroup::check_list(std::span<const Tensor> list,
                                         const char* name,
                                         const Tensor& like) const {
  if (list.size() != static_cast<size_t>(size())) {
    return std::string(name) + " holds " + std::to_string(list.size()) +
           " tensors; expected one per rank (" + std::to_string(size()) + "). ";
  }
  std::string err;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string n = std::string(name) + "[" + std::to_string(i) + "]";
    err += tensor_error(list[i], s_->device, n);
    if (list[i].dtype != like.dtype || list[i].numel != like.numel) {
      err += n + " has " + std::to_string(list[i].numel) + " elements of " +
             std::string(dtype_name(list[i].dtype)) + ", expected " +
             std::to_string(like.numel) + " of " +
             std::string(dtype_name(like.dtype)) + ". ";
    }
  }
  return err;
}

// Without the check, a bad argument fails on its own rank only (as torch's
// NCCL backend): the others' operation fails at the watchdog's timeout.
void NcclProcessGroup::check(const std::string& what, const Call& c,
                             const std::string& local_error) {
  if (!check_) {
    if (!local_error.empty()) throw CommError(what + ": " + local_error);
    return;
  }
  const int n = size();
  std::vector<int64_t> mine = {
      static_cast<int64_t>(c.kind),  static_cast<int64_t>(c.dtype),
      static_cast<int64_t>(c.numel), c.root,
      static_cast<int64_t>(c.op),    static_cast<int64_t>(c.extra),
      local_error.empty() ? 0 : 1};
  std::vector<int64_t> all(mine.size() * n);
  std::vector<Tensor> out;
  for (int j = 0; j < n; ++j) {
    out.push_back(Tensor::of(all.data() + j * mine.size(), mine.size()));
  }
  check_->all_gather(out, Tensor::of(mine));
  if (!local_error.empty()) throw CommError(what + ": " + local_error);
  std::string bad;
  for (int j = 0; j < n; ++j) {
    const int64_t* w = all.data() + j * mine.size();
    if (w[6] != 0) {
      bad += "rank " + std::to_string(j) + " passed bad arguments. ";
    } else if (!std::equal(w, w + 6, all.data())) {
      bad += "rank " + std::to_string(j) +
             "'s call differs from rank 0's (operation, dtype, count, root "
             "or op). ";
    }
  }
  if (!bad.empty()) {
    throw CommError(what +
                    ": the argument check (DLAUNCH_NCCL_CHECK) found: " + bad);
  }
}

template <class F>
std::unique_ptr<Work> NcclProcessGroup::enqueue(std::string what, F&& body) {
  std::lock_guard lock(s_->mu);
  if (!s_->broken.empty()) {
    throw CommError(what +
                    ": the group is unusable after an earlier failure (" +
                    s_->broken + "); destroy it and create a new one");
  }
  check_cuda(cudaSetDevice(s_->device), what + ": cudaSetDevice");
  s_->flush_p2p_locked();  // earlier point-to-point calls go first
  while (!s_->pending.empty() &&
         s_->pending.front()->status.load() == OpState::kDone) {
    s_->pending.pop_front();
  }
  auto op = std::make_shared<OpState>();
  op->what = std::move(what);
  op->deadline = Clock::now() + s_->timeout;
  op->done_event = s_->take_event_locked();
  try {
    s_->finish_call_locked(body(s_->comm, s_->stream), op->what);
    check_cuda(cudaEventRecord(op->done_event, s_->stream),
               op->what + ": cudaEventRecord");
  } catch (...) {
    s_->free_events.push_back(op->done_event);
    throw;
  }
  s_->pending.push_back(op);
  return std::make_unique<NcclWork>(s_, std::move(op));
}

std::unique_ptr<Work> NcclProcessGroup::iall_reduce(Tensor t, ReduceOp rop) {
  std::string what = name_op("all_reduce");
  check(what, {Op::kAllReduce, t.dtype, t.numel, -1, rop, 0},
        tensor_error(t, s_->device, "t") + reduce_op_error(rop));
  const ncclRedOp_t op = to_nccl(rop, what);
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return ncclAllReduce(t.data, t.data, t.numel, to_nccl(t.dtype), op, c, st);
  });
}

std::unique_ptr<Work> NcclProcessGroup::ibroadcast(Tensor t, int root) {
  std::string what = name_op("broadcast");
  check(what, {Op::kBroadcast, t.dtype, t.numel, root, ReduceOp::kSum, 0},
        tensor_error(t, s_->device, "t") + check_root(root));
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return ncclBroadcast(t.data, t.data, t.numel, to_nccl(t.dtype), root, c,
                         st);
  });
}

// NCCL writes the result only on the root: other ranks' `t` is left as sent.
std::unique_ptr<Work> NcclProcessGroup::ireduce(Tensor t, int root,
                                                ReduceOp rop) {
  std::string what = name_op("reduce");
  check(what, {Op::kReduce, t.dtype, t.numel, root, rop, 0},
        tensor_error(t, s_->device, "t") + check_root(root) +
            reduce_op_error(rop));
  const ncclRedOp_t op = to_nccl(rop, what);
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return ncclReduce(t.data, t.data, t.numel, to_nccl(t.dtype), op, root, c,
                      st);
  });
}

// The native collectives need one contiguous buffer of size() blocks; a list
// that is not contiguous goes through a staging buffer on the stream, so
// that every rank makes the same NCCL call whatever its own list's layout.
namespace {

struct Staging {
  void* ptr = nullptr;
  cudaError_t alloc(size_t bytes, cudaStream_t st) {
    return cudaMallocAsync(&ptr, std::max<size_t>(bytes, 1), st);
  }
  void copy_in(std::span<const Tensor> list, cudaStream_t st) const {
    for (size_t i = 0; i < list.size(); ++i) {
      cudaMemcpyAsync(static_cast<char*>(ptr) + i * list[0].nbytes(),
                      list[i].data, list[i].nbytes(), cudaMemcpyDeviceToDevice,
                      st);
    }
  }
  void copy_out(std::span<const Tensor> list, cudaStream_t st) const {
    for (size_t i = 0; i < list.size(); ++i) {
      cudaMemcpyAsync(list[i].data,
                      static_cast<const char*>(ptr) + i * list[0].nbytes(),
                      list[i].nbytes(), cudaMemcpyDeviceToDevice, st);
    }
  }
  void release(cudaStream_t st) {
    if (ptr) cudaFreeAsync(ptr, st);
  }
};

// Runs `call(base)` on the list's own memory when it is contiguous, else on
// a staging buffer filled from it (`in`) and/or copied back to it (`out`).
template <class Call>
ncclResult_t on_block(std::span<const Tensor> list, bool in, bool out,
                      cudaStream_t st, Call&& call) {
  if (list.empty() || contiguous(list)) {
    return call(list.empty() ? nullptr : list[0].data);
  }
  Staging s;
  if (s.alloc(list.size() * list[0].nbytes(), st) != cudaSuccess) {
    return ncclUnhandledCudaError;
  }
  if (in) s.copy_in(list, st);
  ncclResult_t r = call(s.ptr);
  if (r == ncclSuccess && out) s.copy_out(list, st);
  s.release(st);
  return r;
}

}  // namespace

std::unique_ptr<Work> NcclProcessGroup::iscatter(Tensor out,
                                                 std::span<const Tensor> in,
                                                 int root) {
  std::string what = name_op("scatter");
  std::string err = tensor_error(out, s_->device, "out") + check_root(root);
  const bool is_root = rank() == root;
  if (is_root) err += check_list(in, "in", out);
  check(what, {Op::kScatter, out.dtype, out.numel, root, ReduceOp::kSum, 0},
        err);
  std::vector<Tensor> list(in.begin(), in.end());
  if (!is_root) list.clear();
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return on_block(list, true, false, st, [&](void* base) {
      return ncclScatter(base, out.data, out.numel, to_nccl(out.dtype), root, c,
                         st);
    });
  });
}

std::unique_ptr<Work> NcclProcessGroup::igather(Tensor in,
                                                std::span<const Tensor> out,
                                                int root) {
  std::string what = name_op("gather");
  std::string err = tensor_error(in, s_->device, "in") + check_root(root);
  const bool is_root = rank() == root;
  if (is_root) err += check_list(out, "out", in);
  check(what, {Op::kGather, in.dtype, in.numel, root, ReduceOp::kSum, 0}, err);
  std::vector<Tensor> list(out.begin(), out.end());
  if (!is_root) list.clear();
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return on_block(list, false, true, st, [&](void* base) {
      return ncclGather(in.data, base, in.numel, to_nccl(in.dtype), root, c,
                        st);
    });
  });
}

std::unique_ptr<Work> NcclProcessGroup::iall_gather(std::span<const Tensor> out,
                                                    Tensor in) {
  std::string what = name_op("all_gather");
  check(what, {Op::kAllGather, in.dtype, in.numel, -1, ReduceOp::kSum, 0},
        tensor_error(in, s_->device, "in") + check_list(out, "out", in));
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return on_block(out, false, true, st, [&](void* base) {
      return ncclAllGather(in.data, base, in.numel, to_nccl(in.dtype), c, st);
    });
  });
}

std::unique_ptr<Work> NcclProcessGroup::ireduce_scatter(
    Tensor out, std::span<const Tensor> in, ReduceOp rop) {
  std::string what = name_op("reduce_scatter");
  check(what, {Op::kReduceScatter, out.dtype, out.numel, -1, rop, 0},
        tensor_error(out, s_->device, "out") + check_list(in, "in", out) +
            reduce_op_error(rop));
  const ncclRedOp_t op = to_nccl(rop, what);
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return on_block(in, true, false, st, [&](void* base) {
      return ncclReduceScatter(base, out.data, out.numel, to_nccl(out.dtype),
                               op, c, st);
    });
  });
}

// The list form allows a different count per peer, which no rank can see
// without an agreement: grouped ncclSend/ncclRecv, as torch's all_to_all.
std::unique_ptr<Work> NcclProcessGroup::iall_to_all(
    std::span<const Tensor> out, std::span<const Tensor> in) {
  std::string what = name_op("all_to_all");
  std::string err;
  if (in.size() != static_cast<size_t>(size()) ||
      out.size() != static_cast<size_t>(size())) {
    err = "in and out must hold one tensor per rank (" +
          std::to_string(size()) + "); got " + std::to_string(in.size()) +
          " and " + std::to_string(out.size()) + ". ";
  } else {
    for (int j = 0; j < size(); ++j) {
      err += tensor_error(in[j], s_->device, "in[" + std::to_string(j) + "]");
      err += tensor_error(out[j], s_->device, "out[" + std::to_string(j) + "]");
      if (in[j].dtype != in[0].dtype || out[j].dtype != in[0].dtype) {
        err += "all_to_all tensors must share one dtype. ";
      }
    }
  }
  const DType d = in.empty() ? DType::kF32 : in[0].dtype;
  check(what, {Op::kAllToAll, d, 0, -1, ReduceOp::kSum, 0}, err);
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    ncclResult_t r = ncclGroupStart();
    for (int j = 0; j < size() && r == ncclSuccess; ++j) {
      r = ncclSend(in[j].data, in[j].numel, to_nccl(d), j, c, st);
      if (r == ncclSuccess) {
        r = ncclRecv(out[j].data, out[j].numel, to_nccl(d), j, c, st);
      }
    }
    ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

// An all-reduce of one element of a scratch buffer the group allocates once.
std::unique_ptr<Work> NcclProcessGroup::ibarrier() {
  std::string what = name_op("barrier");
  check(what, {Op::kBarrier, DType::kI32, 0, -1, ReduceOp::kSum, 0}, {});
  return enqueue(std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    void*& buf = s_->barrier_buf;
    if (buf == nullptr && cudaMalloc(&buf, sizeof(int32_t)) != cudaSuccess) {
      return ncclUnhandledCudaError;
    }
    return ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, c, st);
  });
}

std::unique_ptr<Work> NcclProcessGroup::isend(Tensor t, int dst, int tag) {
  return post(true, t, dst, tag);
}

std::unique_ptr<Work> NcclProcessGroup::irecv(Tensor t, int src, int tag) {
  return post(false, t, src, tag);
}

// NCCL has no tags: sends and receives between two ranks match in the order
// they were posted (as torch's NCCL backend), so `tag` is ignored.
std::unique_ptr<Work> NcclProcessGroup::post(bool is_send, Tensor t, int peer,
                                             int /*tag*/) {
  std::string what = name_op(is_send ? "send" : "recv") +
                     (is_send ? " to rank " : " from rank ") +
                     std::to_string(peer);
  std::string err = tensor_error(t, s_->device, "t");
  if (peer < 0 || peer >= size()) {
    err += "peer " + std::to_string(peer) + " is out of range for a group of " +
           std::to_string(size()) + ". ";
  }
  if (!err.empty()) throw CommError(what + ": " + err);
  std::lock_guard lock(s_->mu);
  if (!s_->broken.empty()) {
    throw CommError(what +
                    ": the group is unusable after an earlier failure (" +
                    s_->broken + "); destroy it and create a new one");
  }
  auto op = std::make_shared<OpState>();
  op->what = std::move(what);
  op->deadline = Clock::now() + s_->timeout;
  CommState* s = s_.get();
  s_->p2p_calls.push_back([s, is_send, t, peer] {
    return is_send ? ncclSend(t.data, t.numel, to_nccl(t.dtype), peer, s->comm,
                              s->stream)
                   : ncclRecv(t.data, t.numel, to_nccl(t.dtype), peer, s->comm,
                              s->stream);
  });
  s_->p2p_ops.push_back(op);
  return std::make_unique<NcclWork>(s_, std::move(op));
}

std::unique_ptr<ProcessGroup> NcclProcessGroup::new_group(
    const std::vector<int>& ranks, milliseconds timeout) {
  std::string what = name_op("new_group");
  std::string err;
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size() ||
        (i > 0 && ranks[i] <= ranks[i - 1])) {
      err = "ranks must be sorted, distinct and in 0.." +
            std::to_string(size() - 1) + ". ";
    }
    hash = (hash ^ static_cast<uint64_t>(ranks[i])) * 1099511628211ull;
  }
  if (ranks.empty()) err = "ranks is empty. ";
  if (timeout.count() <= 0) err += "the timeout must be positive. ";
  check(what,
        {Op::kNewGroup, DType::kI32, ranks.size(), -1, ReduceOp::kSum, hash},
        err);
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  const bool member = it != ranks.end();
  const int child = ++children_;
  auto s = std::make_shared<CommState>();
  s->name = name() + "/" + std::to_string(child);
  s->rank = member ? static_cast<int>(it - ranks.begin()) : -1;
  s->size = static_cast<int>(ranks.size());
  s->device = s_->device;
  s->timeout = timeout;
  s->owned = s_->owned;
  ncclConfig_t config = make_config(s->name);
  {
    std::lock_guard lock(s_->mu);
    if (!s_->broken.empty()) {
      throw CommError(what +
                      ": the group is unusable after an earlier "
                      "failure (" +
                      s_->broken + ")");
    }
    s_->flush_p2p_locked();
    // Collective over this group: non-members pass NOCOLOR and get none.
    ncclResult_t r = ncclCommSplit(s_->comm, member ? 0 : NCCL_SPLIT_NOCOLOR,
                                   member ? s->rank : 0, &s->comm, &config);
    // In progress: the new communicator reports when it is ready (below).
    if (r != ncclInProgress)
      s_->finish_call_locked(r, what + " (ncclCommSplit)");
  }
  if (member) {
    try {
      settle(s->comm, what + " (ncclCommSplit)", Clock::now() + timeout);
    } catch (const CommError&) {
      if (s->comm) ncclCommAbort(s->comm);
      s->comm = nullptr;
      throw;
    }
  }
  std::unique_ptr<ProcessGroup> check_child;
  if (check_) check_child = check_->new_group(ranks, timeout);
  if (!member) {
    s->comm = nullptr;
    return nullptr;
  }
  check_cuda(cudaStreamCreate(&s->stream), "cudaStreamCreate on " + s->where());
  return std::make_unique<NcclProcessGroup>(
      std::move(s), std::move(check_child), watchdog_interval_,
      make_check_group_);
}

}  // namespace dlaunch::comm::nccl
