// A build without CUDA (DLAUNCH_WITH_CUDA off): dl-sgd --device cuda says
// how to get one instead of training.
#include <stdexcept>
#include <string>

#include "workloads/replica.h"

namespace dlaunch::workloads {

std::string cuda_unavailable() {
  return "--device cuda: this build has no CUDA training (configured with "
         "DLAUNCH_WITH_CUDA=OFF: nvcc, cuBLAS or NCCL was not found under "
         "/usr/local/cuda); rebuild where the CUDA toolkit and NCCL are "
         "installed (scripts/build), or train on the CPU with --device cpu";
}

std::unique_ptr<Replica> make_cuda_replica(const ReplicaSetup&) {
  throw std::runtime_error(cuda_unavailable());
}

}  // namespace dlaunch::workloads
