#include "workloads/sgd.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include "workloads/checkpoint.h"

namespace dlaunch::workloads {
namespace {

using comm::Tensor;

// splitmix64: decorrelates the per-(epoch, rank) shuffle seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fisher-Yates with our own index draw, so the order does not depend on the
// standard library's distribution implementation.
void shuffle(std::vector<uint32_t>& v, uint64_t seed) {
  std::mt19937_64 g(seed);
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(g() % i);
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace

TrainData prepare(const Dataset& d, size_t limit) {
  TrainData t;
  t.n = (limit == 0 || limit > d.n) ? d.n : limit;
  t.dim = d.pixels();
  t.x.resize(t.n * t.dim);
  for (size_t i = 0; i < t.x.size(); ++i) {
    t.x[i] = (static_cast<float>(d.images[i]) / 255.0f - 0.1307f) / 0.3081f;
  }
  t.y.assign(d.labels.begin(), d.labels.begin() + static_cast<ptrdiff_t>(t.n));
  return t;
}

std::vector<uint32_t> epoch_order(size_t n, uint64_t seed, int epoch, int rank,
                                  int world) {
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  shuffle(all, seed);
  size_t part = n / static_cast<size_t>(world);
  std::vector<uint32_t> mine(
      all.begin() + static_cast<ptrdiff_t>(part * rank),
      all.begin() + static_cast<ptrdiff_t>(part * (rank + 1)));
  shuffle(mine, mix(mix(seed) ^ (static_cast<uint64_t>(epoch) << 32 |
                                 static_cast<uint32_t>(rank))));
  return mine;
}

SgdResult train_sgd(comm::ProcessGroup* pg, const TrainData& train,
                    const TrainData& test, const SgdOptions& options) {
  const int rank = pg ? pg->rank() : 0;
  const int world = pg ? pg->size() : 1;
  const int batch = options.global_batch / world;
  if (batch < 1) {
    throw std::invalid_argument(
        "global batch " + std::to_string(options.global_batch) +
        " is smaller than the world size " + std::to_string(world) +
        "; pass --batch-size of at least the number of ranks");
  }
  if (train.n / static_cast<size_t>(world) == 0) {
    throw std::invalid_argument("training set of " + std::to_string(train.n) +
                                " samples is too small for " +
                                std::to_string(world) + " ranks");
  }
  MlpShape shape;
  shape.in = static_cast<int>(train.dim);
  Mlp model(shape);
  model.init(options.seed);
  SgdMomentum opt(model.num_params(), options.lr, options.momentum);
  std::vector<float> grad(model.num_params());

  // Resume: rank 0 reads the checkpoint and broadcasts it, so ranks on other
  // nodes need no shared file system. A bad checkpoint is reported to every
  // rank (header -1) instead of leaving them waiting in the broadcast.
  SgdResult result;
  int start_epoch = 0;
  if (!options.checkpoint_dir.empty()) {
    std::vector<int64_t> header = {0, 0};
    std::optional<CheckpointError> error;
    if (rank == 0) {
      try {
        std::optional<Checkpoint> c = load_checkpoint(options.checkpoint_dir);
        if (c) {
          std::string file = checkpoint_path(options.checkpoint_dir).string();
          if (c->shape.in != shape.in || c->shape.hidden != shape.hidden ||
              c->shape.out != shape.out ||
              c->params.size() != model.num_params()) {
            throw CheckpointError("checkpoint " + file +
                                  " holds another model (" +
                                  std::to_string(c->shape.in) + "-" +
                                  std::to_string(c->shape.hidden) + "-" +
                                  std::to_string(c->shape.out) +
                                  "); delete it or choose another "
                                  "--checkpoint-dir");
          }
          if (c->seed != options.seed) {
            throw CheckpointError(
                "checkpoint " + file + " was written with --seed " +
                std::to_string(c->seed) + " but this run has --seed " +
                std::to_string(options.seed) +
                "; pass the same seed, or delete it to start over");
          }
          header = {1, c->epoch};
          std::copy(c->params.begin(), c->params.end(), model.params().begin());
          std::copy(c->momentum.begin(), c->momentum.end(),
                    opt.buffer().begin());
        }
      } catch (const CheckpointError& e) {
        error = e;
        header = {-1, 0};
      }
    }
    if (pg) pg->broadcast(Tensor::of(header), 0);
    if (header[0] < 0) {
      if (error) throw *error;
      throw CheckpointError(
          "rank 0 could not load its checkpoint (see rank 0's error)");
    }
    if (header[0] == 1) {
      if (pg) {
        pg->broadcast(Tensor::of(model.params()), 0);
        pg->broadcast(Tensor::of(opt.buffer()), 0);
      }
      start_epoch = static_cast<int>(header[1]);
      if (rank == 0 && options.on_resume) options.on_resume(start_epoch);
    }
  }
  result.resumed_epoch = start_epoch;

  std::vector<float> xb(static_cast<size_t>(batch) * train.dim);
  std::vector<uint8_t> yb(batch);
  const float inv_world = 1.0f / static_cast<float>(world);
  for (int epoch = start_epoch; epoch < options.epochs; ++epoch) {
    std::vector<uint32_t> order =
        options.order ? options.order(epoch)
                      : epoch_order(train.n, options.seed, epoch, rank, world);
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    size_t steps = 0;
    for (size_t start = 0; start < order.size(); start += batch) {
      int b = static_cast<int>(
          std::min(order.size() - start, static_cast<size_t>(batch)));
      for (int i = 0; i < b; ++i) {
        const float* src = &train.x[order[start + i] * train.dim];
        std::copy(src, src + train.dim, &xb[i * train.dim]);
        yb[i] = train.y[order[start + i]];
      }
      loss_sum += model.forward_backward(xb.data(), yb.data(), b, grad);
      if (pg && world > 1) {
        if (options.per_parameter) {
          for (const ParamSlice& s : model.slices()) {
            pg->all_reduce(Tensor::of(grad.data() + s.offset, s.size));
          }
        } else {
          pg->all_reduce(Tensor::of(grad));
        }
        for (float& g : grad) g *= inv_world;
      }
      opt.step(model.params(), grad);
      ++steps;
    }
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();

    // Evaluate this rank's share of the test split, then sum over ranks.
    size_t lo = test.n * rank / world, hi = test.n * (rank + 1) / world;
    double correct = 0;
    constexpr size_t kEvalBatch = 1000;
    for (size_t s = lo; s < hi; s += kEvalBatch) {
      int b = static_cast<int>(std::min(hi - s, kEvalBatch));
      correct += model.count_correct(&test.x[s * test.dim], &test.y[s], b);
    }
    std::vector<double> sums = {loss_sum, static_cast<double>(steps), correct,
                                static_cast<double>(order.size())};
    if (pg && world > 1) pg->all_reduce(Tensor::of(sums));

    if (rank == 0 && !options.checkpoint_dir.empty()) {
      Checkpoint c;
      c.epoch = epoch + 1;
      c.seed = options.seed;
      c.world_size = world;
      c.shape = shape;
      c.params.assign(model.params().begin(), model.params().end());
      c.momentum.assign(opt.buffer().begin(), opt.buffer().end());
      save_checkpoint(options.checkpoint_dir, c);
    }
    if (rank == 0) {
      EpochStats st;
      st.epoch = epoch + 1;
      st.epochs = options.epochs;
      st.loss = sums[1] > 0 ? sums[0] / sums[1] : 0;
      st.test_acc = test.n > 0 ? sums[2] / static_cast<double>(test.n) : 0;
      st.seconds = seconds;
      st.samples_per_s = seconds > 0 ? sums[3] / seconds : 0;
      result.history.push_back(st);
      if (options.on_epoch) options.on_epoch(st);
    }
  }
  result.params.assign(model.params().begin(), model.params().end());
  return result;
}

}  // namespace dlaunch::workloads
