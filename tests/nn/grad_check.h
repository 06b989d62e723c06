// Central finite differences for gradient checks of F32 CPU layers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/nn/rng.h"

namespace dlrec::testing {

// A tensor of the shape filled with uniform values in [lo, hi).
inline Tensor random_tensor(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1) {
  nn::Rng rng(seed);
  std::vector<float> v(shape_numel(shape));
  for (auto& x : v) x = static_cast<float>(rng.uniform(lo, hi));
  return Tensor::from_vector(v, shape);
}

// sum_i y_i * r_i in double: a scalar loss whose gradient w.r.t. y is r.
inline double dot_loss(const Tensor& y, const Tensor& r) {
  const float* a = y.data<float>();
  const float* b = r.data<float>();
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// dL/dt by central differences, perturbing t's elements in place (restored afterwards).
inline std::vector<double> numeric_grad(const Tensor& t, const std::function<double()>& loss,
                                        double eps) {
  float* p = t.data<float>();
  std::vector<double> g(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float saved = p[i];
    p[i] = static_cast<float>(saved + eps);
    const double up = loss();
    p[i] = static_cast<float>(saved - eps);
    const double down = loss();
    p[i] = saved;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

// |numeric - analytic| <= atol + rtol * |numeric| for every element.
inline void expect_grad_close(const std::vector<double>& numeric, const float* analytic,
                              double atol, double rtol, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    const double tol = atol + rtol * std::fabs(numeric[i]);
    if (std::fabs(numeric[i] - analytic[i]) > tol && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: numeric " << numeric[i] << " analytic "
                    << analytic[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << numeric.size() << " elements differ";
}

inline void expect_grad_close(const std::vector<double>& numeric, const Tensor& analytic,
                              double atol, double rtol, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(numeric.size()), analytic.numel()) << what;
  expect_grad_close(numeric, analytic.data<float>(), atol, rtol, what);
}

}  // namespace dlrec::testing
