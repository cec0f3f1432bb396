#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/tensor.h"
#include "workloads/bench_table.h"
#include "workloads/op_buffer.h"

namespace dlaunch::workloads {

// `v` as stored in `dtype` and read back.
double quantize(comm::DType dtype, double v);

// Buffers for one operation of dl-bench or dl-collectives over `pg`, filled
// with a known pattern so every rank can check what it got. `count` is the
// nccl-tests element count: the whole buffer, split in pg.size() chunks for
// the splitting ops (rounded down to a multiple). For nccl the operation
// runs on device copies of the host buffers (results checked on the host).
// Owned by one thread.
class OpRunner {
 public:
  OpRunner(comm::ProcessGroup& pg, BenchOp op, size_t count, comm::DType dtype,
           comm::ReduceOp redop, int root);

  // Inputs to the pattern, outputs to a sentinel.
  void fill();
  // Runs the operation once (blocking; send/recv waits for both).
  void run();
  // Elements of this rank's result that differ from the expected values
  // (0 where the operation leaves this rank nothing to check).
  int64_t wrong() const;
  // "[3, 3, 3, 3]": up to `max` values of this rank's result.
  std::string describe(size_t max = 8) const;

  size_t count() const { return count_; }
  size_t bytes() const { return count_ * comm::dtype_size(dtype_); }

 private:
  // The input element `i` of rank `r`.
  double value(int r, size_t i) const;
  // The reduction over ranks of value(r, i).
  double reduced(size_t i) const;
  // What this rank's result should hold at `i`; false where unchecked.
  bool expected(size_t i, double* v) const;
  comm::Tensor view(std::vector<uint64_t>& buf, size_t offset, size_t n) const;
  // What run() passes to the group: on the device for nccl.
  comm::Tensor op_view(const std::optional<OpBuffer>& buf, size_t offset,
                       size_t n) const;
  std::vector<comm::Tensor> chunks(const std::optional<OpBuffer>& buf) const;
  // Copies the device result back to the host buffer (nccl).
  void fetch() const;
  comm::Tensor result() const;

  comm::ProcessGroup& pg_;
  BenchOp op_;
  size_t count_;
  size_t chunk_;
  comm::DType dtype_;
  comm::ReduceOp redop_;
  int root_;
  int rank_;
  int size_;
  std::vector<uint64_t> in_;  // 8-byte aligned storage
  std::vector<uint64_t> out_;
  bool out_of_place_;
  std::optional<OpBuffer> op_in_, op_out_;  // over in_ and out_
  // chunks() of op_in_ and op_out_ (the splitting ops), made once, so that
  // a timed run() allocates nothing, as OpenMPI's side (bench/mpi_bench.c).
  std::vector<comm::Tensor> in_chunks_, out_chunks_;
};

}  // namespace dlaunch::workloads
