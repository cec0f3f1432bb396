// The collectives and their TCP paths: Gloo's algorithms, or ours over
// unbound buffers. all_reduce also picks the fused or shared-memory path.

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm/gloo/gloo_group.h"
#include "comm/reduce.h"

namespace dlaunch::comm::gloo {

void GlooProcessGroup::broadcast(Tensor t, int root) {
  const char* op = "broadcast";
  Call c = make_call(Op::kBroadcast, t.dtype, t.numel, root, ReduceOp::kSum);
  c.local_error = check_tensor(t, "t") + check_root(root);
  agree(op, c, {&t, rank() == root ? 1u : 0u});
  if (size() == 1 || t.numel == 0) return took("local");
  bool done = false;
  run(op, [&] { done = shm_broadcast(t, root); });
  if (done) return;
  took("tcp");
  run(op, [&] {
    ::gloo::BroadcastOptions opts(g_->ctx);
    by_element_size(t.dtype, [&](auto x) {
      using T = decltype(x);
      opts.setOutput(static_cast<T*>(t.data), t.numel);
      if (rank() == root) opts.setInput(static_cast<T*>(t.data), t.numel);
    });
    opts.setRoot(root);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    ::gloo::broadcast(opts);
  });
}

void GlooProcessGroup::reduce(Tensor t, int root, ReduceOp rop) {
  const char* op = "reduce";
  Call c = make_call(Op::kReduce, t.dtype, t.numel, root, rop);
  c.local_error =
      check_tensor(t, "t") + check_root(root) + reduce_op_error(t.dtype, rop);
  agree(op, c, {&t, rank() == root ? 0u : 1u});
  if (size() == 1 || t.numel == 0) return took("local");
  bool done = false;
  run(op, [&] { done = shm_reduce(t, root, rop); });
  if (done) {
    if (rop == ReduceOp::kAvg && rank() == root) divide_in_place(t, size());
    return;
  }
  took("tcp");
  // Gloo's ring reduce uses the output as scratch on every rank; non-roots
  // reduce into a copy so that their `t` is left as sent.
  void* out = t.data;
  if (rank() != root) {
    out = work_buffer(0, t.nbytes());
  }
  run(op, [&] {
    ::gloo::ReduceOptions opts(g_->ctx);
    by_element_size(t.dtype, [&](auto x) {
      using T = decltype(x);
      opts.setInput(static_cast<T*>(t.data), t.numel);
      opts.setOutput(static_cast<T*>(out), t.numel);
    });
    opts.setRoot(root);
    opts.setReduceFunction(reduce_fn(t.dtype, rop));
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    ::gloo::reduce(opts);
  });
  if (rop == ReduceOp::kAvg && rank() == root) divide_in_place(t, size());
}

void GlooProcessGroup::all_reduce(Tensor t, ReduceOp rop) {
  const char* op = "all_reduce";
  Call c = make_call(Op::kAllReduce, t.dtype, t.numel, -1, rop);
  c.local_error = check_tensor(t, "t") + reduce_op_error(t.dtype, rop);
  agree(op, c, {&t, 1});
  if (size() == 1 || t.numel == 0) return took("local");
  // agree()'s own test: whether the data came with the arguments.
  const bool fused = t.nbytes() <= fused_capacity();
  if (!fused) {
    bool done = false;
    run(op, [&] { done = shm_all_reduce(t, rop); });
    if (done) {
      if (rop == ReduceOp::kAvg) divide_in_place(t, size());
      return;
    }
  }
  // Across hosts, several ranks per host: combine within each host first.
  if (!fused && hier_all_reduce(t, rop)) return;
  took(fused && channel_ ? "shm-check" : "tcp");
  if (fused) {
    // Every rank's data came with its arguments: reduce locally, in rank
    // order, so that every rank computes bitwise the same result.
    ReduceFn fn = reduce_fn(t.dtype, rop);
    if (!channel_) {  // the channel already holds this rank's copy
      std::memcpy(tcp_payload_of(rank()), t.data, t.nbytes());
    }
    fn(t.data, payload_of(0), payload_of(1), t.numel);
    for (int j = 2; j < size(); ++j) {
      fn(t.data, t.data, payload_of(j), t.numel);
    }
    if (rop == ReduceOp::kAvg) divide_in_place(t, size());
    return;
  }
  run(op, [&] {
    ::gloo::AllreduceOptions opts(g_->ctx);
    by_element_size(t.dtype, [&](auto x) {
      using T = decltype(x);
      opts.setOutput(static_cast<T*>(t.data), t.numel);
    });
    opts.setReduceFunction(reduce_fn(t.dtype, rop));
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    ::gloo::allreduce(opts);
  });
  if (rop == ReduceOp::kAvg) divide_in_place(t, size());
}

void GlooProcessGroup::scatter(Tensor out, std::span<const Tensor> in,
                               int root) {
  const char* op = "scatter";
  Call c = make_call(Op::kScatter, out.dtype, out.numel, root, ReduceOp::kSum);
  c.local_error = check_tensor(out, "out") + check_root(root);
  if (rank() == root) c.local_error += check_list(in, "in", out);
  // The root's own piece stays behind: it copies it itself.
  agree(op, c, rank() == root ? in : std::span<const Tensor>(), root);
  if (size() == 1 || out.numel == 0) {
    if (rank() == root) copy(out, in[root]);
    return took("local");
  }
  bool done = false;
  // On one host the root's own piece is copied there (while peers copy).
  run(op, [&] { done = shm_scatter(out, in, root); });
  if (done) return;
  if (rank() == root) copy(out, in[root]);
  took("tcp");
  exchange(op, kGatherSlot, [&](auto& post_send, auto& post_recv) {
    if (rank() == root) {
      for (int j = 0; j < size(); ++j) {
        if (j != root) post_send(j, in[j]);
      }
    } else {
      post_recv(root, out);
    }
  });
}

void GlooProcessGroup::gather(Tensor in, std::span<const Tensor> out,
                              int root) {
  const char* op = "gather";
  Call c = make_call(Op::kGather, in.dtype, in.numel, root, ReduceOp::kSum);
  c.local_error = check_tensor(in, "in") + check_root(root);
  if (rank() == root) c.local_error += check_list(out, "out", in);
  agree(op, c, {&in, rank() == root ? 0u : 1u});
  if (size() == 1 || in.numel == 0) {
    if (rank() == root) copy(out[root], in);
    return took("local");
  }
  bool done = false;
  run(op, [&] { done = shm_gather(in, out, root); });  // copies the own piece
  if (done) return;
  if (rank() == root) copy(out[root], in);
  took("tcp");
  exchange(op, kGatherSlot, [&](auto& post_send, auto& post_recv) {
    if (rank() == root) {
      for (int j = 0; j < size(); ++j) {
        if (j != root) post_recv(j, out[j]);
      }
    } else {
      post_send(root, in);
    }
  });
}

void GlooProcessGroup::all_gather(std::span<const Tensor> out, Tensor in) {
  const char* op = "all_gather";
  Call c = make_call(Op::kAllGather, in.dtype, in.numel, -1, ReduceOp::kSum);
  c.local_error = check_tensor(in, "in") + check_list(out, "out", in);
  agree(op, c, {&in, 1});
  if (size() == 1 || in.numel == 0) {
    copy(out[rank()], in);
    return took("local");
  }
  bool done = false;
  run(op, [&] { done = shm_gather(in, out, -1); });  // copies the own piece
  if (done) return;
  copy(out[rank()], in);
  took("tcp");
  exchange(op, kExchangeSlot, [&](auto& post_send, auto& post_recv) {
    for (int s = 1; s < size(); ++s) {
      int to = (rank() + s) % size();
      int from = (rank() - s + size()) % size();
      post_recv(from, out[from]);
      post_send(to, in);
    }
  });
}

void GlooProcessGroup::reduce_scatter(Tensor out, std::span<const Tensor> in,
                                      ReduceOp rop) {
  const char* op = "reduce_scatter";
  Call c = make_call(Op::kReduceScatter, out.dtype, out.numel, -1, rop);
  c.local_error = check_tensor(out, "out") + check_list(in, "in", out) +
                  reduce_op_error(out.dtype, rop);
  agree(op, c, in);
  if (size() == 1) {
    copy(out, in[0]);
    return took("local");
  }
  if (out.numel == 0) return took("local");
  bool done = false;
  run(op, [&] { done = shm_reduce_scatter(out, in, rop); });
  if (!done) {
    took("tcp");
    run(op, [&] { ring_reduce_scatter(out, in, rop); });
  }
  if (rop == ReduceOp::kAvg) divide_in_place(out, size());
}

namespace {

// Whether any of `out` overlaps any of `in` but the same block exactly
// (out[j] == in[j]: a copy onto itself is skipped).
bool overlaps_any(std::span<const Tensor> out, std::span<const Tensor> in) {
  if (out.data() == in.data()) return false;  // one list: each its own block
  for (size_t i = 0; i < out.size(); ++i) {
    const char* o = static_cast<const char*>(out[i].data);
    for (size_t j = 0; j < in.size(); ++j) {
      const char* x = static_cast<const char*>(in[j].data);
      const size_t on = out[i].nbytes(), xn = in[j].nbytes();
      if (on == 0 || xn == 0 || o >= x + xn || x >= o + on) continue;
      if (i == j && o == x && on == xn) continue;
      return true;
    }
  }
  return false;
}

}  // namespace

void GlooProcessGroup::all_to_all(std::span<const Tensor> out,
                                  std::span<const Tensor> in) {
  const char* op = "all_to_all";
  Call c = make_call(Op::kAllToAll, DType::kF32, 0, -1, ReduceOp::kSum);
  DType dtype = in.empty() ? DType::kF32 : in[0].dtype;
  c.dtype = dtype;
  if (in.size() != static_cast<size_t>(size()) ||
      out.size() != static_cast<size_t>(size())) {
    c.local_error =
        "all_to_all takes one `in` and one `out` tensor per "
        "rank; got " +
        std::to_string(in.size()) + " and " + std::to_string(out.size()) +
        " for a group of " + std::to_string(size());
  } else {
    for (int j = 0; j < size(); ++j) {
      c.local_error += check_tensor(in[j], "in", j);
      c.local_error += check_tensor(out[j], "out", j);
      if (in[j].dtype != dtype || out[j].dtype != dtype) {
        c.local_error +=
            "all_to_all tensors must share one dtype; in[0] "
            "is " +
            std::string(dtype_name(dtype)) + ". ";
      }
    }
    c.sends = in;
    c.recvs = out;
    if (c.local_error.empty() && in[rank()].numel != out[rank()].numel) {
      c.local_error = "in[" + std::to_string(rank()) + "] has " +
                      std::to_string(in[rank()].numel) + " elements but out[" +
                      std::to_string(rank()) + "] has " +
                      std::to_string(out[rank()].numel) +
                      "; this rank's own block must fit";
    }
  }
  // In place (outputs overlapping inputs: torch's all_to_all(list, list),
  // or views of one buffer split unevenly): every path reads a copy of
  // the inputs, as a block written (the own one too) may be one still to
  // be sent.
  std::vector<char> staged;
  std::vector<Tensor> staged_in;
  if (c.local_error.empty() && overlaps_any(out, in)) {
    size_t bytes = 0;
    for (const Tensor& t : in) bytes += t.nbytes();
    staged.resize(bytes);
    size_t off = 0;
    for (const Tensor& t : in) {
      Tensor v = t;
      v.data = staged.data() + off;
      if (t.nbytes() > 0) std::memcpy(v.data, t.data, t.nbytes());
      off += t.nbytes();
      staged_in.push_back(v);
    }
    in = staged_in;
    c.sends = in;
  }
  agree(op, c, in, rank());  // this rank's own block: copied here
  if (size() == 1) {
    copy(out[rank()], in[rank()]);
    return took("local");
  }
  bool done = false;
  run(op, [&] { done = shm_all_to_all(out, in); });  // copies the own block
  if (done) return;
  copy(out[rank()], in[rank()]);
  took("tcp");
  exchange(op, kExchangeSlot, [&](auto& post_send, auto& post_recv) {
    for (int s = 1; s < size(); ++s) {
      int to = (rank() + s) % size();
      int from = (rank() - s + size()) % size();
      if (out[from].numel > 0) post_recv(from, out[from]);
      if (in[to].numel > 0) post_send(to, in[to]);
    }
  });
}

void GlooProcessGroup::copy(const Tensor& dst, const Tensor& src) {
  if (dst.data != src.data && src.nbytes() > 0) {
    std::memcpy(dst.data, src.data, src.nbytes());
  }
}

// Scratch memory kept across calls (a fresh 64 MiB allocation per call
// costs page faults on every call).
char* GlooProcessGroup::work_buffer(int which, size_t bytes) {
  if (work_[which].size() < bytes) work_[which].resize(bytes);
  return work_[which].data();
}

// Posts point-to-point transfers chosen by `plan` on one fresh tag and
// waits for all of them (gather, scatter, all_gather, all_to_all).
template <class Plan>
void GlooProcessGroup::exchange(const char* op, uint64_t prefix, Plan&& plan) {
  run(op, [&] {
    const uint32_t tag = next_tag();
    std::vector<std::pair<int, Tensor>> to_send, to_recv;
    auto post_send = [&](int to, const Tensor& t) {
      to_send.emplace_back(to, t);
    };
    auto post_recv = [&](int from, const Tensor& t) {
      to_recv.emplace_back(from, t);
    };
    plan(post_send, post_recv);
    // An output that overlaps an input (an in-place all_to_all) would be
    // overwritten by a receive before its send went out: the inputs then
    // go from a copy.
    auto overlap = [](const Tensor& a, const Tensor& b) {
      const char* x = static_cast<const char*>(a.data);
      const char* y = static_cast<const char*>(b.data);
      return a.nbytes() > 0 && b.nbytes() > 0 && x < y + b.nbytes() &&
             y < x + a.nbytes();
    };
    std::vector<char> staged;
    bool in_place = false;
    size_t bytes = 0;
    for (const auto& [to, t] : to_send) {
      bytes += t.nbytes();
      for (const auto& [from, r] : to_recv) in_place |= overlap(t, r);
    }
    if (in_place) {
      staged.resize(bytes);
      size_t off = 0;
      for (auto& [to, t] : to_send) {
        std::memcpy(staged.data() + off, t.data, t.nbytes());
        t.data = staged.data() + off;
        off += t.nbytes();
      }
    }
    std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> sends;
    std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> recvs;
    for (const auto& [from, t] : to_recv) {
      recvs.push_back(g_->ctx->createUnboundBuffer(t.data, t.nbytes()));
      recvs.back()->recv(from, coll_slot(prefix, tag));
    }
    for (const auto& [to, t] : to_send) {
      sends.push_back(g_->ctx->createUnboundBuffer(t.data, t.nbytes()));
      sends.back()->send(to, coll_slot(prefix, tag));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto& b : recvs) b->waitRecv(left_until(deadline));
    for (auto& b : sends) b->waitSend(left_until(deadline));
  });
}

// Ring reduce-scatter: at step s rank r forwards its partial sum of chunk
// (r - s - 1) to r + 1 and receives chunk (r - s - 2) from r - 1, adding
// its own contribution; after size() - 1 steps it holds chunk r reduced
// over all ranks. Each rank sends (n - 1) / n of the data once.
void GlooProcessGroup::ring_reduce_scatter(Tensor out,
                                           std::span<const Tensor> in,
                                           ReduceOp rop) {
  const int n = size();
  const int r = rank();
  const size_t bytes = out.nbytes();
  const uint32_t tag = next_tag();
  ReduceFn fn = reduce_fn(out.dtype, rop);
  char* send_buf = work_buffer(0, bytes);
  char* recv_buf = work_buffer(1, bytes);
  auto sbuf = g_->ctx->createUnboundBuffer(send_buf, bytes);
  auto rbuf = g_->ctx->createUnboundBuffer(recv_buf, bytes);
  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  std::memcpy(send_buf, in[(r - 1 + n) % n].data, bytes);
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  for (int s = 0; s < n - 1; ++s) {
    const int chunk = (r - s - 2 + 2 * n) % n;
    rbuf->recv(left, coll_slot(kReduceScatterSlot, tag, s));
    sbuf->send(right, coll_slot(kReduceScatterSlot, tag, s));
    rbuf->waitRecv(left_until(deadline));
    sbuf->waitSend(left_until(deadline));
    void* dst = (s == n - 2) ? out.data : send_buf;
    fn(dst, in[chunk].data, recv_buf, out.numel);
  }
}

}  // namespace dlaunch::comm::gloo
