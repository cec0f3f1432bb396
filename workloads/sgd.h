#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "comm/process_group.h"
#include "workloads/idx.h"
#include "workloads/mlp.h"

namespace dlaunch::workloads {

// A split ready for training: normalised float pixels and labels.
struct TrainData {
  size_t n = 0;
  size_t dim = 0;
  std::vector<float> x;  // n x dim, (pixel/255 - 0.1307) / 0.3081
  std::vector<uint8_t> y;
};

// The first `limit` samples of `d` (all when 0 or more than there are),
// normalised as the seeds normalise MNIST.
TrainData prepare(const Dataset& d, size_t limit = 0);

// The samples rank `rank` of `world` trains on in `epoch`, in order: a
// shuffle of 0..n-1 seeded with `seed` is cut into `world` equal parts
// (n / world each, the remainder unused, as the seeds' DataPartitioner),
// and the rank's part is reshuffled per epoch from (seed, epoch, rank).
std::vector<uint32_t> epoch_order(size_t n, uint64_t seed, int epoch, int rank,
                                  int world);

// What rank 0 reports after each epoch.
struct EpochStats {
  int epoch = 0;             // 1-based
  int epochs = 0;            // total planned
  double loss = 0;           // mean training loss over the epoch's steps
  double test_acc = 0;       // fraction of the test split predicted right
  double samples_per_s = 0;  // training samples (all ranks) per second
  double seconds = 0;        // wall time of the epoch's training steps
};

struct SgdOptions {
  int epochs = 10;         // epochs to reach (total, counting resumed ones)
  int global_batch = 128;  // samples per step over all ranks; default 128
  float lr = 0.01f;        // learning rate; default 0.01
  float momentum = 0.5f;   // SGD momentum; default 0.5
  uint64_t seed = 1234;    // init and data order; default 1234
  // Where the model trains: kCpu (OpenBLAS, gradients over gloo) or kCuda
  // (cuBLAS on comm::default_device(), gradients over nccl). Default kCpu.
  comm::DeviceType device = comm::DeviceType::kCpu;
  // One all-reduce per parameter tensor (the seeds' average_gradients)
  // instead of one over the flat buffer. Default false.
  bool per_parameter = false;
  // Where rank 0 writes a checkpoint after every epoch and from which every
  // run resumes when one is there; empty (default): no checkpoints.
  std::filesystem::path checkpoint_dir;
  // Overrides epoch_order() (tests: one rank replaying the order of N).
  // Default empty: epoch_order(train.n, seed, epoch, rank, world).
  std::function<std::vector<uint32_t>(int epoch)> order;
  // Called on rank 0 with the epochs done when a checkpoint is resumed.
  // Default: none.
  std::function<void(int epochs_done)> on_resume;
  // Called on rank 0 after each epoch. Default: none.
  std::function<void(const EpochStats&)> on_epoch;
};

struct SgdResult {
  int resumed_epoch = 0;            // epochs taken from a checkpoint (0: none)
  std::vector<float> params;        // final flat parameters
  std::vector<EpochStats> history;  // epochs run by this call (rank 0)
};

// Synchronous data-parallel SGD of the 784-128-10 MLP over `pg` (nullptr: a
// single process). Each rank steps through its part of the data in batches
// of global_batch / world, the flat gradient is averaged with one all-reduce
// per step, and every rank applies the same update. The test split is
// evaluated in parts and summed. With options.device kCuda the group must be
// an nccl one (or none). Throws CommError from communication,
// CheckpointError for an unusable checkpoint, std::invalid_argument for
// options that do not fit the data, world or group, std::runtime_error
// when CUDA training is unavailable (cuda_unavailable()).
SgdResult train_sgd(comm::ProcessGroup* pg, const TrainData& train,
                    const TrainData& test, const SgdOptions& options);

}  // namespace dlaunch::workloads
