#include "workloads/sgd.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include "comm/device_buffer.h"
#include "workloads/checkpoint.h"
#include "workloads/replica.h"

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

namespace {

// The OpenBLAS replica: the batch is gathered into host buffers, the
// gradient all-reduced in place over the (gloo) group.
class CpuReplica final : public Replica {
 public:
  explicit CpuReplica(const ReplicaSetup& s)
      : pg_(s.pg),
        train_(*s.train),
        test_(*s.test),
        model_(*s.model),
        opt_(model_.num_params(), s.lr, s.momentum),
        grad_(model_.num_params()),
        per_parameter_(s.per_parameter) {}

  EpochLoss train_epoch(std::span<const uint32_t> order, int batch) override {
    const size_t dim = train_.dim;
    xb_.resize(static_cast<size_t>(batch) * dim);
    yb_.resize(batch);
    const int world = pg_ ? pg_->size() : 1;
    const float inv_world = 1.0f / static_cast<float>(world);
    EpochLoss l;
    for (size_t start = 0; start < order.size(); start += batch) {
      int b = static_cast<int>(
          std::min(order.size() - start, static_cast<size_t>(batch)));
      for (int i = 0; i < b; ++i) {
        const float* src = &train_.x[order[start + i] * dim];
        std::copy(src, src + dim, &xb_[i * dim]);
        yb_[i] = train_.y[order[start + i]];
      }
      l.sum += model_.forward_backward(xb_.data(), yb_.data(), b, grad_);
      if (pg_ && world > 1) {
        if (per_parameter_) {
          for (const ParamSlice& s : model_.slices()) {
            pg_->all_reduce(Tensor::of(grad_.data() + s.offset, s.size));
          }
        } else {
          pg_->all_reduce(Tensor::of(grad_));
        }
        for (float& g : grad_) g *= inv_world;
      }
      opt_.step(model_.params(), grad_);
      ++l.steps;
    }
    return l;
  }

  size_t count_correct(size_t lo, size_t hi) override {
    size_t correct = 0;
    constexpr size_t kEvalBatch = 1000;
    for (size_t s = lo; s < hi; s += kEvalBatch) {
      int b = static_cast<int>(std::min(hi - s, kEvalBatch));
      correct += model_.count_correct(&test_.x[s * test_.dim], &test_.y[s], b);
    }
    return correct;
  }

  std::array<Tensor, 2> state() override {
    return {Tensor::of(model_.params()), Tensor::of(opt_.buffer())};
  }

  void read_state(std::vector<float>& params,
                  std::vector<float>& momentum) override {
    params.assign(model_.params().begin(), model_.params().end());
    momentum.assign(opt_.buffer().begin(), opt_.buffer().end());
  }

  void write_state(std::span<const float> params,
                   std::span<const float> momentum) override {
    std::copy(params.begin(), params.end(), model_.params().begin());
    std::copy(momentum.begin(), momentum.end(), opt_.buffer().begin());
  }

 private:
  comm::ProcessGroup* pg_;
  const TrainData& train_;
  const TrainData& test_;
  Mlp model_;
  SgdMomentum opt_;
  std::vector<float> grad_;
  std::vector<float> xb_;
  std::vector<uint8_t> yb_;
  bool per_parameter_;
};

// A collective on a small host vector (root >= 0: broadcast from it; -1: sum
// all-reduce). The nccl backend takes device memory only, so there it goes
// through a buffer on the group's device.
template <class T>
void host_collective(comm::ProcessGroup& pg, std::vector<T>& v, int root) {
  if (pg.backend() != "nccl") {
    if (root >= 0) {
      pg.broadcast(Tensor::of(v), root);
    } else {
      pg.all_reduce(Tensor::of(v));
    }
    return;
  }
  const size_t bytes = v.size() * sizeof(T);
  comm::DeviceBuffer d(bytes, comm::default_device());
  d.copy_from_host(v.data(), bytes);
  Tensor t = d.view(0, v.size(), Tensor::of(v).dtype);
  if (root >= 0) {
    pg.broadcast(t, root);
  } else {
    pg.all_reduce(t);
  }
  d.copy_to_host(v.data(), bytes);
}

}  // namespace

std::unique_ptr<Replica> make_cpu_replica(const ReplicaSetup& setup) {
  return std::make_unique<CpuReplica>(setup);
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
  const bool cuda = options.device == comm::DeviceType::kCuda;
  if (pg && cuda != (pg->backend() == "nccl")) {
    throw std::invalid_argument(
        std::string("--device ") + (cuda ? "cuda" : "cpu") +
        " all-reduces over the " + (cuda ? "nccl" : "gloo") +
        " backend, but the group is '" + std::string(pg->backend()) +
        "'; pass --backend " + (cuda ? "nccl" : "gloo"));
  }
  MlpShape shape;
  shape.in = static_cast<int>(train.dim);
  Mlp model(shape);
  model.init(options.seed);
  ReplicaSetup setup;
  setup.pg = pg;
  setup.train = &train;
  setup.test = &test;
  setup.model = &model;
  setup.lr = options.lr;
  setup.momentum = options.momentum;
  setup.per_parameter = options.per_parameter;
  std::unique_ptr<Replica> replica =
      cuda ? make_cuda_replica(setup) : make_cpu_replica(setup);

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
          replica->write_state(c->params, c->momentum);
        }
      } catch (const CheckpointError& e) {
        error = e;
        header = {-1, 0};
      }
    }
    if (pg) host_collective(*pg, header, 0);
    if (header[0] < 0) {
      if (error) throw *error;
      throw CheckpointError(
          "rank 0 could not load its checkpoint (see rank 0's error)");
    }
    if (header[0] == 1) {
      if (pg) {
        for (const Tensor& t : replica->state()) pg->broadcast(t, 0);
      }
      start_epoch = static_cast<int>(header[1]);
      if (rank == 0 && options.on_resume) options.on_resume(start_epoch);
    }
  }
  result.resumed_epoch = start_epoch;

  for (int epoch = start_epoch; epoch < options.epochs; ++epoch) {
    std::vector<uint32_t> order =
        options.order ? options.order(epoch)
                      : epoch_order(train.n, options.seed, epoch, rank, world);
    auto t0 = std::chrono::steady_clock::now();
    EpochLoss loss = replica->train_epoch(order, batch);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();

    // Evaluate this rank's share of the test split, then sum over ranks.
    size_t lo = test.n * rank / world, hi = test.n * (rank + 1) / world;
    const double correct = static_cast<double>(replica->count_correct(lo, hi));
    std::vector<double> sums = {loss.sum, static_cast<double>(loss.steps),
                                correct, static_cast<double>(order.size())};
    if (pg && world > 1) host_collective(*pg, sums, -1);

    if (rank == 0 && !options.checkpoint_dir.empty()) {
      Checkpoint c;
      c.epoch = epoch + 1;
      c.seed = options.seed;
      c.world_size = world;
      c.shape = shape;
      replica->read_state(c.params, c.momentum);
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
  std::vector<float> momentum;
  replica->read_state(result.params, momentum);
  return result;
}

}  // namespace dlaunch::workloads
