// Every collective between ranks on one host, over shared memory. Data that
// fits the channel travels with the argument check (one meeting, one copy
// in and one copy out per byte); larger data goes through per-rank segments
// (shm_steps): in one step up to the segments' window, beyond it in
// pipelined steps of kShmChunkBytes per piece, so that a chunk a rank
// writes is still in the cache when its peers read it.

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/gloo/gloo_group.h"
#include "comm/reduce.h"

namespace dlaunch::comm::gloo {
namespace {

// Elements [begin, begin + count) of a piece of `numel` handled at step k
// of `per_step` elements.
struct Range {
  size_t begin = 0;
  size_t count = 0;
};
Range range(size_t k, size_t per_step, size_t numel) {
  const size_t b = std::min(numel, k * per_step);
  return {b, std::min(numel, b + per_step) - b};
}

size_t steps_for(size_t numel, size_t per_step) {
  return (numel + per_step - 1) / per_step;
}

char* at(const Tensor& t, size_t element) {
  return static_cast<char*>(t.data) + element * dtype_size(t.dtype);
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

// Outputs of at least this many bytes per rank are written from the
// segments with non-temporal stores: they would leave the cache before
// anyone reads them, and a plain store first reads each line it writes
// (64 MiB written from a cached 1 MiB area in 256 KiB pieces: 14 GB/s
// plain, 20 GB/s non-temporal; 2 cores, load 12).
constexpr size_t kStreamOutBytes = 8 << 20;

// copy_bytes for a step's piece of an output of `total` bytes.
void copy_out_bytes(void* dst, const void* src, size_t bytes, size_t total) {
#if defined(__SSE2__)
  if (total >= kStreamOutBytes && bytes >= 4096) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
    std::memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= bytes; i += 64) {
      const auto* from = reinterpret_cast<const __m128i*>(s + i);
      auto* to = reinterpret_cast<__m128i*>(d + i);
      const __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1),
                    c = _mm_loadu_si128(from + 2),
                    e = _mm_loadu_si128(from + 3);
      _mm_stream_si128(to, a);
      _mm_stream_si128(to + 1, b);
      _mm_stream_si128(to + 2, c);
      _mm_stream_si128(to + 3, e);
    }
    std::memcpy(d + i, s + i, bytes - i);
    _mm_sfence();  // visible before this rank posts its next step
    return;
  }
#endif
  copy_bytes(dst, src, bytes);
}

// out = a op b op c ... over `srcs` in rank order (every rank that reduces
// the same data gets bitwise the same result). `out` may alias srcs[0] or
// srcs[1] only.
void reduce_all(ReduceFn fn, char* out, const std::vector<const char*>& srcs,
                size_t count) {
  fn(out, srcs[0], srcs[1], count);
  for (size_t j = 2; j < srcs.size(); ++j) fn(out, out, srcs[j], count);
}

// Steps over pieces of `numel` elements of `dtype`, `pieces` per area.
// A piece that fits the segments' window (kShmDepth steps of
// kShmChunkBytes) moves in one step: pipelining pays only for data that
// would not stay in the cache, and every step is a meeting of the ranks
// (a 1 MiB all_reduce: 4 steps took 135 us where the path before them took
// 84 us; under load, 410 us against 200 us in one step, best of 3000).
// `one_step` false: pipelined steps at every size (broadcast, below).
ShmSteps steps_over(DType dtype, size_t numel, size_t pieces,
                    bool one_step = true) {
  ShmSteps s;
  const size_t es = dtype_size(dtype);
  const size_t bytes = std::max(numel * es, es);
  const size_t piece = one_step && bytes <= kShmDepth * kShmChunkBytes
                           ? bytes
                           : std::min(bytes, kShmChunkBytes);
  s.per_step = piece / es;
  s.count = steps_for(numel, s.per_step);
  s.piece_bytes = (piece + 63) / 64 * 64;  // pieces stay aligned
  s.area_bytes = pieces * s.piece_bytes;
  return s;
}

// A producer that copies step k's elements of `t` into its area.
auto copy_in(const Tensor& t, size_t per_step) {
  return [&t, per_step](size_t k, char* area) {
    auto [b, c] = range(k, per_step, t.numel);
    copy_bytes(area, at(t, b), c * dtype_size(t.dtype));
  };
}

// A consumer that copies step k of each source's area into out[source].
// Bytes of the outputs of `sources` together (what copy_out_bytes streams).
size_t out_total(std::span<const Tensor> out, const std::vector<int>& sources) {
  size_t total = 0;
  for (int j : sources) total += out[j].nbytes();
  return total;
}

auto copy_out(std::span<const Tensor> out, const std::vector<int>& sources,
              size_t per_step) {
  const size_t total = out_total(out, sources);
  return [out, &sources, per_step, total](
             size_t k, const std::vector<const char*>& area) {
    for (int j : sources) {
      auto [b, c] = range(k, per_step, out[j].numel);
      copy_out_bytes(at(out[j], b), area[j], c * dtype_size(out[j].dtype),
                     total);
    }
  };
}

std::span<const char> in_bytes(const Tensor& t) {
  return {static_cast<const char*>(t.data), t.nbytes()};
}
std::span<char> out_bytes(const Tensor& t) {
  return {static_cast<char*>(t.data), t.nbytes()};
}

// Per-rank byte ranges for shm_cma: srcs[d] and dsts[s], empty by default,
// and this rank's own copy.
struct Moves {
  explicit Moves(int n) : srcs(n), dsts(n) {}
  std::vector<std::span<const char>> srcs;
  std::vector<std::span<char>> dsts;
  LocalCopy local;
};

std::vector<int> all_but(int me, int n) {
  std::vector<int> out;
  for (int j = 0; j < n; ++j) {
    if (j != me) out.push_back(j);
  }
  return out;
}

}  // namespace

// Runs the steps of `s`. Every rank posts once per step on the channel, so
// that post number base + k + 1 says "my area for step k is written and
// I have read everything of the steps before k". A writer reuses an area
// kShmDepth steps later, once every peer has said so about it. Ends with a
// meeting of all ranks, after which nobody reads the segments.
bool GlooProcessGroup::shm_steps(const ShmSteps& s) {
  const size_t need = std::min(s.count, kShmDepth) * s.area_bytes;
  if (shm_cap_ < need && !shm_grow(need)) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  const uint32_t base = channel_->seq();
  std::vector<const char*> area(size());
  try {
    for (size_t k = 0; k < s.count; ++k) {
      const size_t off = (k % kShmDepth) * s.area_bytes;
      const auto step = static_cast<uint32_t>(k);
      if (s.produces) {
        if (k >= kShmDepth) {
          for (int j = 0; j < size(); ++j) {
            channel_->wait_for(j, base + step - kShmDepth + 2, deadline);
          }
        }
        s.produce(k, shm_mine_.data() + off);
      }
      channel_->post({}, {});
      area[rank()] = shm_mine_.data() + off;
      for (int j : s.sources) {
        channel_->wait_for(j, base + step + 1, deadline);
        area[j] = shm_peers_[j].data() + off;
      }
      s.consume(k, area);
    }
  } catch (const ShmChannel::WaitError& e) {
    channel_failed(e);
  }
  local_barrier();
  took("shm-chunks");
  return true;
}

bool GlooProcessGroup::shm_broadcast(Tensor t, int root) {
  const int r = rank();
  if (with_check(t.nbytes())) {
    if (r != root) copy_bytes(t.data, payload_of(root), t.nbytes());
    took("shm-check");
    return true;
  }
  if (!shm_ready()) return false;
  Moves m(size());
  if (r == root) {
    for (int d : all_but(root, size())) m.srcs[d] = in_bytes(t);
  } else {
    m.dsts[root] = out_bytes(t);
  }
  if (shm_cma(m.srcs, m.dsts)) return true;
  // Pipelined at every size when each rank can have a CPU: the readers
  // copy a chunk out while the root copies the next in. 1 MiB on 2 ranks
  // on cores of their own: 46 us in 256 KiB steps, 96 us in one (52 and
  // 57 us when they share a core); 4 ranks on 2 cores: 140 us in one step,
  // 160 us in steps. The ranks' CPUs are the channel's count, which every
  // rank reads alike: ranks taking different step counts would mix calls.
  const size_t es = dtype_size(t.dtype);
  ShmSteps s =
      steps_over(t.dtype, t.numel, 1, /*one_step=*/channel_->cpus() < size());
  const size_t q = s.per_step;
  s.produces = r == root;
  if (r != root) s.sources = {root};
  s.produce = copy_in(t, q);
  s.consume = [&](size_t k, const std::vector<const char*>& area) {
    if (r == root) return;
    auto [b, c] = range(k, q, t.numel);
    copy_out_bytes(at(t, b), area[root], c * es, t.nbytes());
  };
  return shm_steps(s);
}

// Non-roots' data reaches the root, which reduces into `t` starting from
// its own values (only the root computes, so no order needs agreeing on).
bool GlooProcessGroup::shm_reduce(Tensor t, int root, ReduceOp rop) {
  const int r = rank();
  ReduceFn fn = reduce_fn(t.dtype, rop);
  if (with_check(t.nbytes())) {
    if (r == root) {
      for (int j = 0; j < size(); ++j) {
        if (j != root) fn(t.data, t.data, payload_of(j), t.numel);
      }
    }
    took("shm-check");
    return true;
  }
  if (!shm_ready()) return false;
  // Pipelined at every size when each rank can have a CPU, as broadcast:
  // the root reduces a chunk while the others copy the next in.
  ShmSteps s =
      steps_over(t.dtype, t.numel, 1, /*one_step=*/channel_->cpus() < size());
  const size_t q = s.per_step;
  s.produces = r != root;
  if (r == root) s.sources = all_but(root, size());
  s.produce = copy_in(t, q);
  s.consume = [&](size_t k, const std::vector<const char*>& area) {
    if (r != root) return;
    auto [b, c] = range(k, q, t.numel);
    for (int j : s.sources) fn(at(t, b), at(t, b), area[j], c);
  };
  return shm_steps(s);
}

// Every rank reduces every chunk itself, reading all areas in rank order:
// one step per chunk, bitwise the same result everywhere. (The fused small
// case is all_reduce's own, shared with TCP.)
bool GlooProcessGroup::shm_all_reduce(Tensor t, ReduceOp rop) {
  if (!shm_ready()) return false;
  ReduceFn fn = reduce_fn(t.dtype, rop);
  ShmSteps s = steps_over(t.dtype, t.numel, 1);
  const size_t q = s.per_step;
  s.produces = true;
  s.sources = all_but(rank(), size());
  s.produce = copy_in(t, q);
  s.consume = [&](size_t k, const std::vector<const char*>& area) {
    auto [b, c] = range(k, q, t.numel);
    reduce_all(fn, at(t, b), area, c);
  };
  return shm_steps(s);
}

// The root copies its own piece here too (in single copy while its peers
// copy theirs); the caller copies it when this returns false.
bool GlooProcessGroup::shm_scatter(Tensor out, std::span<const Tensor> in,
                                   int root) {
  const int r = rank();
  const int n = size();
  // The root posted every piece but its own, in rank order.
  if (with_check((n - 1) * out.nbytes())) {
    if (r != root) {
      const int at_piece = r < root ? r : r - 1;
      copy_bytes(out.data, payload_of(root) + at_piece * out.nbytes(),
                 out.nbytes());
    } else {
      copy(out, in[root]);
    }
    took("shm-check");
    return true;
  }
  if (!shm_ready()) return false;
  Moves m(n);
  if (r == root) {
    for (int d : all_but(root, n)) m.srcs[d] = in_bytes(in[d]);
    m.local = {out_bytes(out), in_bytes(in[root])};
  } else {
    m.dsts[root] = out_bytes(out);
  }
  if (shm_cma(m.srcs, m.dsts, m.local)) return true;
  if (r == root) copy(out, in[root]);
  const size_t es = dtype_size(out.dtype);
  ShmSteps s = steps_over(out.dtype, out.numel, n);
  const size_t q = s.per_step;
  s.produces = r == root;
  if (r != root) s.sources = {root};
  s.produce = [&](size_t k, char* area) {
    auto [b, c] = range(k, q, out.numel);
    for (int j : all_but(root, n)) {
      copy_bytes(area + j * s.piece_bytes, at(in[j], b), c * es);
    }
  };
  s.consume = [&](size_t k, const std::vector<const char*>& area) {
    if (r == root) return;
    auto [b, c] = range(k, q, out.numel);
    copy_out_bytes(at(out, b), area[root] + r * s.piece_bytes, c * es,
                   out.nbytes());
  };
  return shm_steps(s);
}

// With root < 0 every rank gathers (all_gather). Gatherers copy their own
// piece here too (in single copy while their peers copy); the caller
// copies it when this returns false.
bool GlooProcessGroup::shm_gather(Tensor in, std::span<const Tensor> out,
                                  int root) {
  const int r = rank();
  const bool gathers = root < 0 || r == root;
  if (with_check(in.nbytes())) {
    if (gathers) {
      copy(out[r], in);
      for (int j = 0; j < size(); ++j) {
        if (j != r) copy_bytes(out[j].data, payload_of(j), in.nbytes());
      }
    }
    took("shm-check");
    return true;
  }
  if (!shm_ready()) return false;
  Moves m(size());
  for (int j : all_but(r, size())) {
    if (root < 0 || j == root) m.srcs[j] = in_bytes(in);
    if (gathers) m.dsts[j] = out_bytes(out[j]);
  }
  if (gathers) m.local = {out_bytes(out[r]), in_bytes(in)};
  if (shm_cma(m.srcs, m.dsts, m.local)) return true;
  if (gathers) copy(out[r], in);
  ShmSteps s = steps_over(in.dtype, in.numel, 1);
  s.produces = r != root;
  if (gathers) s.sources = all_but(r, size());
  s.produce = copy_in(in, s.per_step);
  s.consume = copy_out(out, s.sources, s.per_step);
  return shm_steps(s);
}

// Rank r reduces piece r of every rank's input, in rank order (its own
// piece goes through its area too, so `out` may alias in[r]).
bool GlooProcessGroup::shm_reduce_scatter(Tensor out,
                                          std::span<const Tensor> in,
                                          ReduceOp rop) {
  const int r = rank();
  const int n = size();
  ReduceFn fn = reduce_fn(out.dtype, rop);
  const size_t bytes = out.nbytes();
  if (with_check(n * bytes)) {
    // reduce_all's order without its vector (a call allocates nothing).
    auto piece = [&](int j) { return payload_of(j) + r * bytes; };
    fn(out.data, piece(0), piece(1), out.numel);
    for (int j = 2; j < n; ++j) fn(out.data, out.data, piece(j), out.numel);
    took("shm-check");
    return true;
  }
  if (!shm_ready()) return false;
  const size_t es = dtype_size(out.dtype);
  ShmSteps s = steps_over(out.dtype, out.numel, n);
  const size_t q = s.per_step;
  s.produces = true;
  s.sources = all_but(r, n);
  s.produce = [&](size_t k, char* area) {
    auto [b, c] = range(k, q, out.numel);
    for (int j = 0; j < n; ++j) {
      copy_bytes(area + j * s.piece_bytes, at(in[j], b), c * es);
    }
  };
  s.consume = [&](size_t k, const std::vector<const char*>& area) {
    auto [b, c] = range(k, q, out.numel);
    std::vector<const char*> srcs(n);
    for (int j = 0; j < n; ++j) srcs[j] = area[j] + r * s.piece_bytes;
    reduce_all(fn, at(out, b), srcs, c);
  };
  return shm_steps(s);
}

// Block sizes differ per pair; every rank knows them all from the agreed
// arguments (agreed_count), which place rank j's block for this rank in
// j's post and bound the number of steps.
bool GlooProcessGroup::shm_all_to_all(std::span<const Tensor> out,
                                      std::span<const Tensor> in) {
  const int r = rank();
  const int n = size();
  const size_t es = dtype_size(in[0].dtype);
  uint64_t most_sent = 0;  // bytes to its peers, by any one rank
  uint64_t largest = 0;    // elements, of any one block
  for (int j = 0; j < n; ++j) {
    uint64_t sent = 0;
    for (int d = 0; d < n; ++d) {
      if (d != j) sent += agreed_count(j, d);
      largest = std::max(largest, agreed_count(j, d));
    }
    most_sent = std::max(most_sent, sent * es);
  }
  // Each rank posted its blocks for its peers (not its own), in rank order.
  if (with_check(most_sent)) {
    copy(out[r], in[r]);
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      uint64_t before = 0;
      for (int d = 0; d < r; ++d) {
        if (d != j) before += agreed_count(j, d);
      }
      copy_bytes(out[j].data, payload_of(j) + before * es, out[j].nbytes());
    }
    took("shm-check");
    return true;
  }
  if (!shm_ready()) return false;
  Moves m(n);
  for (int j : all_but(r, n)) {
    m.srcs[j] = in_bytes(in[j]);
    m.dsts[j] = out_bytes(out[j]);
  }
  m.local = {out_bytes(out[r]), in_bytes(in[r])};
  if (shm_cma(m.srcs, m.dsts, m.local)) return true;
  copy(out[r], in[r]);
  ShmSteps s = steps_over(in[0].dtype, largest, n);
  const size_t q = s.per_step;
  s.produces = true;
  s.sources = all_but(r, n);
  s.produce = [&](size_t k, char* area) {
    for (int d : all_but(r, n)) {
      auto [b, c] = range(k, q, in[d].numel);
      copy_bytes(area + d * s.piece_bytes, at(in[d], b), c * es);
    }
  };
  const size_t total = out_total(out, s.sources);
  s.consume = [&](size_t k, const std::vector<const char*>& area) {
    for (int j : s.sources) {
      auto [b, c] = range(k, q, out[j].numel);
      copy_out_bytes(at(out[j], b), area[j] + r * s.piece_bytes, c * es, total);
    }
  };
  return shm_steps(s);
}

}  // namespace dlaunch::comm::gloo
