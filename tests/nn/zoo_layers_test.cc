// Forward values and finite-difference gradients of the model-zoo layers: the DCNv2 cross
// network (full and low rank), the factorization machine term and the wide linear part.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dlrec/nn/cross.h"
#include "dlrec/nn/fm.h"
#include "dlrec/nn/wide.h"
#include "nn/grad_check.h"

namespace dlrec::nn {
namespace {

using testing::dot_loss;
using testing::expect_grad_close;
using testing::numeric_grad;
using testing::random_tensor;

// The layers are smooth (no ReLU): central differences with eps = 1e-2 on a double loss of F32
// values are accurate to ~1e-4 here, and the cross layers' products stay well scaled.
constexpr double kEps = 1e-2, kAtol = 2e-3, kRtol = 2e-3;

// x_{l+1} = x0 * (W_l x_l + b_l) + x_l computed naively from the parameters.
std::vector<double> naive_cross(CrossNet& c, const Tensor& x0) {
  const int64_t B = x0.dim(0), F = c.features(), r = c.low_rank();
  auto params = c.params();
  std::vector<double> x(x0.numel()), a(x0.numel());
  for (int64_t i = 0; i < x0.numel(); ++i) x[i] = a[i] = x0.data<float>()[i];
  size_t p = 0;
  for (int64_t l = 0; l < c.num_layers(); ++l) {
    const float* w = params[p].second->value.data<float>();
    const float* b = params[p + 1].second->value.data<float>();
    const float* v = r > 0 ? params[p + 2].second->value.data<float>() : nullptr;
    p += r > 0 ? 3 : 2;
    std::vector<double> next(x.size());
    for (int64_t s = 0; s < B; ++s) {
      std::vector<double> h(r > 0 ? r : F);
      if (r > 0) {
        for (int64_t k = 0; k < r; ++k) {
          double acc = 0;
          for (int64_t j = 0; j < F; ++j) acc += v[k * F + j] * x[s * F + j];
          h[k] = acc;
        }
      } else {
        for (int64_t j = 0; j < F; ++j) h[j] = x[s * F + j];
      }
      const int64_t in = r > 0 ? r : F;
      for (int64_t o = 0; o < F; ++o) {
        double u = b[o];
        for (int64_t k = 0; k < in; ++k) u += w[o * in + k] * h[k];
        next[s * F + o] = a[s * F + o] * u + x[s * F + o];
      }
    }
    x = next;
  }
  return x;
}

void check_cross(int64_t layers, int64_t rank) {
  const int64_t B = 5, F = 6;
  CrossNet c(F, layers, rank);
  c.init(3);
  // Non-zero biases so that their role in the product is exercised.
  for (auto& p : c.params()) {
    if (p.first.find("bias") != std::string::npos)
      p.second->value.copy_from(random_tensor(p.second->value.shape(), 17, -0.5, 0.5));
  }
  Tensor x0 = random_tensor({B, F}, 4);
  const Tensor& y = c.forward(x0);
  const std::vector<double> ref = naive_cross(c, x0);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.data<float>()[i], ref[i], 1e-4) << i;

  Tensor r = random_tensor({B, F}, 5);
  auto loss = [&] { return dot_loss(c.forward(x0), r); };
  loss();
  Tensor dx = c.backward(r).clone();
  std::vector<Tensor> grads;
  for (auto& p : c.params()) grads.push_back(p.second->grad.clone());
  expect_grad_close(numeric_grad(x0, loss, kEps), dx, kAtol, kRtol, "dx0");
  auto params = c.params();
  for (size_t k = 0; k < params.size(); ++k)
    expect_grad_close(numeric_grad(params[k].second->value, loss, kEps), grads[k], kAtol, kRtol,
                      params[k].first);
}

TEST(CrossNet, FullRankOneLayer) { check_cross(1, 0); }
TEST(CrossNet, FullRankStackOfThree) { check_cross(3, 0); }
TEST(CrossNet, LowRankStackOfThree) { check_cross(3, 2); }

TEST(CrossNet, ParameterNamesAndShapes) {
  CrossNet full(8, 2, 0), low(8, 2, 3);
  auto pf = full.params(), pl = low.params();
  ASSERT_EQ(pf.size(), 4u);
  EXPECT_EQ(pf[0].first, "0.w.weight");
  EXPECT_EQ(pf[0].second->value.shape(), (Shape{8, 8}));
  EXPECT_EQ(pf[3].first, "1.w.bias");
  ASSERT_EQ(pl.size(), 6u);
  EXPECT_EQ(pl[0].second->value.shape(), (Shape{8, 3}));  // U: r -> F
  EXPECT_EQ(pl[2].first, "0.v.weight");
  EXPECT_EQ(pl[2].second->value.shape(), (Shape{3, 8}));  // V: F -> r
}

TEST(CrossNet, InitHasZeroBiasesAndIsDeterministic) {
  CrossNet a(5, 2, 2), b(5, 2, 2);
  a.init(9);
  b.init(9);
  auto pa = a.params(), pb = b.params();
  for (size_t k = 0; k < pa.size(); ++k) {
    EXPECT_EQ(pa[k].second->value.to_vector<float>(), pb[k].second->value.to_vector<float>());
    if (pa[k].first.find("bias") == std::string::npos) continue;
    for (float v : pa[k].second->value.to_vector<float>()) EXPECT_EQ(v, 0.f);
  }
}

TEST(CrossNet, RejectsBadSizes) {
  EXPECT_THROW(CrossNet(4, 0, 0), Error);
  EXPECT_THROW(CrossNet(4, 1, 5), Error);
  CrossNet c(4, 1, 0);
  EXPECT_THROW(c.forward(random_tensor({2, 3}, 1)), Error);
  EXPECT_THROW(CrossNet(4, 1, 0).backward(random_tensor({2, 4}, 1)), Error);
}

TEST(FactorizationMachine, ForwardIsSumOfPairwiseDots) {
  const int64_t B = 3, n = 4, d = 5;
  FactorizationMachine fm(n, d);
  Tensor v = random_tensor({B, n * d}, 8);
  const Tensor& y = fm.forward(v);
  ASSERT_EQ(y.shape(), (Shape{B, 1}));
  const float* x = v.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j)
        for (int64_t k = 0; k < d; ++k)
          s += double(x[b * n * d + i * d + k]) * x[b * n * d + j * d + k];
    EXPECT_NEAR(y.data<float>()[b], s, 1e-5);
  }
}

TEST(FactorizationMachine, GradientsMatchFiniteDifferences) {
  const int64_t B = 4, n = 5, d = 3;
  FactorizationMachine fm(n, d);
  Tensor v = random_tensor({B, n * d}, 12);
  Tensor r = random_tensor({B, 1}, 13);
  auto loss = [&] { return dot_loss(fm.forward(v), r); };
  loss();
  Tensor dv = fm.backward(r).clone();
  expect_grad_close(numeric_grad(v, loss, kEps), dv, kAtol, kRtol, "dv");
}

TEST(FactorizationMachine, RejectsBadInput) {
  EXPECT_THROW(FactorizationMachine(1, 4), Error);
  FactorizationMachine fm(2, 4);
  EXPECT_THROW(fm.forward(random_tensor({2, 7}, 1)), Error);
  EXPECT_THROW(FactorizationMachine(2, 4).backward(random_tensor({2, 1}, 1)), Error);
}

// Two features, one multi-hot with duplicates and an empty bag.
struct WideData {
  std::vector<int64_t> off0 = {0, 1, 2, 3, 4}, idx0 = {0, 2, 2, 1};
  std::vector<int64_t> off1 = {0, 2, 2, 5, 6}, idx1 = {3, 1, 0, 0, 4, 3};
  std::vector<Bags> bags() const {
    return {{off0.data(), idx0.data()}, {off1.data(), idx1.data()}};
  }
};

void check_wide(Pooling pooling) {
  WideLinear w({3, 5}, pooling);
  // Start away from zero so that every term matters.
  w.tables()[0].weight().value.copy_from(random_tensor({3, 1}, 21));
  w.tables()[1].weight().value.copy_from(random_tensor({5, 1}, 22));
  w.bias().value.copy_from(random_tensor({1}, 23));
  WideData data;
  const int64_t B = 4;
  const Tensor& y = w.forward(data.bags(), B, false);
  const float* w0 = w.tables()[0].weight().value.data<float>();
  const float* w1 = w.tables()[1].weight().value.data<float>();
  const float b = w.bias().value.data<float>()[0];
  for (int64_t r = 0; r < B; ++r) {
    double s = b, s1 = 0;
    s += w0[data.idx0[r]];
    const int64_t len = data.off1[r + 1] - data.off1[r];
    for (int64_t p = data.off1[r]; p < data.off1[r + 1]; ++p) s1 += w1[data.idx1[p]];
    if (pooling == Pooling::Mean && len > 0) s1 /= len;
    EXPECT_NEAR(y.data<float>()[r], s + s1, 1e-6) << r;
  }

  Tensor rr = random_tensor({B, 1}, 24);
  auto loss = [&] { return dot_loss(w.forward(data.bags(), B, false), rr); };
  w.forward(data.bags(), B, true);
  w.backward(rr);
  const float db = w.bias().grad.data<float>()[0];
  expect_grad_close(numeric_grad(w.bias().value, loss, kEps), &db, kAtol, kRtol, "db");
  for (int t = 0; t < 2; ++t) {
    // The sparse gradient scattered into a dense one: absent rows must have zero gradient.
    const SparseGrad& g = w.grad(t);
    std::vector<float> dense(w.tables()[t].rows(), 0.f);
    for (int64_t u = 0; u < g.size(); ++u) dense[g.ids[u]] = g.values[u];
    expect_grad_close(numeric_grad(w.tables()[t].weight().value, loss, kEps), dense.data(), kAtol,
                      kRtol, "table " + std::to_string(t));
  }
}

TEST(WideLinear, SumPoolingForwardAndGradients) { check_wide(Pooling::Sum); }
TEST(WideLinear, MeanPoolingForwardAndGradients) { check_wide(Pooling::Mean); }

TEST(WideLinear, StartsAtZero) {
  WideLinear w({4, 4}, Pooling::Sum);
  WideData data;
  data.idx0 = {0, 1, 2, 3};
  data.idx1 = {0, 1, 2, 3, 0, 1};
  for (float v : w.forward(data.bags(), 4, false).to_vector<float>()) EXPECT_EQ(v, 0.f);
  EXPECT_THROW(WideLinear({}, Pooling::Sum), Error);
}

}  // namespace
}  // namespace dlrec::nn
