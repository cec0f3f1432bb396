#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/tensor.h"
#include "workloads/mlp.h"
#include "workloads/sgd.h"

namespace dlaunch::workloads {

// What a replica needs: the group, the data, the model's layout and initial
// parameters, the optimizer settings. The pointers must outlive the replica.
struct ReplicaSetup {
  comm::ProcessGroup* pg = nullptr;  // nullptr: one process; default none
  const TrainData* train = nullptr;  // training split; required
  const TrainData* test = nullptr;   // test split; required
  const Mlp* model = nullptr;        // layout (Mlp::slices) and initial params
  float lr = 0.01f;                  // learning rate; default 0.01
  float momentum = 0.5f;             // SGD momentum; default 0.5
  bool per_parameter = false;        // one all-reduce per tensor; default false
};

// Sum of the steps' mean batch losses over an epoch, and the step count.
struct EpochLoss {
  double sum = 0;
  size_t steps = 0;
};

// One rank's copy of the MLP and its SGD momentum on one device, driven an
// epoch at a time by train_sgd: the CPU replica (OpenBLAS) and the CUDA one
// (cuBLAS and workloads/cuda/kernels.cu) keep Mlp's flat parameter layout,
// so checkpoints and results are the same bytes. One thread at a time.
class Replica {
 public:
  virtual ~Replica() = default;

  // Trains on the training samples `order`, in steps of `batch` (the last
  // one may be shorter): forward, backward, gradient averaged over the
  // group, SGD update. Throws CommError from communication.
  virtual EpochLoss train_epoch(std::span<const uint32_t> order, int batch) = 0;
  // How many of the test samples [lo, hi) the model predicts right.
  virtual size_t count_correct(size_t lo, size_t hi) = 0;
  // Parameters and momentum on the replica's device (for broadcasting a
  // resumed state); valid while the replica lives.
  virtual std::array<comm::Tensor, 2> state() = 0;
  // Host copies of the parameters and the momentum buffer, and back.
  virtual void read_state(std::vector<float>& params,
                          std::vector<float>& momentum) = 0;
  virtual void write_state(std::span<const float> params,
                           std::span<const float> momentum) = 0;
};

// The OpenBLAS replica (workloads/sgd.cc).
std::unique_ptr<Replica> make_cpu_replica(const ReplicaSetup& setup);

// Why this process cannot train on a CUDA device, naming the fix: the build
// has no CUDA (DLAUNCH_WITH_CUDA off) or no device is visible. Empty when it
// can. Needs no GPU.
std::string cuda_unavailable();

// The CUDA replica on comm::default_device() (workloads/cuda/replica.cc;
// the group, if any, must be an nccl one on that device). Throws
// std::runtime_error with cuda_unavailable()'s text where it is not empty.
std::unique_ptr<Replica> make_cuda_replica(const ReplicaSetup& setup);

}  // namespace dlaunch::workloads
