#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

#include "workloads/sgd.h"

namespace dlaunch::workloads::testing {

// A small learnable set, the same for a given seed: class c has its pixels
// around a class-specific pattern (every tenth pixel from c) plus noise.
inline TrainData synthetic(size_t n, size_t dim, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  TrainData t;
  t.n = n;
  t.dim = dim;
  t.x.resize(n * dim);
  t.y.resize(n);
  for (size_t i = 0; i < n; ++i) {
    t.y[i] = static_cast<uint8_t>(g() % 10);
    for (size_t j = 0; j < dim; ++j) {
      float center = (j % 10 == t.y[i]) ? 1.0f : 0.0f;
      t.x[i * dim + j] = center + noise(g);
    }
  }
  return t;
}

}  // namespace dlaunch::workloads::testing
