#include "workloads/mlp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace dlaunch::workloads {
namespace {

// Random inputs and labels for a small model.
struct Batch {
  std::vector<float> x;
  std::vector<uint8_t> y;
};
Batch random_batch(const MlpShape& s, int n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Batch b;
  b.x.resize(static_cast<size_t>(n) * s.in);
  for (float& v : b.x) v = nd(g);
  for (int i = 0; i < n; ++i) b.y.push_back(g() % s.out);
  return b;
}

TEST(MlpTest, LayoutMatchesTorchNamedParameters) {
  Mlp m;
  ASSERT_EQ(m.slices().size(), 4u);
  EXPECT_EQ(m.slices()[0].name, "fc1.weight");
  EXPECT_EQ(m.slices()[0].size, 128u * 784u);
  EXPECT_EQ(m.slices()[3].name, "fc2.bias");
  EXPECT_EQ(m.slices()[3].offset + m.slices()[3].size, m.num_params());
  EXPECT_EQ(m.num_params(), 101770u);
}

TEST(MlpTest, InitIsSeededAndBounded) {
  Mlp a, b, c;
  a.init(7);
  b.init(7);
  c.init(8);
  EXPECT_TRUE(
      std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  EXPECT_FALSE(
      std::equal(a.params().begin(), a.params().end(), c.params().begin()));
  const float bound1 = 1.0f / std::sqrt(784.0f);
  for (size_t i = 0; i < a.slices()[1].offset + a.slices()[1].size; ++i) {
    ASSERT_LE(std::abs(a.params()[i]), bound1);
  }
}

// Analytic gradient against central differences of the loss on
// a small model, for every parameter.
TEST(MlpTest, GradientMatchesFiniteDifferences) {
  MlpShape s{6, 5, 3};
  Mlp m(s);
  m.init(3);
  Batch b = random_batch(s, 4, 11);
  std::vector<float> grad(m.num_params());
  m.forward_backward(b.x.data(), b.y.data(), 4, grad);
  const float eps = 1e-2f;
  int checked = 0;
  for (size_t i = 0; i < m.num_params(); ++i) {
    float keep = m.params()[i];
    m.params()[i] = keep + eps;
    double up = m.loss(b.x.data(), b.y.data(), 4);
    m.params()[i] = keep - eps;
    double down = m.loss(b.x.data(), b.y.data(), 4);
    m.params()[i] = keep;
    double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(grad[i], numeric, 2e-3 + 2e-2 * std::abs(numeric))
        << "parameter " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 6 * 5 + 5 + 5 * 3 + 3);
}

TEST(MlpTest, LossMatchesForwardBackward) {
  MlpShape s{10, 8, 4};
  Mlp m(s);
  m.init(1);
  Batch b = random_batch(s, 16, 2);
  std::vector<float> grad(m.num_params());
  float l1 = m.forward_backward(b.x.data(), b.y.data(), 16, grad);
  EXPECT_FLOAT_EQ(l1, m.loss(b.x.data(), b.y.data(), 16));
  // An untrained model is close to uniform: loss near log(classes).
  EXPECT_NEAR(l1, std::log(4.0f), 1.0f);
}

// On a learnable task (label = arg-max of the first `out` inputs), SGD with
// momentum drives the loss down and the accuracy up.
TEST(MlpTest, SgdDecreasesLoss) {
  MlpShape s{20, 16, 4};
  Mlp m(s);
  m.init(5);
  Batch b = random_batch(s, 256, 9);
  for (int i = 0; i < 256; ++i) {
    const float* row = &b.x[i * s.in];
    b.y[i] = static_cast<uint8_t>(std::max_element(row, row + s.out) - row);
  }
  SgdMomentum opt(m.num_params(), 0.1f, 0.5f);
  std::vector<float> grad(m.num_params());
  float first = m.loss(b.x.data(), b.y.data(), 256);
  int correct0 = m.count_correct(b.x.data(), b.y.data(), 256);
  for (int step = 0; step < 200; ++step) {
    int off = (step % 8) * 32;
    m.forward_backward(&b.x[off * s.in], &b.y[off], 32, grad);
    opt.step(m.params(), grad);
  }
  float last = m.loss(b.x.data(), b.y.data(), 256);
  EXPECT_LT(last, 0.5f * first);
  EXPECT_GT(m.count_correct(b.x.data(), b.y.data(), 256), correct0 + 64);
}

TEST(SgdMomentumTest, TorchSemantics) {
  // torch.optim.SGD([p], lr=0.1, momentum=0.5) with grads 1 then 2 from
  // p=0: buf=1, p=-0.1; buf=0.5*1+2=2.5, p=-0.1-0.25=-0.35.
  SgdMomentum opt(1, 0.1f, 0.5f);
  std::vector<float> p = {0.0f};
  std::vector<float> g = {1.0f};
  opt.step(p, g);
  EXPECT_FLOAT_EQ(p[0], -0.1f);
  g[0] = 2.0f;
  opt.step(p, g);
  EXPECT_FLOAT_EQ(opt.buffer()[0], 2.5f);
  EXPECT_FLOAT_EQ(p[0], -0.35f);
}

}  // namespace
}  // namespace dlaunch::workloads
