// Dense and sparse optimizer steps against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "dlrec/nn/optimizer.h"

namespace dlrec::nn {
namespace {

Param make_param(std::vector<float> w, std::vector<float> g) {
  Param p;
  const int64_t n = static_cast<int64_t>(w.size());
  p.value = Tensor::from_vector(w, {n});
  p.grad = Tensor::from_vector(g, {n});
  return p;
}

TEST(Optimizer, DenseSgd) {
  Optimizer opt(OptimizerKind::SGD);
  Param p = make_param({1.f, -2.f, 0.5f}, {0.5f, 1.f, -4.f});
  opt.init_state(p);
  EXPECT_FALSE(p.state.defined());
  opt.step(p, 0.1f);
  auto w = p.value.to_vector<float>();
  EXPECT_FLOAT_EQ(w[0], 0.95f);
  EXPECT_FLOAT_EQ(w[1], -2.1f);
  EXPECT_FLOAT_EQ(w[2], 0.9f);
}

TEST(Optimizer, DenseAdagradTwoSteps) {
  const float eps = 1e-8f, init = 0.1f, lr = 0.5f;
  Optimizer opt(OptimizerKind::Adagrad, eps, init);
  Param p = make_param({1.f, -2.f}, {0.5f, -3.f});
  opt.init_state(p);
  ASSERT_TRUE(p.state.defined());
  EXPECT_EQ(p.state.to_vector<float>(), (std::vector<float>{0.1f, 0.1f}));
  double w0 = 1, w1 = -2, a0 = init, a1 = init;
  for (int step = 0; step < 2; ++step) {
    opt.step(p, lr);
    a0 += 0.25;
    a1 += 9.0;
    w0 -= lr * 0.5 / (std::sqrt(a0) + eps);
    w1 -= lr * -3.0 / (std::sqrt(a1) + eps);
  }
  auto w = p.value.to_vector<float>();
  auto a = p.state.to_vector<float>();
  EXPECT_NEAR(w[0], w0, 1e-6);
  EXPECT_NEAR(w[1], w1, 1e-6);
  EXPECT_NEAR(a[0], a0, 1e-6);
  EXPECT_NEAR(a[1], a1, 1e-5);
}

Param make_table() {
  Param t;
  std::vector<float> w(4 * 2);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * i;
  t.value = Tensor::from_vector(w, {4, 2});
  return t;
}

SparseGrad make_grad() {
  SparseGrad g;
  g.dim = 2;
  g.ids = {2, 0};
  g.values = {1.f, -1.f, 0.5f, 2.f};
  return g;
}

TEST(Optimizer, SparseSgdTouchesOnlyBatchRows) {
  Optimizer opt(OptimizerKind::SGD);
  Param t = make_table();
  const auto before = t.value.to_vector<float>();
  opt.step_sparse(t, make_grad(), 0.1f);
  auto w = t.value.to_vector<float>();
  EXPECT_FLOAT_EQ(w[4], before[4] - 0.1f * 1.f);   // row 2
  EXPECT_FLOAT_EQ(w[5], before[5] + 0.1f * 1.f);
  EXPECT_FLOAT_EQ(w[0], before[0] - 0.1f * 0.5f);  // row 0
  EXPECT_FLOAT_EQ(w[1], before[1] - 0.1f * 2.f);
  for (int i : {2, 3, 6, 7}) EXPECT_EQ(w[i], before[i]) << "untouched row changed at " << i;
}

TEST(Optimizer, SparseAdagradTouchesOnlyBatchRows) {
  const float init = 0.5f, lr = 0.2f;
  Optimizer opt(OptimizerKind::Adagrad, 0.f, init);
  Param t = make_table();
  opt.init_state(t);
  const auto before = t.value.to_vector<float>();
  opt.step_sparse(t, make_grad(), lr);
  auto w = t.value.to_vector<float>();
  auto a = t.state.to_vector<float>();
  EXPECT_NEAR(a[4], init + 1.f, 1e-7);
  EXPECT_NEAR(a[1], init + 4.f, 1e-7);
  EXPECT_NEAR(w[4], before[4] - lr * 1.f / std::sqrt(init + 1.f), 1e-7);
  EXPECT_NEAR(w[1], before[1] - lr * 2.f / std::sqrt(init + 4.f), 1e-7);
  for (int i : {2, 3, 6, 7}) {
    EXPECT_EQ(w[i], before[i]);
    EXPECT_EQ(a[i], init);
  }
}

TEST(Optimizer, Errors) {
  EXPECT_THROW(parse_optimizer("adamw"), Error);
  Optimizer ada(OptimizerKind::Adagrad);
  Param p = make_param({1.f}, {1.f});
  EXPECT_THROW(ada.step(p, 0.1f), Error);  // state missing
  Param t = make_table();
  SparseGrad g = make_grad();
  g.ids[0] = 9;
  EXPECT_THROW(Optimizer(OptimizerKind::SGD).step_sparse(t, g, 0.1f), Error);
}

}  // namespace
}  // namespace dlrec::nn
