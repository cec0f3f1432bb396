#include "workloads/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "comm/check.h"

namespace dlaunch::workloads {

Mlp::Mlp(MlpShape shape) : shape_(shape) {
  DLAUNCH_CHECK(shape.in > 0 && shape.hidden > 0 && shape.out > 0,
                "Mlp layer sizes must be positive");
  size_t in = shape.in, h = shape.hidden, out = shape.out;
  size_t off = 0;
  for (auto [name, size] :
       {std::pair<const char*, size_t>{"fc1.weight", h * in},
        {"fc1.bias", h},
        {"fc2.weight", out * h},
        {"fc2.bias", out}}) {
    slices_.push_back({name, off, size});
    off += size;
  }
  params_.assign(off, 0.0f);
}

void Mlp::init(uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto fill = [&](const ParamSlice& s, int fan_in) {
    float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    std::uniform_real_distribution<float> dist(-bound, bound);
    for (size_t i = 0; i < s.size; ++i) params_[s.offset + i] = dist(gen);
  };
  fill(slices_[0], shape_.in);
  fill(slices_[1], shape_.in);
  fill(slices_[2], shape_.hidden);
  fill(slices_[3], shape_.hidden);
}

void Mlp::forward(const float* x, int batch) {
  const int in = shape_.in, h = shape_.hidden, out = shape_.out;
  hidden_.resize(static_cast<size_t>(batch) * h);
  logits_.resize(static_cast<size_t>(batch) * out);
  const float* w1 = &params_[slices_[0].offset];
  const float* b1 = &params_[slices_[1].offset];
  const float* w2 = &params_[slices_[2].offset];
  const float* b2 = &params_[slices_[3].offset];
  // hidden = relu(x * w1^T + b1): broadcast the bias, then accumulate.
  for (int r = 0; r < batch; ++r) std::copy(b1, b1 + h, &hidden_[r * h]);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, h, in, 1.0f, x,
              in, w1, in, 1.0f, hidden_.data(), h);
  for (float& v : hidden_) v = v > 0.0f ? v : 0.0f;
  for (int r = 0; r < batch; ++r) std::copy(b2, b2 + out, &logits_[r * out]);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, h, 1.0f,
              hidden_.data(), h, w2, h, 1.0f, logits_.data(), out);
}

namespace {

// Turns one row of logits into probabilities in place; returns
// -log(p[label]) computed stably from the log-sum-exp.
float softmax_row(float* z, int n, int label) {
  float m = *std::max_element(z, z + n);
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += std::exp(static_cast<double>(z[j] - m));
  float lse = m + static_cast<float>(std::log(sum));
  float loss = lse - z[label];
  for (int j = 0; j < n; ++j) z[j] = std::exp(z[j] - lse);
  return loss;
}

}  // namespace

float Mlp::forward_backward(const float* x, const uint8_t* y, int batch,
                            std::span<float> grad) {
  DLAUNCH_CHECK(grad.size() == params_.size(),
                "gradient buffer size differs from the parameter count");
  DLAUNCH_CHECK(batch > 0, "empty batch");
  const int in = shape_.in, h = shape_.hidden, out = shape_.out;
  forward(x, batch);
  // dlogits = (softmax - onehot) / batch, in place in logits_.
  double loss = 0;
  const float inv = 1.0f / static_cast<float>(batch);
  for (int r = 0; r < batch; ++r) {
    float* z = &logits_[r * out];
    loss += softmax_row(z, out, y[r]);
    z[y[r]] -= 1.0f;
    for (int j = 0; j < out; ++j) z[j] *= inv;
  }
  float* gw1 = &grad[slices_[0].offset];
  float* gb1 = &grad[slices_[1].offset];
  float* gw2 = &grad[slices_[2].offset];
  float* gb2 = &grad[slices_[3].offset];
  const float* w2 = &params_[slices_[2].offset];
  // gw2 = dlogits^T * hidden; gb2 = column sums of dlogits.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, h, batch, 1.0f,
              logits_.data(), out, hidden_.data(), h, 0.0f, gw2, h);
  std::fill(gb2, gb2 + out, 0.0f);
  for (int r = 0; r < batch; ++r) {
    for (int j = 0; j < out; ++j) gb2[j] += logits_[r * out + j];
  }
  // dhidden = dlogits * w2, masked by the ReLU.
  dhidden_.resize(static_cast<size_t>(batch) * h);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, h, out, 1.0f,
              logits_.data(), out, w2, h, 0.0f, dhidden_.data(), h);
  for (size_t i = 0; i < dhidden_.size(); ++i) {
    if (hidden_[i] <= 0.0f) dhidden_[i] = 0.0f;
  }
  // gw1 = dhidden^T * x; gb1 = column sums of dhidden.
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h, in, batch, 1.0f,
              dhidden_.data(), h, x, in, 0.0f, gw1, in);
  std::fill(gb1, gb1 + h, 0.0f);
  for (int r = 0; r < batch; ++r) {
    for (int j = 0; j < h; ++j) gb1[j] += dhidden_[r * h + j];
  }
  return static_cast<float>(loss / batch);
}

int Mlp::count_correct(const float* x, const uint8_t* y, int batch) {
  forward(x, batch);
  const int out = shape_.out;
  int correct = 0;
  for (int r = 0; r < batch; ++r) {
    const float* z = &logits_[r * out];
    if (std::max_element(z, z + out) - z == y[r]) ++correct;
  }
  return correct;
}

float Mlp::loss(const float* x, const uint8_t* y, int batch) {
  forward(x, batch);
  double loss = 0;
  for (int r = 0; r < batch; ++r) {
    loss += softmax_row(&logits_[r * shape_.out], shape_.out, y[r]);
  }
  return static_cast<float>(loss / batch);
}

SgdMomentum::SgdMomentum(size_t n, float lr, float momentum)
    : buf_(n, 0.0f), lr_(lr), momentum_(momentum) {}

void SgdMomentum::step(std::span<float> params, std::span<const float> grad) {
  DLAUNCH_CHECK(params.size() == buf_.size() && grad.size() == buf_.size(),
                "SgdMomentum::step with buffers of another size");
  // Distinct buffers: restrict lets the compiler vectorise the update.
  float* __restrict b = buf_.data();
  float* __restrict p = params.data();
  const float* __restrict g = grad.data();
  const size_t n = buf_.size();
  const float m = momentum_, lr = lr_;
  for (size_t i = 0; i < n; ++i) {
    b[i] = m * b[i] + g[i];
    p[i] -= lr * b[i];
  }
}

}  // namespace dlaunch::workloads
