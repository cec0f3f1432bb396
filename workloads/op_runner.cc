#include "workloads/op_runner.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "comm/reduce.h"

namespace dlaunch::workloads {
namespace {

using comm::DType;
using comm::get_element;
using comm::ReduceOp;
using comm::set_element;
using comm::Tensor;

// Written sentinel for outputs: not a pattern value (those are 1..11).
constexpr double kSentinel = 99;

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 ||
         t == DType::kBF16;
}

}  // namespace

double quantize(DType dtype, double v) {
  uint64_t slot = 0;
  Tensor t{&slot, 1, dtype, {}};
  set_element(t, 0, v);
  return get_element(t, 0);
}

OpRunner::OpRunner(comm::ProcessGroup& pg, BenchOp op, size_t count,
                   DType dtype, ReduceOp redop, int root)
    : pg_(pg),
      op_(op),
      dtype_(dtype),
      redop_(redop),
      root_(root),
      rank_(pg.rank()),
      size_(pg.size()) {
  size_t n = static_cast<size_t>(size_);
  count_ = op_splits(op) ? count / n * n : count;
  chunk_ = count_ / n;
  size_t es = comm::dtype_size(dtype);
  auto words = [&](size_t elems) { return (elems * es + 7) / 8; };
  switch (op) {
    case BenchOp::kAllReduce:
    case BenchOp::kBroadcast:
    case BenchOp::kReduce:
      in_.resize(words(count_));
      out_of_place_ = false;
      break;
    case BenchOp::kAllGather:
    case BenchOp::kGather:
      in_.resize(words(chunk_));
      out_.resize(words(count_));
      out_of_place_ = true;
      break;
    case BenchOp::kReduceScatter:
    case BenchOp::kScatter:
      in_.resize(words(count_));
      out_.resize(words(chunk_));
      out_of_place_ = true;
      break;
    case BenchOp::kAllToAll:
    case BenchOp::kSendRecv:
    case BenchOp::kPingPong:
      in_.resize(words(count_));
      out_.resize(words(count_));
      out_of_place_ = true;
      break;
  }
  auto bytes_of = [](std::vector<uint64_t>& v) {
    return Tensor::of(reinterpret_cast<uint8_t*>(v.data()), v.size() * 8);
  };
  op_in_.emplace(pg, bytes_of(in_));
  if (out_of_place_) op_out_.emplace(pg, bytes_of(out_));
  const bool gathers = op == BenchOp::kAllGather || op == BenchOp::kGather;
  if (op_splits(op) && !gathers) in_chunks_ = chunks(op_in_);
  if (gathers || op == BenchOp::kAllToAll) out_chunks_ = chunks(op_out_);
}

double OpRunner::value(int r, size_t i) const {
  if (redop_ == ReduceOp::kProduct && op_reduces(op_)) {
    return (static_cast<size_t>(r) + i) % 4 == 0 ? 2 : 1;
  }
  return static_cast<double>((static_cast<size_t>(r) * 7 + i) % 11 + 1);
}

double OpRunner::reduced(size_t i) const {
  // Floats in double; integers in int64, then wrapped to the dtype (as the
  // backend wraps).
  auto over_ranks = [&]<class T>(T acc) {
    for (int r = 1; r < size_; ++r) {
      acc = comm::reference_fold(redop_, acc, static_cast<T>(value(r, i)));
    }
    return redop_ == ReduceOp::kAvg ? static_cast<T>(acc / size_) : acc;
  };
  if (is_float(dtype_)) return over_ranks(value(0, i));
  return static_cast<double>(over_ranks(static_cast<int64_t>(value(0, i))));
}

Tensor OpRunner::view(std::vector<uint64_t>& buf, size_t offset,
                      size_t n) const {
  char* base = reinterpret_cast<char*>(buf.data());
  return Tensor{base + offset * comm::dtype_size(dtype_), n, dtype_, {}};
}

Tensor OpRunner::op_view(const std::optional<OpBuffer>& buf, size_t offset,
                         size_t n) const {
  const size_t es = comm::dtype_size(dtype_);
  Tensor t = buf->slice(offset * es, n * es);
  t.numel = n;
  t.dtype = dtype_;
  return t;
}

std::vector<Tensor> OpRunner::chunks(const std::optional<OpBuffer>& buf) const {
  std::vector<Tensor> out;
  for (int j = 0; j < size_; ++j) {
    out.push_back(op_view(buf, j * chunk_, chunk_));
  }
  return out;
}

void OpRunner::fetch() const {
  auto& self = const_cast<OpRunner&>(*this);
  (out_of_place_ ? self.op_out_ : self.op_in_)->download();
}

Tensor OpRunner::result() const {
  auto& self = const_cast<OpRunner&>(*this);
  if (!out_of_place_) return self.view(self.in_, 0, count_);
  size_t n = (op_ == BenchOp::kReduceScatter || op_ == BenchOp::kScatter)
                 ? chunk_
                 : count_;
  return self.view(self.out_, 0, n);
}

void OpRunner::fill() {
  size_t in_n =
      (op_ == BenchOp::kAllGather || op_ == BenchOp::kGather) ? chunk_ : count_;
  Tensor in = view(in_, 0, in_n);
  for (size_t i = 0; i < in_n; ++i) {
    double v = value(rank_, i);
    if (op_ == BenchOp::kBroadcast && rank_ != root_) v = kSentinel;
    set_element(in, i, v);
  }
  if (out_of_place_) {
    Tensor out = result();
    for (size_t i = 0; i < out.numel; ++i) set_element(out, i, kSentinel);
    op_out_->upload();
  }
  op_in_->upload();
}

void OpRunner::run() {
  int n = size_;
  switch (op_) {
    case BenchOp::kAllReduce:
      pg_.all_reduce(op_view(op_in_, 0, count_), redop_);
      break;
    case BenchOp::kBroadcast:
      pg_.broadcast(op_view(op_in_, 0, count_), root_);
      break;
    case BenchOp::kReduce:
      pg_.reduce(op_view(op_in_, 0, count_), root_, redop_);
      break;
    case BenchOp::kAllGather: {
      pg_.all_gather(out_chunks_, op_view(op_in_, 0, chunk_));
      break;
    }
    case BenchOp::kGather: {
      pg_.gather(op_view(op_in_, 0, chunk_), out_chunks_, root_);
      break;
    }
    case BenchOp::kReduceScatter: {
      pg_.reduce_scatter(op_view(op_out_, 0, chunk_), in_chunks_, redop_);
      break;
    }
    case BenchOp::kScatter: {
      pg_.scatter(op_view(op_out_, 0, chunk_), in_chunks_, root_);
      break;
    }
    case BenchOp::kAllToAll: {
      pg_.all_to_all(out_chunks_, in_chunks_);
      break;
    }
    case BenchOp::kSendRecv: {
      // Each rank sends to the next and receives from the previous, as
      // nccl-tests' sendrecv_perf.
      int next = (rank_ + 1) % n, prev = (rank_ - 1 + n) % n;
      auto send = pg_.isend(op_view(op_in_, 0, count_), next);
      auto recv = pg_.irecv(op_view(op_out_, 0, count_), prev);
      recv->wait(pg_.timeout());
      send->wait(pg_.timeout());
      break;
    }
    case BenchOp::kPingPong: {
      // Rank 0 sends, rank 1 sends what it got back (OSU's osu_latency).
      if (rank_ == 0) {
        pg_.send(op_view(op_in_, 0, count_), 1);
        pg_.recv(op_view(op_out_, 0, count_), 1);
      } else if (rank_ == 1) {
        pg_.recv(op_view(op_out_, 0, count_), 0);
        pg_.send(op_view(op_out_, 0, count_), 0);
      }
      break;
    }
  }
}

bool OpRunner::expected(size_t i, double* v) const {
  int n = size_;
  size_t j = chunk_ ? i / chunk_ : 0, k = chunk_ ? i % chunk_ : 0;
  switch (op_) {
    case BenchOp::kAllReduce:
      *v = reduced(i);
      return true;
    case BenchOp::kReduce:
      *v = reduced(i);
      return rank_ == root_;
    case BenchOp::kBroadcast:
      *v = value(root_, i);
      return true;
    case BenchOp::kAllGather:
      *v = value(static_cast<int>(j), k);
      return true;
    case BenchOp::kGather:
      *v = value(static_cast<int>(j), k);
      return rank_ == root_;
    case BenchOp::kReduceScatter:
      *v = reduced(rank_ * chunk_ + i);
      return true;
    case BenchOp::kScatter:
      *v = value(root_, rank_ * chunk_ + i);
      return true;
    case BenchOp::kAllToAll:
      *v = value(static_cast<int>(j), rank_ * chunk_ + k);
      return true;
    case BenchOp::kSendRecv:
      *v = value((rank_ - 1 + n) % n, i);
      return true;
    case BenchOp::kPingPong:
      *v = value(0, i);
      return rank_ < 2;
  }
  return false;
}

int64_t OpRunner::wrong() const {
  fetch();
  Tensor r = result();
  double tol = 0;
  switch (dtype_) {
    case DType::kF32:
    case DType::kF64:
      tol = 1e-5;
      break;
    case DType::kF16:
      tol = 2e-3;
      break;
    case DType::kBF16:
      tol = 1e-2;
      break;
    default:
      break;
  }
  int64_t bad = 0;
  for (size_t i = 0; i < r.numel; ++i) {
    double want = 0;
    if (!expected(i, &want)) continue;
    want = quantize(dtype_, want);
    double got = get_element(r, i);
    if (!(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) ++bad;
  }
  return bad;
}

std::string OpRunner::describe(size_t max) const {
  fetch();
  Tensor r = result();
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < r.numel && i < max; ++i) {
    s << (i ? ", " : "") << get_element(r, i);
  }
  if (r.numel > max) s << ", ... (" << r.numel << " values)";
  s << "]";
  return s.str();
}

}  // namespace dlaunch::workloads
