#pragma once

// The MLP's forward and backward passes as column-major BLAS products and
// element-wise steps, written once over an `Ops` type: the CUDA replica's
// (cuBLAS and kernels.cu, replica.cc) and a plain host one in the unit
// tests, which checks these calls against Mlp::forward_backward without a
// GPU. No CUDA here.
//
// Ops provides, for row-major matrices given as pointers:
//   gemm(ta, tb, m, n, k, A, lda, B, ldb, C, ldc)   C = op(A) op(B), BLAS
//       column-major (C is m x n, ldc), beta 0
//   bias_relu(h, b, rows, cols)                       h = max(h + b, 0)
//   column_sums(a, rows, cols, out)                   out = sum of a's rows
//   relu_mask(dh, h, n)                               dh = 0 where h <= 0

#include <vector>

#include "workloads/mlp.h"

namespace dlaunch::workloads::cuda {

// The four tensors of a flat buffer in Mlp's layout (parameters or their
// gradient).
template <class T>
struct MlpTensors {
  T* w1;  // hidden x in
  T* b1;  // hidden
  T* w2;  // out x hidden
  T* b2;  // out
};

template <class T>
MlpTensors<T> tensors(T* flat, const std::vector<ParamSlice>& s) {
  return {flat + s[0].offset, flat + s[1].offset, flat + s[2].offset,
          flat + s[3].offset};
}

// hidden = relu(x w1^T + b1) and logits = hidden w2^T, without b2 (the
// step that reads the logits adds it). A row-major matrix is its transpose
// in column-major terms, so each product is computed as its transpose:
// hidden^T = w1 x^T, logits^T = w2 hidden^T.
template <class Ops>
void forward(Ops& ops, const MlpShape& s, const MlpTensors<const float>& p,
             const float* x, int b, float* hidden, float* logits) {
  ops.gemm(true, false, s.hidden, b, s.in, p.w1, s.in, x, s.in, hidden,
           s.hidden);
  ops.bias_relu(hidden, p.b1, b, s.hidden);
  ops.gemm(true, false, s.out, b, s.hidden, p.w2, s.hidden, hidden, s.hidden,
           logits, s.out);
}

// The gradient `g` from dlogits (b x out, the loss's gradient w.r.t. the
// logits), the forward's `hidden` and input `x`; `dhidden` (b x hidden) is
// scratch. In column-major terms: gw2^T = hidden^T dlogits,
// dhidden^T = w2^T dlogits^T, gw1^T = x^T dhidden.
template <class Ops>
void backward(Ops& ops, const MlpShape& s, const MlpTensors<const float>& p,
              const float* x, int b, const float* hidden, const float* dlogits,
              float* dhidden, const MlpTensors<float>& g) {
  ops.gemm(false, true, s.hidden, s.out, b, hidden, s.hidden, dlogits, s.out,
           g.w2, s.hidden);
  ops.column_sums(dlogits, b, s.out, g.b2);
  ops.gemm(false, false, s.hidden, b, s.out, p.w2, s.hidden, dlogits, s.out,
           dhidden, s.hidden);
  ops.relu_mask(dhidden, hidden, static_cast<size_t>(b) * s.hidden);
  ops.gemm(false, true, s.in, s.hidden, b, x, s.in, dhidden, s.hidden, g.w1,
           s.in);
  ops.column_sums(dhidden, b, s.hidden, g.b1);
}

}  // namespace dlaunch::workloads::cuda
