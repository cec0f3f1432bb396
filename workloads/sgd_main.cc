// dl-sgd: synchronous data-parallel SGD of a 784-128-10 MLP on Fashion-MNIST.
// Under dlaunch each worker trains on its part of the data; alone it trains
// in one process.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>

#include "comm/cli_checks.h"
#include "comm/device_buffer.h"
#include "workloads/checkpoint.h"
#include "workloads/idx.h"
#include "workloads/replica.h"
#include "workloads/sgd.h"
#include "workloads/worker.h"

namespace dlaunch::workloads {
namespace {

int restart_count() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return v ? std::atoi(v) : 0;
}

}  // namespace
}  // namespace dlaunch::workloads

int main(int argc, char** argv) {
  using namespace dlaunch::workloads;
  CLI::App app(
      "Synchronous data-parallel SGD (784-128-10 MLP, lr 0.01, momentum 0.5) "
      "on Fashion-MNIST; run it under dlaunch, e.g. "
      "build/bin/dlaunch --nproc-per-node 2 build/bin/dl-sgd",
      "dl-sgd");
  SgdOptions opt;
  std::string data = kDefaultDataDir;
  std::string device = "cpu";
  std::string backend;  // empty: the device's (gloo for cpu, nccl for cuda)
  size_t limit_train = 0, limit_test = 0;
  std::string checkpoint_dir;
  bool no_checkpoint = false;
  int exit_after = 0;
  app.add_option("--epochs", opt.epochs, "epochs to train (default 10)")
      ->check(dlaunch::comm::whole_number(1));
  app.add_option("--data", data,
                 "folder with MNIST-format {train,t10k}-*-ubyte[.gz] files "
                 "(default " +
                     data + ")");
  app.add_option("--device", device,
                 "where to train: cpu (OpenBLAS, gradients over gloo) or cuda "
                 "(cuBLAS on the rank's GPU, gradients over nccl; default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--backend", backend,
                 "comm backend: gloo or nccl (default: gloo with --device "
                 "cpu, nccl with --device cuda)");
  app.add_option("--batch-size", opt.global_batch,
                 "global batch, split across ranks (default 128)")
      ->check(dlaunch::comm::whole_number(1));
  app.add_option("--lr", opt.lr, "learning rate (default 0.01)");
  app.add_option("--momentum", opt.momentum, "SGD momentum (default 0.5)");
  app.add_option("--seed", opt.seed,
                 "seed of init and data order (default 1234)");
  app.add_option("--limit-train", limit_train,
                 "train on the first N samples only (default: all)");
  app.add_option("--limit-test", limit_test,
                 "evaluate on the first N test samples only (default: all)");
  app.add_flag("--per-parameter", opt.per_parameter,
               "one all-reduce per parameter tensor (the seeds' "
               "average_gradients) instead of one over the flat buffer");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "checkpoint after every epoch here and resume from it "
                 "(default under dlaunch: $TMPDIR/dl-sgd-$TORCHELASTIC_RUN_ID; "
                 "alone: none)");
  app.add_flag("--no-checkpoint", no_checkpoint, "write no checkpoints");
  app.add_option("--exit-after-epoch", exit_after,
                 "fault injection: rank 0 exits with status 1 after "
                 "checkpointing epoch N, on the first start only "
                 "(TORCHELASTIC_RESTART_COUNT=0)");
  return run_main(app, argc, argv, [&]() -> int {
    const bool cuda = device == "cuda";
    const std::string device_backend = cuda ? "nccl" : "gloo";
    const bool backend_given = !backend.empty();
    if (!backend_given) backend = device_backend;
    if (backend != device_backend && (backend == "gloo" || backend == "nccl")) {
      throw std::invalid_argument(
          "--device " + device + " all-reduces gradients over --backend " +
          device_backend + ", not " + backend + "; drop --backend or pass " +
          (cuda ? "--device cpu" : "--device cuda"));
    }
    if (cuda) {
      opt.device = dlaunch::comm::DeviceType::kCuda;
      // Before the group: init_process_group("nccl") would fail on its own,
      // suggesting gloo, which does not train on a GPU.
      if (std::string why = cuda_unavailable(); !why.empty()) {
        throw std::runtime_error(why);
      }
    }
    // The data set first, then the group: a rank that loads for longer
    // than its peers (a loaded machine, a slow disk) would keep them
    // waiting in the first collective, which --hang-timeout counts as no
    // progress; the group's rendezvous waits for the last rank instead
    // (within comm's timeout), before anything is timed.
    TrainData train = prepare(load_mnist_split(data, "train"), limit_train);
    TrainData test = prepare(load_mnist_split(data, "t10k"), limit_test);
    std::unique_ptr<dlaunch::comm::ProcessGroup> pg;
    if (launched_distributed() || (backend_given && backend != "gloo")) {
      pg = init_world(backend, "dl-sgd");
    }
    const int rank = pg ? pg->rank() : 0;
    if (!no_checkpoint) {
      if (!checkpoint_dir.empty()) {
        opt.checkpoint_dir = checkpoint_dir;
      } else if (const char* id = std::getenv("TORCHELASTIC_RUN_ID")) {
        const char* tmp = std::getenv("TMPDIR");
        opt.checkpoint_dir = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                             ("dl-sgd-" + std::string(id));
      }
    }
    if (rank == 0) {
      std::printf(
          "dl-sgd: %zu train / %zu test samples, %d rank(s) on %s, batch %d "
          "per rank, %s all-reduce%s\n",
          train.n, test.n, pg ? pg->size() : 1,
          cuda ? ("cuda:" + std::to_string(dlaunch::comm::default_device()))
                     .c_str()
               : "cpu",
          opt.global_batch / (pg ? pg->size() : 1),
          opt.per_parameter ? "per-parameter" : "flat",
          opt.checkpoint_dir.empty()
              ? ", no checkpoints"
              : (", checkpoints in " + opt.checkpoint_dir.string()).c_str());
      if (restart_count() > 0) {
        std::printf("dl-sgd: restart %d of the worker group\n",
                    restart_count());
      }
      std::fflush(stdout);
    }
    const int fail_at = restart_count() == 0 ? exit_after : 0;
    opt.on_epoch = [&](const EpochStats& s) {
      std::printf(
          "epoch %d/%d loss %.4f test_acc %.4f samples/s %.0f time "
          "%.2fs\n",
          s.epoch, s.epochs, s.loss, s.test_acc, s.samples_per_s, s.seconds);
      std::fflush(stdout);
      if (s.epoch == fail_at) {
        std::fprintf(stderr,
                     "dl-sgd: --exit-after-epoch %d: exiting with status 1 "
                     "to simulate a failure\n",
                     fail_at);
        std::fflush(stderr);
        _exit(1);
      }
    };
    opt.on_resume = [&](int done) {
      std::printf("dl-sgd: resuming after epoch %d from %s\n", done,
                  checkpoint_path(opt.checkpoint_dir).c_str());
      std::fflush(stdout);
    };
    SgdResult r = train_sgd(pg.get(), train, test, opt);
    if (rank == 0 && r.history.empty()) {
      std::printf(
          "dl-sgd: checkpoint already at epoch %d/%d: nothing to "
          "train\n",
          r.resumed_epoch, opt.epochs);
    }
    return 0;
  });
}
