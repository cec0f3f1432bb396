// The CUDA replica: the MLP's passes (mlp_passes.h) with cuBLAS SGEMM/SGEMV
// for the products and kernels.cu for the rest; both splits live on the
// device, so a step moves no data between host and device.
//
// Every kernel and cuBLAS call runs on the legacy default stream
// (cudaStreamLegacy), which the nccl backend's internal stream (a blocking
// stream) is ordered with both ways: its all-reduce starts after the
// backward pass issued before it, and the SGD update issued after it waits
// for it. So a step needs no host synchronisation; the host waits for a
// step's all-reduce Work only after issuing the next step's, to surface
// errors within a step and bound how far it runs ahead.
#include "workloads/replica.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "comm/device_buffer.h"
#include "workloads/cuda/kernels.h"
#include "workloads/cuda/mlp_passes.h"

namespace dlaunch::workloads {
namespace {

using comm::DeviceBuffer;
using comm::DType;
using comm::Tensor;

const cudaStream_t kStream = cudaStreamLegacy;
constexpr int kEvalBatch = 1000;  // test rows per forward pass, as the CPU's

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("dl-sgd --device cuda: ") + what +
                             ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
  }
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("dl-sgd --device cuda: ") + what +
                             ": " + cublasGetStatusName(s) + " (" +
                             cublasGetStatusString(s) + ")");
  }
}

// A cuBLAS handle on kStream, destroyed with its owner.
class Blas {
 public:
  Blas() {
    check_blas(cublasCreate(&h_), "cublasCreate");
    check_blas(cublasSetStream(h_, kStream), "cublasSetStream");
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  ~Blas() { cublasDestroy(h_); }
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// mlp_passes.h's Ops on the device: cuBLAS and kernels.cu on kStream.
struct DeviceOps {
  cublasHandle_t blas;
  const float* ones;  // at least as many ones as a pass has rows

  void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
            const float* b, int ldb, float* c, int ldc) const {
    const float one = 1.0f, zero = 0.0f;
    check_blas(cublasSgemm(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                           tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, a,
                           lda, b, ldb, &zero, c, ldc),
               "cublasSgemm");
  }
  void bias_relu(float* h, const float* b, int rows, int cols) const {
    cuda::bias_relu(h, b, rows, cols, kStream);
  }
  // Row-major a (rows x cols) is column-major cols x rows: a times ones.
  void column_sums(const float* a, int rows, int cols, float* out) const {
    const float one = 1.0f, zero = 0.0f;
    check_blas(cublasSgemv(blas, CUBLAS_OP_N, cols, rows, &one, a, cols, ones,
                           1, &zero, out, 1),
               "cublasSgemv");
  }
  void relu_mask(float* dh, const float* h, size_t n) const {
    cuda::relu_mask(dh, h, n, kStream);
  }
};

template <class T>
T* ptr(const DeviceBuffer& b, size_t offset_elems = 0) {
  return static_cast<T*>(b.data()) + offset_elems;
}

// A device copy of a split: x (n x dim floats) and y.
struct DeviceSplit {
  DeviceSplit(const TrainData& d, int device)
      : x(std::max<size_t>(d.x.size(), 1) * sizeof(float), device),
        y(std::max<size_t>(d.y.size(), 1), device) {
    x.copy_from_host(d.x.data(), d.x.size() * sizeof(float));
    y.copy_from_host(d.y.data(), d.y.size());
  }
  DeviceBuffer x, y;
};

class CudaReplica final : public Replica {
 public:
  CudaReplica(const ReplicaSetup& s, int device)
      : pg_(s.pg),
        device_(device),
        shape_(s.model->shape()),
        slices_(s.model->slices()),
        n_(s.model->num_params()),
        lr_(s.lr),
        momentum_(s.momentum),
        per_parameter_(s.per_parameter),
        train_(*s.train, device),
        test_(*s.test, device),
        test_dim_(s.test->dim),
        train_dim_(s.train->dim),
        params_(n_ * sizeof(float), device),
        momentum_buf_(n_ * sizeof(float), device),
        grad_(n_ * sizeof(float), device),
        order_(std::max<size_t>(s.train->n, 1) * sizeof(uint32_t), device),
        sums_(sizeof(double) + sizeof(unsigned long long), device) {
    params_.copy_from_host(s.model->params().data(), n_ * sizeof(float));
    check_cuda(cudaMemset(momentum_buf_.data(), 0, n_ * sizeof(float)),
               "cudaMemset");
  }

  EpochLoss train_epoch(std::span<const uint32_t> order, int batch) override {
    reserve(batch);
    order_.copy_from_host(order.data(), order.size() * sizeof(uint32_t));
    check_cuda(cudaMemsetAsync(sums_.data(), 0, sizeof(double), kStream),
               "cudaMemsetAsync");
    EpochLoss l;
    for (size_t start = 0; start < order.size(); start += batch) {
      const int b = static_cast<int>(
          std::min(order.size() - start, static_cast<size_t>(batch)));
      step(ptr<uint32_t>(order_, start), b);
      ++l.steps;
    }
    finish_all_reduces();
    double loss_sum = 0;
    sums_.copy_to_host(&loss_sum, sizeof(double));  // waits for the epoch
    l.sum = loss_sum;
    return l;
  }

  size_t count_correct(size_t lo, size_t hi) override {
    reserve(kEvalBatch);
    auto* correct = reinterpret_cast<unsigned long long*>(
        static_cast<char*>(sums_.data()) + sizeof(double));
    check_cuda(cudaMemsetAsync(correct, 0, sizeof(unsigned long long), kStream),
               "cudaMemsetAsync");
    for (size_t s = lo; s < hi; s += kEvalBatch) {
      const int b = static_cast<int>(std::min<size_t>(hi - s, kEvalBatch));
      const float* x = ptr<float>(test_.x, s * test_dim_);
      forward(x, b);
      cuda::count_argmax(logits(), b2(), ptr<uint8_t>(test_.y, s), b,
                         shape_.out, correct, kStream);
    }
    check_cuda(cudaGetLastError(), "count_argmax");
    unsigned long long n = 0;
    sums_.copy_to_host(&n, sizeof(n), sizeof(double));
    return static_cast<size_t>(n);
  }

  std::array<Tensor, 2> state() override {
    return {params_.view(0, n_, DType::kF32),
            momentum_buf_.view(0, n_, DType::kF32)};
  }

  void read_state(std::vector<float>& params,
                  std::vector<float>& momentum) override {
    params.resize(n_);
    momentum.resize(n_);
    params_.copy_to_host(params.data(), n_ * sizeof(float));
    momentum_buf_.copy_to_host(momentum.data(), n_ * sizeof(float));
  }

  void write_state(std::span<const float> params,
                   std::span<const float> momentum) override {
    params_.copy_from_host(params.data(), n_ * sizeof(float));
    momentum_buf_.copy_from_host(momentum.data(), n_ * sizeof(float));
  }

 private:
  const float* b2() const { return ptr<float>(params_, slices_[3].offset); }
  float* hidden() const { return ptr<float>(hidden_); }
  float* logits() const { return ptr<float>(logits_); }

  // Scratch for `rows` samples (grows only).
  void reserve(int rows) {
    if (rows <= rows_) return;
    const size_t r = static_cast<size_t>(rows);
    xb_ = DeviceBuffer(r * train_dim_ * sizeof(float), device_);
    yb_ = DeviceBuffer(r, device_);
    hidden_ = DeviceBuffer(r * shape_.hidden * sizeof(float), device_);
    dhidden_ = DeviceBuffer(r * shape_.hidden * sizeof(float), device_);
    logits_ = DeviceBuffer(r * shape_.out * sizeof(float), device_);
    ones_ = DeviceBuffer(r * sizeof(float), device_);
    cuda::fill(ptr<float>(ones_), 1.0f, r, kStream);
    rows_ = rows;
  }

  DeviceOps ops() const { return {blas_.get(), ptr<float>(ones_)}; }
  cuda::MlpTensors<const float> weights() const {
    return cuda::tensors<const float>(ptr<float>(params_), slices_);
  }

  void forward(const float* x, int b) {
    DeviceOps o = ops();
    cuda::forward(o, shape_, weights(), x, b, hidden(), logits());
  }

  // One step on the `b` training samples at device indices `idx`.
  void step(const uint32_t* idx, int b) {
    float* x = ptr<float>(xb_);
    uint8_t* y = ptr<uint8_t>(yb_);
    cuda::gather_rows(ptr<float>(train_.x), ptr<uint8_t>(train_.y), idx, b,
                      static_cast<int>(train_dim_), x, y, kStream);
    forward(x, b);
    // logits become dlogits = (softmax - onehot) / b.
    cuda::softmax_xent_grad(logits(), b2(), y, b, shape_.out,
                            ptr<double>(sums_), kStream);
    DeviceOps o = ops();
    cuda::backward(o, shape_, weights(), x, b, hidden(), logits(),
                   ptr<float>(dhidden_),
                   cuda::tensors<float>(ptr<float>(grad_), slices_));
    all_reduce_gradient();
    cuda::sgd_update(ptr<float>(params_), ptr<float>(momentum_buf_),
                     ptr<float>(grad_), n_, lr_, momentum_, kStream);
    check_cuda(cudaGetLastError(), "a kernel launch");
  }

  // Averages the gradient over the group (NCCL's native AVG), then waits
  // for the previous step's all-reduce (see the file comment).
  void all_reduce_gradient() {
    if (!pg_ || pg_->size() == 1) return;
    std::vector<std::unique_ptr<comm::Work>> issued;
    if (per_parameter_) {
      for (const ParamSlice& s : slices_) {
        issued.push_back(pg_->iall_reduce(
            grad_.view(s.offset * sizeof(float), s.size, DType::kF32),
            comm::ReduceOp::kAvg));
      }
    } else {
      issued.push_back(pg_->iall_reduce(grad_.view(0, n_, DType::kF32),
                                        comm::ReduceOp::kAvg));
    }
    finish_all_reduces();
    in_flight_ = std::move(issued);
  }

  void finish_all_reduces() {
    for (auto& w : in_flight_) w->wait(pg_->timeout());
    in_flight_.clear();
  }

  comm::ProcessGroup* pg_;
  int device_;
  MlpShape shape_;
  std::vector<ParamSlice> slices_;
  size_t n_;
  float lr_, momentum_;
  bool per_parameter_;
  Blas blas_;
  DeviceSplit train_, test_;
  size_t test_dim_, train_dim_;
  DeviceBuffer params_, momentum_buf_, grad_;
  DeviceBuffer order_;  // the epoch's sample order
  DeviceBuffer sums_;   // double loss sum, then unsigned long long correct
  int rows_ = 0;        // rows the scratch below holds
  DeviceBuffer xb_, yb_, hidden_, dhidden_, logits_, ones_;
  std::vector<std::unique_ptr<comm::Work>> in_flight_;
};

}  // namespace

std::string cuda_unavailable() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::string why = e != cudaSuccess ? std::string("cudaGetDeviceCount: ") +
                                             cudaGetErrorName(e) + " (" +
                                             cudaGetErrorString(e) + ")"
                                       : "cudaGetDeviceCount found no device";
    cudaGetLastError();
    return "--device cuda: no CUDA device is visible (" + why +
           "); run on a machine with an NVIDIA GPU (check nvidia-smi and "
           "CUDA_VISIBLE_DEVICES), or train on the CPU with --device cpu";
  }
  const int device = comm::default_device();
  if (device >= n) {
    return "--device cuda: CUDA device " + std::to_string(device) +
           " does not exist; this process sees " + std::to_string(n) +
           " device(s); run at most one rank per GPU, or under dlaunch "
           "--gpu-binding per-rank";
  }
  return {};
}

std::unique_ptr<Replica> make_cuda_replica(const ReplicaSetup& setup) {
  if (std::string why = cuda_unavailable(); !why.empty()) {
    throw std::runtime_error(why);
  }
  const int device = comm::default_device();
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return std::make_unique<CudaReplica>(setup, device);
}

}  // namespace dlaunch::workloads
