// The CUDA replica's passes (workloads/cuda/mlp_passes.h: which BLAS
// products, transposed how, with which leading dimensions) run here over a
// plain column-major host BLAS and must give Mlp::forward_backward's
// gradient: the GPU path's arithmetic checked without a GPU.
#include "workloads/cuda/mlp_passes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace dlaunch::workloads::cuda {
namespace {

// mlp_passes.h's Ops as the BLAS reference defines them (column-major,
// alpha 1, beta 0), on host memory.
struct HostOps {
  void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
            const float* b, int ldb, float* c, int ldc) const {
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double sum = 0;
        for (int l = 0; l < k; ++l) {
          float av = ta ? a[l + i * lda] : a[i + l * lda];
          float bv = tb ? b[j + l * ldb] : b[l + j * ldb];
          sum += static_cast<double>(av) * bv;
        }
        c[i + j * ldc] = static_cast<float>(sum);
      }
    }
  }
  void bias_relu(float* h, const float* b, int rows, int cols) const {
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < cols; ++j) {
        float& v = h[r * cols + j];
        v = std::max(v + b[j], 0.0f);
      }
    }
  }
  void column_sums(const float* a, int rows, int cols, float* out) const {
    for (int j = 0; j < cols; ++j) {
      out[j] = 0;
      for (int r = 0; r < rows; ++r) out[j] += a[r * cols + j];
    }
  }
  void relu_mask(float* dh, const float* h, size_t n) const {
    for (size_t i = 0; i < n; ++i) {
      if (h[i] <= 0.0f) dh[i] = 0.0f;
    }
  }
};

// What kernels.cu's softmax_xent_grad does: add b2, softmax, then
// (p - onehot) / rows.
void softmax_grad(float* z, const float* b2, const uint8_t* y, int rows,
                  int cols) {
  for (int r = 0; r < rows; ++r) {
    float* row = z + r * cols;
    for (int j = 0; j < cols; ++j) row[j] += b2[j];
    float m = *std::max_element(row, row + cols);
    double sum = 0;
    for (int j = 0; j < cols; ++j) sum += std::exp(double{row[j]} - m);
    float lse = m + static_cast<float>(std::log(sum));
    for (int j = 0; j < cols; ++j) {
      row[j] = (std::exp(row[j] - lse) - (j == y[r] ? 1.0f : 0.0f)) / rows;
    }
  }
}

void expect_same_gradient(MlpShape s, int b, uint64_t seed) {
  Mlp m(s);
  m.init(seed);
  std::mt19937_64 g(seed + 1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(b) * s.in);
  for (float& v : x) v = nd(g);
  std::vector<uint8_t> y(b);
  for (uint8_t& v : y) v = static_cast<uint8_t>(g() % s.out);
  std::vector<float> want(m.num_params());
  m.forward_backward(x.data(), y.data(), b, want);

  HostOps ops;
  const auto p = tensors<const float>(m.params().data(), m.slices());
  std::vector<float> hidden(static_cast<size_t>(b) * s.hidden);
  std::vector<float> logits(static_cast<size_t>(b) * s.out);
  std::vector<float> dhidden(hidden.size());
  std::vector<float> got(m.num_params(), -1.0f);  // every float written
  forward(ops, s, p, x.data(), b, hidden.data(), logits.data());
  softmax_grad(logits.data(), p.b2, y.data(), b, s.out);
  backward(ops, s, p, x.data(), b, hidden.data(), logits.data(), dhidden.data(),
           tensors<float>(got.data(), m.slices()));
  for (const ParamSlice& sl : m.slices()) {
    for (size_t i = sl.offset; i < sl.offset + sl.size; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-4 * std::abs(want[i]))
          << sl.name << "[" << i - sl.offset << "], batch " << b;
    }
  }
}

TEST(MlpPassesTest, GradientMatchesTheCpuMlp) {
  expect_same_gradient(MlpShape{7, 5, 3}, 4, 1);
  expect_same_gradient(MlpShape{7, 5, 3}, 1, 2);
  expect_same_gradient(MlpShape{3, 9, 4}, 11, 3);
  expect_same_gradient(MlpShape{}, 16, 4);  // 784-128-10
}

}  // namespace
}  // namespace dlaunch::workloads::cuda
