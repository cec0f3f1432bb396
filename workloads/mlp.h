#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dlaunch::workloads {

// Layer sizes of the two-layer perceptron; default 784-128-10.
struct MlpShape {
  int in = 784;      // input features (pixels); default 784
  int hidden = 128;  // hidden ReLU units; default 128
  int out = 10;      // classes; default 10
};

// One named parameter tensor inside the flat buffer.
struct ParamSlice {
  std::string name;   // "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"
  size_t offset = 0;  // first float in the flat buffer
  size_t size = 0;    // floats
};

// A 784-128-10 perceptron (Linear, ReLU, Linear) with softmax cross-entropy,
// its parameters in ONE flat float buffer laid out as torch's
// named_parameters(): fc1.weight [hidden x in], fc1.bias, fc2.weight
// [out x hidden], fc2.bias. Gradients use the same layout, so a whole
// gradient is one all-reduce. The matrix work is OpenBLAS sgemm. Owns scratch
// buffers: one thread at a time.
class Mlp {
 public:
  explicit Mlp(MlpShape shape = {});

  const MlpShape& shape() const { return shape_; }
  size_t num_params() const { return params_.size(); }
  std::span<float> params() { return params_; }
  std::span<const float> params() const { return params_; }
  // The four tensors in buffer order.
  const std::vector<ParamSlice>& slices() const { return slices_; }

  // torch.nn.Linear's default initialisation: weights and biases uniform in
  // +-1/sqrt(fan_in), drawn from a generator seeded with `seed`.
  void init(uint64_t seed);

  // Forward and backward over `batch` samples: `x` is batch x in
  // (row-major), `y` the labels. Writes d(mean loss)/d(params) into `grad`
  // (num_params() floats) and returns the mean cross-entropy loss.
  float forward_backward(const float* x, const uint8_t* y, int batch,
                         std::span<float> grad);

  // Number of samples among `batch` whose arg-max prediction equals `y`.
  int count_correct(const float* x, const uint8_t* y, int batch);

  // Mean cross-entropy loss over `batch` samples (no gradient).
  float loss(const float* x, const uint8_t* y, int batch);

 private:
  // Computes hidden_ (post-ReLU) and logits_ for `batch` rows of `x`.
  void forward(const float* x, int batch);

  MlpShape shape_;
  std::vector<float> params_;
  std::vector<ParamSlice> slices_;
  std::vector<float> hidden_;   // batch x hidden
  std::vector<float> logits_;   // batch x out; softmax/gradient in place
  std::vector<float> dhidden_;  // batch x hidden
};

// torch.optim.SGD with momentum and no dampening/weight decay/nesterov over a
// flat buffer: buf = momentum * buf + grad; param -= lr * buf (torch's first
// step sets buf = grad, which is the same as starting from zeros).
class SgdMomentum {
 public:
  SgdMomentum(size_t n, float lr, float momentum);

  void step(std::span<float> params, std::span<const float> grad);

  std::span<float> buffer() { return buf_; }
  std::span<const float> buffer() const { return buf_; }
  float lr() const { return lr_; }
  float momentum() const { return momentum_; }

 private:
  std::vector<float> buf_;
  float lr_;
  float momentum_;
};

}  // namespace dlaunch::workloads
