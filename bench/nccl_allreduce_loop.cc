// nccl_allreduce_loop: the bare loop dl-bench --backend nccl is compared
// with (docs/performance.md, "NCCL"): ncclAllReduce in place (float32, sum)
// on one process's GPUs, each call followed by a wait for its stream, as a
// blocking all_reduce of comm does; no comm, no dlaunch.
//
//   build/bin/nccl-allreduce-loop [-b 8] [-e 1G] [-g GPUS] [-n 20] [-w 5]
//
// Prints one line per size in dl-bench's columns: bytes, count, the mean
// time of one call in us, algbw and busbw in GB/s (nccl-tests' convention).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void die(const std::string& what) {
  std::fprintf(stderr, "nccl-allreduce-loop: %s\n", what.c_str());
  std::exit(1);
}

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

void nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  switch (*end) {
    case 'K':
      v *= 1 << 10;
      break;
    case 'M':
      v *= 1 << 20;
      break;
    case 'G':
      v *= 1 << 30;
      break;
    case '\0':
      break;
    default:
      die(std::string("bad size '") + s + "' (use e.g. 8, 64K, 1M, 1G)");
  }
  return static_cast<size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  size_t min_bytes = 8, max_bytes = size_t{1} << 30;
  int gpus = 1, iters = 20, warmup = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "-b") {
      min_bytes = parse_size(argv[i + 1]);
    } else if (f == "-e") {
      max_bytes = parse_size(argv[i + 1]);
    } else if (f == "-g") {
      gpus = std::atoi(argv[i + 1]);
    } else if (f == "-n") {
      iters = std::atoi(argv[i + 1]);
    } else if (f == "-w") {
      warmup = std::atoi(argv[i + 1]);
    } else {
      die("unknown flag " + f + " (flags: -b -e -g -n -w)");
    }
  }
  if (gpus < 1 || iters < 1 || warmup < 0 || min_bytes < 4) {
    die("need -g >= 1, -n >= 1, -w >= 0 and -b >= 4");
  }
  std::vector<int> devs(gpus);
  for (int g = 0; g < gpus; ++g) devs[g] = g;
  std::vector<ncclComm_t> comms(gpus);
  nccl(ncclCommInitAll(comms.data(), gpus, devs.data()), "ncclCommInitAll");
  std::vector<cudaStream_t> streams(gpus);
  std::vector<void*> bufs(gpus);
  for (int g = 0; g < gpus; ++g) {
    cuda(cudaSetDevice(g), "cudaSetDevice");
    cuda(cudaStreamCreate(&streams[g]), "cudaStreamCreate");
    cuda(cudaMalloc(&bufs[g], max_bytes), "cudaMalloc");
    cuda(cudaMemset(bufs[g], 0, max_bytes), "cudaMemset");
  }
  auto once = [&](size_t count) {
    nccl(ncclGroupStart(), "ncclGroupStart");
    for (int g = 0; g < gpus; ++g) {
      nccl(ncclAllReduce(bufs[g], bufs[g], count, ncclFloat32, ncclSum,
                         comms[g], streams[g]),
           "ncclAllReduce");
    }
    nccl(ncclGroupEnd(), "ncclGroupEnd");
    for (int g = 0; g < gpus; ++g) {
      cuda(cudaStreamSynchronize(streams[g]), "cudaStreamSynchronize");
    }
  };
  std::printf(
      "# nccl-allreduce-loop: %d GPU(s), float32 sum in place, %d "
      "iterations, %d warm-up\n",
      gpus, iters, warmup);
  std::printf("#%11s %12s %10s %10s %10s\n", "size(B)", "count", "time(us)",
              "algbw", "busbw");
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    for (int i = 0; i < warmup; ++i) once(count);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) once(count);
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count() /
                      iters;
    const double algbw = static_cast<double>(count * sizeof(float)) / us / 1e3;
    const double busbw = algbw * 2.0 * (gpus - 1) / gpus;
    std::printf("%12zu %12zu %10.2f %10.2f %10.2f\n", count * sizeof(float),
                count, us, algbw, busbw);
    std::fflush(stdout);
  }
  for (int g = 0; g < gpus; ++g) {
    cudaFree(bufs[g]);
    ncclCommDestroy(comms[g]);
  }
  return 0;
}
