// Forward values and finite-difference gradient checks of Linear, ReLU, MLP, interactions, loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/interaction.h"
#include "dlrec/nn/linear.h"
#include "dlrec/nn/loss.h"
#include "dlrec/nn/mlp.h"
#include "dlrec/nn/relu.h"
#include "nn/grad_check.h"

namespace dlrec::nn {
namespace {

using testing::dot_loss;
using testing::expect_grad_close;
using testing::numeric_grad;
using testing::random_tensor;

// F32 forward, double loss: rounding noise of the loss is ~1e-7 relative, so with eps = 1e-2 on
// piecewise-linear layers the differences are accurate to ~1e-4.
constexpr double kEps = 1e-2, kAtol = 2e-3, kRtol = 1e-3;

TEST(Linear, ForwardMatchesNaive) {
  Linear l(5, 3);
  l.init(7);
  Tensor x = random_tensor({4, 5}, 1);
  const Tensor& y = l.forward(x);
  ASSERT_EQ(y.shape(), (Shape{4, 3}));
  const float* w = l.weight().value.data<float>();
  const float* b = l.bias().value.data<float>();
  for (int r = 0; r < 4; ++r)
    for (int o = 0; o < 3; ++o) {
      double s = b[o];
      for (int i = 0; i < 5; ++i) s += double(x.data<float>()[r * 5 + i]) * w[o * 5 + i];
      EXPECT_NEAR(y.data<float>()[r * 3 + o], s, 1e-5);
    }
}

void check_linear_grads(Activation act) {
  const int64_t B = 6, in = 7, out = 5;
  Linear l(in, out, act);
  l.init(11);
  Tensor x = random_tensor({B, in}, 2);
  Tensor r = random_tensor({B, out}, 3);
  auto loss = [&] { return dot_loss(l.forward(x), r); };
  loss();
  Tensor dx = l.backward(r).clone();
  Tensor dw = l.weight().grad.clone(), db = l.bias().grad.clone();
  // With the ReLU a smaller step keeps the pre-activations on one side of the kink.
  const double eps = act == Activation::ReLU ? 1e-3 : kEps;
  expect_grad_close(numeric_grad(x, loss, eps), dx, kAtol, kRtol, "dx");
  expect_grad_close(numeric_grad(l.weight().value, loss, eps), dw, kAtol, kRtol, "dW");
  expect_grad_close(numeric_grad(l.bias().value, loss, eps), db, kAtol, kRtol, "db");
}

// OpenBLAS is loaded at run time with one thread asked for, so that it never starts its
// load-time worker pool (dlrec/nn/linear.h): after a GEMM it runs on one thread, and no thread of
// the process was created by loading it (run alone, the test sees the load itself).
TEST(Linear, OpenBlasRunsOnOneThreadWithoutAWorkerPool) {
  auto tasks = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      ++n;
    return n;
  };
  const int before = tasks();
  nn::use_single_threaded_blas();
  EXPECT_EQ(nn::blas_threads(), 1);
  EXPECT_EQ(tasks(), before);
  const char* env = std::getenv("OPENBLAS_NUM_THREADS");
  ASSERT_NE(env, nullptr);
  EXPECT_STREQ(env, "1");
}

TEST(Linear, GradientsMatchFiniteDifferences) { check_linear_grads(Activation::None); }
TEST(Linear, ReluGradientsMatchFiniteDifferences) { check_linear_grads(Activation::ReLU); }

TEST(Linear, BackwardWithoutDxStillGivesParamGrads) {
  Linear a(4, 3), b(4, 3);
  a.init(5);
  b.init(5);
  Tensor x = random_tensor({8, 4}, 9), r = random_tensor({8, 3}, 10);
  a.forward(x);
  b.forward(x);
  EXPECT_TRUE(a.backward(r, true).defined());
  EXPECT_FALSE(b.backward(r, false).defined());
  EXPECT_EQ(a.weight().grad.to_vector<float>(), b.weight().grad.to_vector<float>());
  EXPECT_EQ(a.bias().grad.to_vector<float>(), b.bias().grad.to_vector<float>());
}

TEST(Linear, RejectsWrongShapes) {
  Linear l(4, 3);
  EXPECT_THROW(l.forward(random_tensor({2, 5}, 1)), Error);
  EXPECT_THROW(l.backward(random_tensor({2, 3}, 1)), Error);  // no forward yet
  l.forward(random_tensor({2, 4}, 1));
  EXPECT_THROW(l.backward(random_tensor({3, 3}, 1)), Error);
}

TEST(Linear, InitIsDeterministicAndScaled) {
  Linear a(300, 200), b(300, 200), c(300, 200);
  set_num_threads(1);
  a.init(42);
  set_num_threads(3);
  b.init(42);
  c.init(43);
  set_num_threads(0);
  EXPECT_EQ(a.weight().value.to_vector<float>(), b.weight().value.to_vector<float>());
  EXPECT_EQ(a.bias().value.to_vector<float>(), b.bias().value.to_vector<float>());
  EXPECT_NE(a.weight().value.to_vector<float>(), c.weight().value.to_vector<float>());
  double s = 0, s2 = 0;
  auto w = a.weight().value.to_vector<float>();
  for (float v : w) s += v, s2 += double(v) * v;
  const double mean = s / w.size(), sd = std::sqrt(s2 / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.003);
  EXPECT_NEAR(sd, std::sqrt(2.0 / 500), 0.002);
}

TEST(ReLU, ForwardAndGradient) {
  // Inputs kept away from the kink so that finite differences are exact.
  Tensor x = random_tensor({3, 8}, 4, 0.1, 1.0);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); i += 2) p[i] = -p[i];
  ReLU relu;
  const Tensor& y = relu.forward(x);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.data<float>()[i], std::max(p[i], 0.f));
  Tensor r = random_tensor({3, 8}, 5);
  auto loss = [&] { return dot_loss(relu.forward(x), r); };
  loss();
  Tensor dx = relu.backward(r).clone();
  expect_grad_close(numeric_grad(x, loss, 1e-3), dx, 1e-3, kRtol, "relu dx");
}

void check_mlp(bool relu_last) {
  const int64_t B = 5;
  MLP m(4, {6, 5, 3}, relu_last);
  m.init(21);
  ASSERT_EQ(m.out_features(), 3);
  EXPECT_EQ(m.layers()[0].activation(), Activation::ReLU);
  EXPECT_EQ(m.layers()[2].activation(), relu_last ? Activation::ReLU : Activation::None);
  Tensor x = random_tensor({B, 4}, 6);
  Tensor r = random_tensor({B, 3}, 7);
  auto loss = [&] { return dot_loss(m.forward(x), r); };
  loss();
  Tensor dx = m.backward(r).clone();
  // Smaller steps: a ReLU crossing its kink inside a hidden layer would spoil the difference.
  const double eps = 2e-3, atol = 3e-3;
  expect_grad_close(numeric_grad(x, loss, eps), dx, atol, 1e-2, "mlp dx");
  for (size_t k = 0; k < m.layers().size(); ++k) {
    Tensor dw = m.layers()[k].weight().grad.clone(), db = m.layers()[k].bias().grad.clone();
    expect_grad_close(numeric_grad(m.layers()[k].weight().value, loss, eps), dw, atol, 1e-2,
                      "mlp layer " + std::to_string(k) + " dW");
    expect_grad_close(numeric_grad(m.layers()[k].bias().value, loss, eps), db, atol, 1e-2,
                      "mlp layer " + std::to_string(k) + " db");
  }
}

TEST(MLP, GradientsTopStyle) { check_mlp(false); }
TEST(MLP, GradientsBottomStyle) { check_mlp(true); }

TEST(MLP, EmptyIsIdentity) {
  MLP m(3, {}, true);
  Tensor x = random_tensor({2, 3}, 1);
  EXPECT_EQ(m.forward(x).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(m.out_features(), 3);
}

TEST(DotInteraction, ForwardMatchesNaive) {
  const int64_t B = 3, T = 4, d = 5, n = T + 1;
  DotInteraction dot(T, d);
  EXPECT_EQ(dot.out_features(), d + n * (n - 1) / 2);
  Tensor xd = random_tensor({B, d}, 1), xe = random_tensor({B, T, d}, 2);
  const Tensor& out = dot.forward(xd, xe);
  ASSERT_EQ(out.shape(), (Shape{B, dot.out_features()}));
  for (int64_t b = 0; b < B; ++b) {
    auto z = [&](int64_t i, int64_t k) {
      return i == 0 ? xd.data<float>()[b * d + k] : xe.data<float>()[(b * T + i - 1) * d + k];
    };
    const float* o = out.data<float>() + b * dot.out_features();
    for (int64_t k = 0; k < d; ++k) EXPECT_EQ(o[k], z(0, k));
    int64_t c = d;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        double s = 0;
        for (int64_t k = 0; k < d; ++k) s += double(z(i, k)) * z(j, k);
        EXPECT_NEAR(o[c++], s, 1e-5) << "pair " << i << "," << j;
      }
  }
}

// The forward (AVX-512 where the CPU has it) gives the scalar k-ordered sums bit for bit: each
// pair summed over k in order, every product and sum rounded (no FMA), for table counts that
// fill one, two and three 16-wide vectors, odd dims and tails of the row blocks.
TEST(DotInteraction, ForwardIsTheOrderedSumBitForBit) {
  for (auto shape : {std::tuple<int64_t, int64_t, int64_t>{5, 4, 5},
                     {33, 26, 128},
                     {7, 15, 16},
                     {3, 16, 7},
                     {9, 40, 13},
                     {2, 1, 3}}) {
    const auto [B, T, d] = shape;
    const int64_t n = T + 1, tables = T, dim = d;  // plain locals: lambdas may capture them
    DotInteraction dot(T, d);
    Tensor xd = random_tensor({B, d}, 3 + T), xe = random_tensor({B, T, d}, 4 + d);
    const Tensor& out = dot.forward(xd, xe);
    for (int64_t b = 0; b < B; ++b) {
      auto z = [&](int64_t i, int64_t k) {
        return i == 0 ? xd.data<float>()[b * dim + k]
                      : xe.data<float>()[(b * tables + i - 1) * dim + k];
      };
      const float* o = out.data<float>() + b * dot.out_features() + d;
      for (int64_t i = 1; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) {
          float s = 0.f;
          for (int64_t k = 0; k < d; ++k) {
            volatile float p = z(i, k) * z(j, k);  // rounded on its own, as the layer's
            s += p;
          }
          ASSERT_EQ(o[i * (i - 1) / 2 + j], s) << "T=" << T << " d=" << d << " pair " << i << ","
                                               << j;
        }
    }
  }
}

void check_interaction_grads(Interaction& it, int64_t B, int64_t dd, int64_t T, int64_t d) {
  Tensor xd = random_tensor({B, dd}, 31), xe = random_tensor({B, T, d}, 32);
  Tensor r = random_tensor({B, it.out_features()}, 33);
  auto loss = [&] { return dot_loss(it.forward(xd, xe), r); };
  loss();
  it.backward(r);
  Tensor gd = it.grad_dense().clone(), ge = it.grad_emb().clone();
  ASSERT_EQ(ge.shape(), (Shape{B, T, d}));
  expect_grad_close(numeric_grad(xd, loss, kEps), gd, kAtol, kRtol, "d_dense");
  expect_grad_close(numeric_grad(xe, loss, kEps), ge, kAtol, kRtol, "d_emb");
}

TEST(DotInteraction, GradientsMatchFiniteDifferences) {
  DotInteraction dot(3, 4);
  check_interaction_grads(dot, 5, 4, 3, 4);
}

TEST(DotInteraction, NoTablesIsDensePassThrough) {
  DotInteraction dot(0, 3);
  EXPECT_EQ(dot.out_features(), 3);
  check_interaction_grads(dot, 2, 3, 0, 3);
}

TEST(CatInteraction, ForwardAndGradients) {
  CatInteraction cat(3, 2, 4);
  EXPECT_EQ(cat.out_features(), 11);
  Tensor xd = random_tensor({2, 3}, 1), xe = random_tensor({2, 2, 4}, 2);
  const Tensor& out = cat.forward(xd, xe);
  EXPECT_EQ(out.data<float>()[11 + 2], xd.data<float>()[3 + 2]);
  EXPECT_EQ(out.data<float>()[11 + 3 + 5], xe.data<float>()[8 + 5]);
  check_interaction_grads(cat, 4, 3, 2, 4);
}

TEST(Interaction, FactoryChecksDims) {
  EXPECT_THROW(make_interaction("dot", 8, 3, 4), Error);
  EXPECT_THROW(make_interaction("mul", 4, 3, 4), Error);
  EXPECT_EQ(make_interaction("cat", 8, 3, 4)->out_features(), 20);
}

TEST(Loss, BceMatchesFormulaAndIsStable) {
  std::vector<float> z = {0.f, 2.f, -3.f, 100.f, -100.f, 0.5f};
  std::vector<float> y = {1.f, 0.f, 0.f, 0.f, 0.f, 1.f};
  std::vector<float> g(z.size());
  const double L = bce_with_logits(z.data(), y.data(), z.size(), g.data());
  double ref = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    double p = 1 / (1 + std::exp(-double(z[i])));
    double li = (z[i] == 100.f)
                    ? 100.0
                    : (z[i] == -100.f ? std::log1p(std::exp(-100.0))
                                      : -(y[i] * std::log(p) + (1 - y[i]) * std::log(1 - p)));
    ref += li;
    EXPECT_NEAR(g[i], (p - y[i]) / z.size(), 1e-7);
    EXPECT_TRUE(std::isfinite(g[i]));
  }
  EXPECT_NEAR(L, ref / z.size(), 1e-9);
}

TEST(Loss, BceGradientMatchesFiniteDifferences) {
  Tensor z = random_tensor({7}, 3, -4, 4);
  std::vector<float> y = {1, 0, 1, 1, 0, 0, 1};
  Tensor dz;
  bce_with_logits(z, y.data(), &dz);
  auto loss = [&] { return bce_with_logits(z, y.data(), nullptr); };
  expect_grad_close(numeric_grad(z, loss, 1e-3), dz, 1e-5, 1e-3, "dlogits");
}

}  // namespace
}  // namespace dlrec::nn
