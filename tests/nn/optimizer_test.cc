// Dense and sparse optimizer steps against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "dlrec/core/config.h"
#include "dlrec/core/thread_pool.h"
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


// ---- Options-based optimizers ----------------------------------------------------------

OptimizerOptions kind_opts(OptimizerKind k) {
  OptimizerOptions o;
  o.kind = k;
  return o;
}

Param make_param2(std::vector<float> w, std::vector<float> g, Shape shape) {
  Param p;
  p.value = Tensor::from_vector(w, shape);
  p.grad = Tensor::from_vector(g, shape);
  return p;
}

void set_grad(Param& p, const std::vector<float>& g) { p.grad = Tensor::from_vector(g, p.value.shape()); }

TEST(Optimizer, SgdMomentumThreeSteps) {
  for (bool nesterov : {false, true}) {
    OptimizerOptions o = kind_opts(OptimizerKind::SGD);
    o.momentum = 0.9f;
    o.nesterov = nesterov;
    Optimizer opt(o);
    Param p = make_param({1.f, -1.f}, {0.f, 0.f});
    opt.init_state(p);
    ASSERT_TRUE(p.state.defined());
    EXPECT_EQ(opt.state_suffix(), ".momentum");
    const std::vector<std::vector<float>> grads = {{0.5f, -1.f}, {0.25f, 2.f}, {-1.f, 0.f}};
    double w[2] = {1, -1}, b[2] = {0, 0};
    for (const auto& g : grads) {
      set_grad(p, g);
      opt.step(p, 0.1f);
      for (int i = 0; i < 2; ++i) {
        b[i] = 0.9 * b[i] + g[i];
        w[i] -= 0.1 * (nesterov ? g[i] + 0.9 * b[i] : b[i]);
      }
    }
    auto v = p.value.to_vector<float>();
    auto st = p.state.to_vector<float>();
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(v[i], w[i], 1e-6) << "nesterov " << nesterov;
      EXPECT_NEAR(st[i], b[i], 1e-6);
    }
  }
}

TEST(Optimizer, RowWiseAdagradDenseAndSparse) {
  OptimizerOptions o = kind_opts(OptimizerKind::RowWiseAdagrad);
  o.initial_accumulator = 0.1f;
  o.adagrad_eps = 1e-6f;
  Optimizer opt(o);
  // Dense: a [2, 2] parameter has 2 rows, one accumulator each.
  Param p = make_param2({1.f, 2.f, 3.f, 4.f}, {1.f, 3.f, 0.f, 2.f}, {2, 2});
  opt.init_state(p);
  ASSERT_EQ(p.state.shape(), (Shape{2}));
  EXPECT_EQ(opt.state_suffix(), ".rowwise_adagrad");
  double a[2] = {0.1, 0.1}, w[4] = {1, 2, 3, 4};
  const double g[4] = {1, 3, 0, 2};
  for (int s = 0; s < 2; ++s) {
    opt.step(p, 0.5f);
    for (int r = 0; r < 2; ++r) {
      a[r] += (g[2 * r] * g[2 * r] + g[2 * r + 1] * g[2 * r + 1]) / 2;
      for (int k = 0; k < 2; ++k) w[2 * r + k] -= 0.5 * g[2 * r + k] / (std::sqrt(a[r]) + 1e-6);
    }
  }
  auto v = p.value.to_vector<float>();
  auto st = p.state.to_vector<float>();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(v[i], w[i], 1e-5);
  EXPECT_NEAR(st[0], 0.1 + 2 * 5.0, 1e-5);
  EXPECT_NEAR(st[1], 0.1 + 2 * 2.0, 1e-5);
  // Sparse: only rows 2 and 0 of the table, one accumulator per row.
  Param t = make_table();
  opt.init_state(t);
  ASSERT_EQ(t.state.shape(), (Shape{4}));
  const auto before = t.value.to_vector<float>();
  opt.step_sparse(t, make_grad(), 0.2f);
  auto tw = t.value.to_vector<float>();
  auto ta = t.state.to_vector<float>();
  EXPECT_NEAR(ta[2], 0.1 + (1.0 + 1.0) / 2, 1e-6);
  EXPECT_NEAR(ta[0], 0.1 + (0.25 + 4.0) / 2, 1e-6);
  EXPECT_EQ(ta[1], 0.1f);
  EXPECT_EQ(ta[3], 0.1f);
  EXPECT_NEAR(tw[5], before[5] + 0.2 * 1.0 / (std::sqrt(1.1) + 1e-6), 1e-6);
  EXPECT_NEAR(tw[0], before[0] - 0.2 * 0.5 / (std::sqrt(0.1 + 2.125) + 1e-6), 1e-6);
  for (int i : {2, 3, 6, 7}) EXPECT_EQ(tw[i], before[i]);
}

// Adam in double, as PyTorch writes it.
struct AdamRef {
  double b1, b2, eps, wd;
  std::vector<double> w, m, v;
  int t = 0;
  void step(const std::vector<double>& g, double lr) {
    ++t;
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] -= lr * wd * w[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      w[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
};

TEST(Optimizer, AdamDenseThreeStepsWithDecoupledWeightDecay) {
  for (float wd : {0.f, 0.1f}) {
    OptimizerOptions o = kind_opts(OptimizerKind::Adam);
    o.beta1 = 0.8f;
    o.beta2 = 0.95f;
    o.adam_eps = 1e-6f;
    o.weight_decay = wd;
    Optimizer opt(o);
    Param p = make_param2({0.5f, -0.25f, 2.f}, {0, 0, 0}, {3});
    opt.init_state(p);
    ASSERT_EQ(p.state.shape(), (Shape{3, 3}));  // 3 rows of one value: m, v, t
    EXPECT_EQ(opt.state_suffix(), ".adam");
    AdamRef ref{0.8, 0.95, 1e-6, wd, {0.5, -0.25, 2.0}, {0, 0, 0}, {0, 0, 0}};
    const std::vector<std::vector<double>> grads = {{0.1, -2, 0}, {0.3, 1, 1e-3}, {-0.2, 0.5, 4}};
    for (const auto& g : grads) {
      set_grad(p, {static_cast<float>(g[0]), static_cast<float>(g[1]), static_cast<float>(g[2])});
      opt.step(p, 0.01f);
      ref.step(g, 0.01);
    }
    auto v = p.value.to_vector<float>();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(v[i], ref.w[i], 2e-6) << "wd " << wd << " i " << i;
    auto st = p.state.to_vector<float>();
    for (int r = 0; r < 3; ++r) {
      EXPECT_NEAR(st[r * 3 + 0], ref.m[r], 1e-6);
      EXPECT_NEAR(st[r * 3 + 1], ref.v[r], 1e-6);
      EXPECT_EQ(st[r * 3 + 2], 3.f);
    }
  }
}

TEST(Optimizer, LazyAdamUpdatesOnlyBatchRowsWithTheirOwnStepCount) {
  OptimizerOptions o = kind_opts(OptimizerKind::Adam);
  o.weight_decay = 0.5f;  // must not touch embedding rows
  Optimizer opt(o);
  Param t = make_table();  // [4, 2]
  opt.init_state(t);
  ASSERT_EQ(t.state.shape(), (Shape{4, 5}));
  const auto w0 = t.value.to_vector<float>();
  SparseGrad g;
  g.dim = 2;
  g.ids = {1};
  g.values = {0.5f, -2.f};
  for (int s = 0; s < 3; ++s) opt.step_sparse(t, g, 0.01f);  // row 1 three times
  SparseGrad g3;
  g3.dim = 2;
  g3.ids = {3};
  g3.values = {-4.f, 0.25f};
  opt.step_sparse(t, g3, 0.01f);  // row 3 first seen at the 4th step
  auto w = t.value.to_vector<float>();
  auto st = t.state.to_vector<float>();
  EXPECT_EQ(st[1 * 5 + 4], 3.f);  // row 1's t
  EXPECT_EQ(st[3 * 5 + 4], 1.f);  // row 3's t: its own count
  // Rows 0 and 2 never seen: weights and state untouched.
  for (int r : {0, 2}) {
    for (int k = 0; k < 2; ++k) EXPECT_EQ(w[r * 2 + k], w0[r * 2 + k]);
    for (int k = 0; k < 5; ++k) EXPECT_EQ(st[r * 5 + k], 0.f);
  }
  // Row 3's first update is a fresh Adam's first update: lr * g / (|g| + eps), no decay.
  EXPECT_NEAR(w[6], w0[6] + 0.01, 1e-7);
  EXPECT_NEAR(w[7], w0[7] - 0.01, 1e-7);
  // Row 1 after three equal gradients: m-hat = g, v-hat = g^2, so three steps of lr * sign(g).
  EXPECT_NEAR(w[2], w0[2] - 0.03, 1e-6);
  EXPECT_NEAR(w[3], w0[3] + 0.03, 1e-6);
}

// FTRL-Proximal per coordinate, in double.
struct FtrlRef {
  double beta, l1, l2;
  double w, z = 0, n = 0;
  void step(double g, double alpha) {
    const double sigma = (std::sqrt(n + g * g) - std::sqrt(n)) / alpha;
    z += g - sigma * w;
    n += g * g;
    w = std::fabs(z) <= l1 ? 0.0
                           : -(z - (z < 0 ? -1 : 1) * l1) / ((beta + std::sqrt(n)) / alpha + l2);
  }
};

TEST(Optimizer, FtrlMatchesReferenceAndL1GivesExactZeros) {
  OptimizerOptions o = kind_opts(OptimizerKind::FTRL);
  o.ftrl_beta = 1.f;
  o.ftrl_l1 = 0.05f;
  o.ftrl_l2 = 0.1f;
  Optimizer opt(o);
  Param p = make_param2({0.2f, -0.1f, 0.f}, {0, 0, 0}, {3});
  opt.init_state(p);
  ASSERT_EQ(p.state.shape(), (Shape{3, 2}));
  EXPECT_EQ(opt.state_suffix(), ".ftrl");
  std::vector<FtrlRef> ref = {{1, 0.05, 0.1, 0.2}, {1, 0.05, 0.1, -0.1}, {1, 0.05, 0.1, 0.0}};
  // Coordinate 0: large gradients (stays non-zero); 1: tiny ones (L1 zeroes it); 2: mixed.
  const std::vector<std::vector<double>> grads = {{1.0, 0.01, -0.5}, {0.8, -0.02, 0.3}, {1.2, 0.01, 0.9}};
  for (const auto& g : grads) {
    set_grad(p, {static_cast<float>(g[0]), static_cast<float>(g[1]), static_cast<float>(g[2])});
    opt.step(p, 0.5f);
    for (int i = 0; i < 3; ++i) ref[i].step(g[i], 0.5);
  }
  auto w = p.value.to_vector<float>();
  auto st = p.state.to_vector<float>();
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(w[i], ref[i].w, 1e-6) << i;
    EXPECT_NEAR(st[i * 2], ref[i].z, 1e-5) << i;
    EXPECT_NEAR(st[i * 2 + 1], ref[i].n, 1e-5) << i;
  }
  EXPECT_NE(w[0], 0.f);
  EXPECT_EQ(w[1], 0.f);  // exactly zero, not just small
  EXPECT_EQ(ref[1].w, 0.0);
  // A strong L1 zeroes every weight of a table's batch rows (sparse step), others keep theirs.
  o.ftrl_l1 = 100.f;
  Optimizer strong(o);
  Param t = make_table();
  strong.init_state(t);
  const auto before = t.value.to_vector<float>();
  strong.step_sparse(t, make_grad(), 0.1f);
  auto tw = t.value.to_vector<float>();
  for (int i : {0, 1, 4, 5}) EXPECT_EQ(tw[i], 0.f);
  for (int i : {2, 3, 6, 7}) EXPECT_EQ(tw[i], before[i]);
}

TEST(Optimizer, ClipByValueDenseAndSparse) {
  OptimizerOptions o = kind_opts(OptimizerKind::SGD);
  o.clip_value = 0.5f;
  Optimizer opt(o);
  Param p = make_param({0.f, 0.f, 0.f}, {2.f, -3.f, 0.25f});
  opt.step(p, 1.f);
  EXPECT_EQ(p.value.to_vector<float>(), (std::vector<float>{-0.5f, 0.5f, -0.25f}));
  EXPECT_EQ(p.grad.to_vector<float>(), (std::vector<float>{2.f, -3.f, 0.25f}));  // untouched
  Param t = make_table();
  const auto before = t.value.to_vector<float>();
  opt.step_sparse(t, make_grad(), 1.f);  // rows 2: (1, -1), 0: (0.5, 2)
  auto w = t.value.to_vector<float>();
  EXPECT_FLOAT_EQ(w[4], before[4] - 0.5f);
  EXPECT_FLOAT_EQ(w[5], before[5] + 0.5f);
  EXPECT_FLOAT_EQ(w[0], before[0] - 0.5f);
  EXPECT_FLOAT_EQ(w[1], before[1] - 0.5f);
}

TEST(Optimizer, ClipByGlobalNormOverDenseParams) {
  OptimizerOptions o = kind_opts(OptimizerKind::SGD);
  o.clip_norm = 1.f;
  Optimizer opt(o);
  Param a = make_param({0.f, 0.f}, {3.f, 0.f});
  Param b = make_param({1.f}, {-4.f});  // global norm 5
  std::vector<Param*> ps = {&a, &b};
  EXPECT_DOUBLE_EQ(Optimizer::grad_norm(ps), 5.0);
  EXPECT_DOUBLE_EQ(opt.step_dense(ps, 1.f), 5.0);
  auto wa = a.value.to_vector<float>(), wb = b.value.to_vector<float>();
  EXPECT_FLOAT_EQ(wa[0], -0.6f);
  EXPECT_FLOAT_EQ(wa[1], 0.f);
  EXPECT_FLOAT_EQ(wb[0], 1.8f);
  // Below the threshold: no scaling.
  Param c = make_param({0.f}, {0.5f});
  std::vector<Param*> pc = {&c};
  opt.step_dense(pc, 1.f);
  EXPECT_FLOAT_EQ(c.value.to_vector<float>()[0], -0.5f);
}

TEST(Optimizer, WeightDecayOnDenseStepsOnlyL2ForSgd) {
  OptimizerOptions o = kind_opts(OptimizerKind::SGD);
  o.weight_decay = 0.1f;
  Optimizer opt(o);
  Param p = make_param({2.f, -1.f}, {0.5f, 0.f});
  opt.step(p, 0.5f);
  auto w = p.value.to_vector<float>();
  EXPECT_FLOAT_EQ(w[0], 2.f - 0.5f * (0.5f + 0.1f * 2.f));
  EXPECT_FLOAT_EQ(w[1], -1.f - 0.5f * (0.1f * -1.f));
  // Sparse (embedding) steps ignore weight decay, for every kind.
  for (auto k : {OptimizerKind::SGD, OptimizerKind::Adagrad, OptimizerKind::RowWiseAdagrad,
                 OptimizerKind::Adam, OptimizerKind::FTRL}) {
    OptimizerOptions a = kind_opts(k), b = kind_opts(k);
    a.weight_decay = 0.3f;
    Optimizer with(a), without(b);
    Param t1 = make_table(), t2 = make_table();
    with.init_state(t1);
    without.init_state(t2);
    for (int s = 0; s < 3; ++s) {
      with.step_sparse(t1, make_grad(), 0.1f);
      without.step_sparse(t2, make_grad(), 0.1f);
    }
    EXPECT_EQ(t1.value.to_vector<float>(), t2.value.to_vector<float>()) << optimizer_name(k);
  }
}

TEST(Optimizer, StepRowMatchesSparseStep) {
  for (auto k : {OptimizerKind::SGD, OptimizerKind::Adagrad, OptimizerKind::RowWiseAdagrad,
                 OptimizerKind::Adam, OptimizerKind::FTRL}) {
    OptimizerOptions o = kind_opts(k);
    o.momentum = k == OptimizerKind::SGD ? 0.5f : 0.f;
    Optimizer opt(o);
    Param t = make_table();
    opt.init_state(t);
    const int64_t S = opt.state_row_size(2);
    std::vector<float> w = {0.4f, 0.5f}, st(S);
    opt.init_state_row(st.data(), 2);
    for (int s = 0; s < 3; ++s) {
      opt.step_sparse(t, make_grad(), 0.1f);
      opt.step_row(w.data(), st.data(), make_grad().values.data(), 2, 0.1f);  // row 2's grad
    }
    auto tw = t.value.to_vector<float>();
    EXPECT_EQ(tw[4], w[0]) << optimizer_name(k);
    EXPECT_EQ(tw[5], w[1]) << optimizer_name(k);
  }
}

TEST(Optimizer, ResultsDoNotDependOnThreadCount) {
  auto run = [](int threads) {
    set_num_threads(threads);
    OptimizerOptions o = kind_opts(OptimizerKind::Adam);
    o.clip_norm = 0.5f;
    o.weight_decay = 0.01f;
    Optimizer opt(o);
    std::vector<float> w(300000), g(300000);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = std::sin(0.001f * i);
      g[i] = std::cos(0.0007f * i);
    }
    Param p = make_param2(w, g, {1000, 300});
    opt.init_state(p);
    std::vector<Param*> ps = {&p};
    opt.step_dense(ps, 0.01f);
    opt.step_dense(ps, 0.01f);
    return p.value.to_vector<float>();
  };
  const auto one = run(1), many = run(4);
  set_num_threads(0);
  EXPECT_EQ(one, many);
}

TEST(Optimizer, OptionErrorsNameTheField) {
  auto msg = [](OptimizerOptions o) {
    try {
      Optimizer opt(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  OptimizerOptions o;
  o.beta1 = -0.1f;
  EXPECT_NE(msg(o).find("beta1"), std::string::npos) << msg(o);
  o = {};
  o.beta2 = 1.f;
  EXPECT_NE(msg(o).find("beta2"), std::string::npos) << msg(o);
  o = {};
  o.momentum = 1.f;
  EXPECT_NE(msg(o).find("momentum"), std::string::npos) << msg(o);
  o = {};
  o.nesterov = true;
  EXPECT_NE(msg(o).find("nesterov"), std::string::npos) << msg(o);
  o = {};
  o.kind = OptimizerKind::FTRL;
  o.ftrl_beta = 0.f;
  EXPECT_NE(msg(o).find("ftrl_beta"), std::string::npos) << msg(o);
  o = {};
  o.clip_norm = -1.f;
  EXPECT_NE(msg(o).find("clip_norm"), std::string::npos) << msg(o);
  EXPECT_EQ(parse_optimizer("rowwise_adagrad"), OptimizerKind::RowWiseAdagrad);
  EXPECT_STREQ(optimizer_name(parse_optimizer("ftrl")), "ftrl");
  // State size mismatch (init_state for another kind) is an error.
  Optimizer adam(kind_opts(OptimizerKind::Adam));
  Optimizer ada(OptimizerKind::Adagrad);
  Param p = make_param({1.f, 2.f}, {1.f, 1.f});
  ada.init_state(p);
  EXPECT_THROW(adam.step(p, 0.1f), Error);
}


// Driven by tests/python/test_optimizers_torch.py (PyTorch equivalence): with DLREC_OPT_CASE
// naming a JSON case {"options": {...}, "lr": x, "shape": [r, c], "w": [...], "grads": [[...]...]}
// it runs the dense steps (step_dense: clipping included) and writes {"w": [...]} to
// DLREC_OPT_OUT. Skipped otherwise.
TEST(OptimizerTorch, StepsFromFile) {
  const char* in = std::getenv("DLREC_OPT_CASE");
  const char* out = std::getenv("DLREC_OPT_OUT");
  if (!in || !out) GTEST_SKIP() << "DLREC_OPT_CASE/DLREC_OPT_OUT not set (run by the pytest)";
  std::ifstream f(in);
  ASSERT_TRUE(f) << in;
  const json c = json::parse(f);
  const json& jo = c.at("options");
  OptimizerOptions o;
  o.kind = parse_optimizer(jo.at("type").get<std::string>());
  o.momentum = jo.value("momentum", 0.f);
  o.nesterov = jo.value("nesterov", false);
  o.adagrad_eps = jo.value("adagrad_eps", 1e-8f);
  o.initial_accumulator = jo.value("adagrad_init", 0.f);
  o.beta1 = jo.value("beta1", 0.9f);
  o.beta2 = jo.value("beta2", 0.999f);
  o.adam_eps = jo.value("adam_eps", 1e-8f);
  o.weight_decay = jo.value("weight_decay", 0.f);
  o.clip_norm = jo.value("clip_norm", 0.f);
  o.clip_value = jo.value("clip_value", 0.f);
  Optimizer opt(o);
  Shape shape = c.at("shape").get<Shape>();
  Param p;
  p.value = Tensor::from_vector(c.at("w").get<std::vector<float>>(), shape);
  opt.init_state(p);
  std::vector<Param*> ps = {&p};
  for (const auto& g : c.at("grads")) {
    p.grad = Tensor::from_vector(g.get<std::vector<float>>(), shape);
    opt.step_dense(ps, c.at("lr").get<float>());
  }
  std::ofstream o_(out);
  o_ << json{{"w", p.value.to_vector<float>()}}.dump();
}

}  // namespace
}  // namespace dlrec::nn
