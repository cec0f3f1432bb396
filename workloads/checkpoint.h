#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <vector>

#include "workloads/mlp.h"

namespace dlaunch::workloads {

// A checkpoint file that exists but cannot be used (corrupt, another model,
// another seed). The message names the file and the fix.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The training state after a completed epoch: with it, a restarted run
// continues exactly where the uninterrupted one would be. The data order is a
// pure function of (seed, epoch, rank, world), so the seed is the whole RNG
// state.
struct Checkpoint {
  int epoch = 0;                // epochs completed
  uint64_t seed = 0;            // --seed of the run (init and data order)
  int world_size = 1;           // ranks of the run that wrote it
  MlpShape shape;               // model layer sizes
  std::vector<float> params;    // the flat parameter buffer
  std::vector<float> momentum;  // SGD momentum buffer, same layout
};

// dir/dl-sgd.ckpt: the one file a run keeps in its checkpoint folder.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir);

// Writes `c` atomically: a temporary file in `dir` (created if needed),
// fsync, rename over the old checkpoint, fsync of the folder. A crash at any
// point leaves either the old or the new checkpoint, never a torn one.
// Throws CheckpointError naming the path on an I/O failure.
void save_checkpoint(const std::filesystem::path& dir, const Checkpoint& c);

// The checkpoint in `dir`, or nullopt when there is none. Throws
// CheckpointError naming the file when it is unreadable, truncated, fails its
// checksum or has another format version.
std::optional<Checkpoint> load_checkpoint(const std::filesystem::path& dir);

}  // namespace dlaunch::workloads
