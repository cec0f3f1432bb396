// The MLP's element-wise kernels; the matrix products are cuBLAS calls in
// replica.cc. Small and launch-bound at these sizes (batch 128, 10
// classes): one thread per row where a row is short, grid-stride loops
// elsewhere.
#include <cfloat>

#include "workloads/cuda/kernels.h"

namespace dlaunch::workloads::cuda {
namespace {

constexpr int kThreads = 256;

int blocks_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

__global__ void gather_rows_k(const float* __restrict__ x,
                              const uint8_t* __restrict__ y,
                              const uint32_t* __restrict__ idx, int dim,
                              float* __restrict__ xb,
                              uint8_t* __restrict__ yb) {
  const int row = blockIdx.x;
  const size_t src = static_cast<size_t>(idx[row]);
  const float* from = x + src * dim;
  float* to = xb + static_cast<size_t>(row) * dim;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) to[j] = from[j];
  if (threadIdx.x == 0) yb[row] = y[src];
}

__global__ void bias_relu_k(float* __restrict__ h, const float* __restrict__ b,
                            size_t n, int cols) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = h[i] + b[i % cols];
    h[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ void softmax_xent_grad_k(float* __restrict__ z,
                                    const float* __restrict__ b,
                                    const uint8_t* __restrict__ y, int rows,
                                    int cols, double* loss_sum) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* row = z + static_cast<size_t>(r) * cols;
  float m = -FLT_MAX;
  for (int j = 0; j < cols; ++j) {
    row[j] += b[j];
    m = fmaxf(m, row[j]);
  }
  double sum = 0;
  for (int j = 0; j < cols; ++j) sum += exp(static_cast<double>(row[j] - m));
  const float lse = m + static_cast<float>(log(sum));
  const int label = y[r];
  const float inv = 1.0f / static_cast<float>(rows);
  atomicAdd(loss_sum, static_cast<double>(lse - row[label]) / rows);
  for (int j = 0; j < cols; ++j) {
    float p = expf(row[j] - lse);
    row[j] = (p - (j == label ? 1.0f : 0.0f)) * inv;
  }
}

__global__ void count_argmax_k(const float* __restrict__ z,
                               const float* __restrict__ b,
                               const uint8_t* __restrict__ y, int rows,
                               int cols, unsigned long long* correct) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = z + static_cast<size_t>(r) * cols;
  int best = 0;
  float best_v = row[0] + b[0];
  for (int j = 1; j < cols; ++j) {
    float v = row[j] + b[j];
    if (v > best_v) {
      best_v = v;
      best = j;
    }
  }
  if (best == y[r]) atomicAdd(correct, 1ull);
}

__global__ void relu_mask_k(float* __restrict__ dh, const float* __restrict__ h,
                            size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (h[i] <= 0.0f) dh[i] = 0.0f;
  }
}

__global__ void sgd_update_k(float* __restrict__ p, float* __restrict__ buf,
                             const float* __restrict__ g, size_t n, float lr,
                             float momentum) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = momentum * buf[i] + g[i];
    buf[i] = v;
    p[i] -= lr * v;
  }
}

__global__ void fill_k(float* x, float v, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = v;
  }
}

}  // namespace

void gather_rows(const float* x, const uint8_t* y, const uint32_t* idx,
                 int rows, int dim, float* xb, uint8_t* yb,
                 cudaStream_t stream) {
  if (rows <= 0) return;
  gather_rows_k<<<rows, kThreads, 0, stream>>>(x, y, idx, dim, xb, yb);
}

void bias_relu(float* h, const float* b, int rows, int cols,
               cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * cols;
  bias_relu_k<<<blocks_for(n), kThreads, 0, stream>>>(h, b, n, cols);
}

void softmax_xent_grad(float* z, const float* b, const uint8_t* y, int rows,
                       int cols, double* loss_sum, cudaStream_t stream) {
  softmax_xent_grad_k<<<blocks_for(rows), kThreads, 0, stream>>>(
      z, b, y, rows, cols, loss_sum);
}

void count_argmax(const float* z, const float* b, const uint8_t* y, int rows,
                  int cols, unsigned long long* correct, cudaStream_t stream) {
  count_argmax_k<<<blocks_for(rows), kThreads, 0, stream>>>(z, b, y, rows, cols,
                                                            correct);
}

void relu_mask(float* dh, const float* h, size_t n, cudaStream_t stream) {
  relu_mask_k<<<blocks_for(n), kThreads, 0, stream>>>(dh, h, n);
}

void sgd_update(float* p, float* buf, const float* g, size_t n, float lr,
                float momentum, cudaStream_t stream) {
  sgd_update_k<<<blocks_for(n), kThreads, 0, stream>>>(p, buf, g, n, lr,
                                                       momentum);
}

void fill(float* x, float v, size_t n, cudaStream_t stream) {
  fill_k<<<blocks_for(n), kThreads, 0, stream>>>(x, v, n);
}

}  // namespace dlaunch::workloads::cuda
