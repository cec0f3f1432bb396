#pragma once

// The MLP's element-wise CUDA kernels (kernels.cu, compiled by nvcc), called
// from the CUDA replica (replica.cc, compiled by the C++ compiler). Matrices
// are row-major, rows = samples. Each launches on `stream` and returns
// without waiting; launch errors show at the next CUDA call.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dlaunch::workloads::cuda {

// xb[i] = x[idx[i]] (rows of `dim` floats) and yb[i] = y[idx[i]] for
// i < rows: the batch's samples gathered from the device-resident split.
void gather_rows(const float* x, const uint8_t* y, const uint32_t* idx,
                 int rows, int dim, float* xb, uint8_t* yb,
                 cudaStream_t stream);

// h = max(h + b, 0) for each of `rows` rows of `cols` (b has `cols`).
void bias_relu(float* h, const float* b, int rows, int cols,
               cudaStream_t stream);

// Per row of z (rows x cols, bias b added first): softmax cross-entropy
// against y. z becomes (softmax - onehot(y)) / rows, the gradient of the
// mean loss; *loss_sum gains the mean loss over the rows.
void softmax_xent_grad(float* z, const float* b, const uint8_t* y, int rows,
                       int cols, double* loss_sum, cudaStream_t stream);

// *correct gains the rows of z (+ b) whose arg-max (the first on ties, as
// std::max_element) equals y.
void count_argmax(const float* z, const float* b, const uint8_t* y, int rows,
                  int cols, unsigned long long* correct, cudaStream_t stream);

// dh[i] = 0 where h[i] <= 0 (the ReLU's gradient mask), n elements.
void relu_mask(float* dh, const float* h, size_t n, cudaStream_t stream);

// torch.optim.SGD with momentum (SgdMomentum::step): buf = m * buf + g;
// p -= lr * buf, n elements.
void sgd_update(float* p, float* buf, const float* g, size_t n, float lr,
                float momentum, cudaStream_t stream);

// x[i] = v for n floats.
void fill(float* x, float v, size_t n, cudaStream_t stream);

}  // namespace dlaunch::workloads::cuda
