// arch "dlrm" end to end (on the CPU the preset graph of the layer engine, src/model/presets.cc):
// gradients against finite differences of the loss, learning, determinism, parameter naming (the
// names checkpoints and exports of the former DLRM class hold) and errors.
#include <gtest/gtest.h>

#include "model/test_batches.h"

#include <cmath>
#include <map>
#include <set>

#include "dlrec/core/thread_pool.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "dlrec/nn/rng.h"

namespace dlrec::model {
namespace {

using testing::make_batch;
using testing::make_layout;

double eval_loss(Model& m, const io::Batch& b) {
  Tensor z = m.forward(b, false);
  return nn::bce_with_logits(z, b.labels.data(), nullptr);
}

// One SGD step with lr = 1 reveals the gradient: g = w_before - w_after. The parameters are
// restored afterwards.
std::map<std::string, std::vector<float>> gradients_via_sgd(Model& m, const io::Batch& b) {
  std::map<std::string, Tensor> before;
  for (auto& [name, t] : m.parameters()) before[name] = t.clone();
  Tensor z = m.forward(b, true);
  Tensor dz;
  nn::bce_with_logits(z, b.labels.data(), &dz);
  m.backward_and_update(dz, 1.0);
  std::map<std::string, std::vector<float>> grads;
  for (auto& [name, t] : m.parameters()) {
    auto w0 = before[name].to_vector<float>(), w1 = t.to_vector<float>();
    std::vector<float> g(w0.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = w0[i] - w1[i];
    grads[name] = g;
    t.copy_from(before[name]);
  }
  return grads;
}

void check_model_gradients(const std::string& interaction, const std::string& pooling) {
  ModelConfig mc;
  mc.embedding_dim = 3;
  mc.bottom_mlp = {5, 3};
  mc.top_mlp = {4, 1};
  mc.interaction = interaction;
  mc.pooling = pooling;
  OptimizerConfig oc;
  oc.type = "sgd";
  oc.lr = 1.0;
  const auto layout = make_layout(4, {6, 5, 7});
  auto m = build_model(mc, oc, layout, Device::cpu(), 17);
  const io::Batch b = make_batch(layout, 8, 3, /*multi_hot=*/true);
  auto grads = gradients_via_sgd(*m, b);

  // F32 model, double loss; eps 3e-3 keeps ReLU kinks mostly out of reach while the rounding
  // noise of the loss (~1e-7) stays ~3e-5 in the difference quotient.
  const double eps = 3e-3, atol = 2e-4, rtol = 2e-2;
  std::set<int64_t> touched[3];
  for (int t = 0; t < 3; ++t)
    touched[t] = std::set<int64_t>(b.cat_indices[t].begin(), b.cat_indices[t].end());
  int checked = 0;
  for (auto& [name, t] : m->parameters()) {
    float* p = t.data<float>();
    const auto& g = grads[name];
    const bool is_emb = name.rfind("emb.", 0) == 0;
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; i += is_emb ? 1 : std::max<int64_t>(1, n / 5)) {
      if (is_emb) {
        const int table = name[4] - '0';
        const int64_t row = i / t.dim(1);
        if (!touched[table].count(row)) {
          EXPECT_EQ(g[i], 0.f) << name << " row " << row << " is not in the batch";
          continue;
        }
      }
      const float saved = p[i];
      p[i] = static_cast<float>(saved + eps);
      const double up = eval_loss(*m, b);
      p[i] = static_cast<float>(saved - eps);
      const double down = eval_loss(*m, b);
      p[i] = saved;
      const double num = (up - down) / (2 * eps);
      EXPECT_NEAR(g[i], num, atol + rtol * std::fabs(num)) << name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(Dlrm, GradientsDotSum) { check_model_gradients("dot", "sum"); }
TEST(Dlrm, GradientsDotMean) { check_model_gradients("dot", "mean"); }
TEST(Dlrm, GradientsCatSum) { check_model_gradients("cat", "sum"); }

TEST(Dlrm, ParameterNamesShapesAndSharedStorage) {
  ModelConfig mc;  // dim 16, bottom 64-16, top 64-1, dot
  OptimizerConfig oc;
  oc.type = "adagrad";
  const auto layout = make_layout(13, {10, 20});
  auto m = build_model(mc, oc, layout, Device::cpu(), 1);
  auto params = m->parameters();
  std::vector<std::string> names;
  for (auto& p : params) names.push_back(p.first);
  EXPECT_EQ(names, (std::vector<std::string>{"bottom.0.weight", "bottom.0.bias", "bottom.1.weight",
                                             "bottom.1.bias", "top.0.weight", "top.0.bias",
                                             "top.1.weight", "top.1.bias", "emb.0.weight",
                                             "emb.1.weight"}));
  EXPECT_EQ(params[0].second.shape(), (Shape{64, 13}));
  EXPECT_EQ(params[4].second.shape(), (Shape{64, 16 + 3}));  // d + n(n-1)/2, n = 3
  EXPECT_EQ(params[8].second.shape(), (Shape{10, 16}));
  EXPECT_EQ(params[9].second.shape(), (Shape{20, 16}));
  auto state = m->optimizer_state();
  ASSERT_EQ(state.size(), params.size());
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].first, params[i].first + ".adagrad");
    EXPECT_EQ(state[i].second.shape(), params[i].second.shape());
  }
  // Writing through parameters() changes the model: the top bias shifts every logit.
  const io::Batch b = make_batch(layout, 5, 2, false);
  auto z0 = m->forward(b, false).to_vector<float>();
  Tensor bias = params[7].second;
  bias.copy_from(Tensor::from_vector<float>({bias.to_vector<float>()[0] + 1.f}, {1}));
  auto z1 = m->forward(b, false).to_vector<float>();
  for (size_t i = 0; i < z0.size(); ++i) EXPECT_NEAR(z1[i], z0[i] + 1.f, 1e-5);

  oc.type = "sgd";
  EXPECT_TRUE(build_model(mc, oc, layout, Device::cpu(), 1)->optimizer_state().empty());
}

TEST(Dlrm, SameSeedSameParametersDifferentSeedDifferent) {
  ModelConfig mc;
  OptimizerConfig oc;
  const auto layout = make_layout(13, {100, 7, 3000});
  auto a = build_model(mc, oc, layout, Device::cpu(), 5);
  set_num_threads(1);
  auto b = build_model(mc, oc, layout, Device::cpu(), 5);
  set_num_threads(0);
  auto c = build_model(mc, oc, layout, Device::cpu(), 6);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
    EXPECT_NE(pa[i].second.to_vector<float>(), pc[i].second.to_vector<float>()) << pa[i].first;
  }
}

TEST(Dlrm, ForwardAndTrainingIdenticalOnAnyThreadCount) {
  ModelConfig mc;
  mc.bottom_mlp = {128, 64, 16};
  mc.top_mlp = {128, 64, 1};
  OptimizerConfig oc;
  oc.type = "adagrad";
  oc.lr = 0.05;
  std::vector<int64_t> cards;
  for (int t = 0; t < 26; ++t) cards.push_back(50 + 37 * t);
  const auto layout = make_layout(13, cards);
  const io::Batch b = make_batch(layout, 700, 9, true);
  std::vector<std::vector<float>> logits, after;
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    auto m = build_model(mc, oc, layout, Device::cpu(), 3);
    logits.push_back(m->forward(b, false).to_vector<float>());
    for (int step = 0; step < 2; ++step) {
      Tensor z = m->forward(b, true), dz;
      nn::bce_with_logits(z, b.labels.data(), &dz);
      m->backward_and_update(dz, 1.0);
    }
    after.push_back(m->forward(b, false).to_vector<float>());
  }
  set_num_threads(0);
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(logits[0], logits[2]);
  // Training too: every sum (GEMM chunks over the batch, bias and embedding gradients) runs in
  // an order fixed by the batch, not by the thread count.
  EXPECT_EQ(after[0], after[1]);
  EXPECT_EQ(after[0], after[2]);
}

// A planted problem: the label's log-odds are 2 x0 - 1.5 x1 plus a per-id effect in feature 0.
io::Batch planted_batch(const io::ShardLayout& l, int64_t rows, uint64_t seed) {
  io::Batch b = make_batch(l, rows, seed, false);
  nn::Rng rng(seed * 7919 + 1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = b.dense.data() + r * l.num_dense;
    const int64_t id = b.cat_indices[0][r];
    const double logit = 2.0 * x[0] - 1.5 * x[1] + (id % 3 == 0 ? 1.5 : -1.0);
    b.labels[r] = rng.uniform() < 1 / (1 + std::exp(-logit)) ? 1.f : 0.f;
  }
  return b;
}

void check_learns(const std::string& opt, double lr) {
  ModelConfig mc;
  mc.embedding_dim = 8;
  mc.bottom_mlp = {16, 8};
  mc.top_mlp = {16, 1};
  OptimizerConfig oc;
  oc.type = opt;
  oc.lr = lr;
  const auto layout = make_layout(4, {30, 10});
  auto m = build_model(mc, oc, layout, Device::cpu(), 11);
  const io::Batch held_out = planted_batch(layout, 4000, 999);
  const double before = eval_loss(*m, held_out);
  for (int step = 0; step < 400; ++step) {
    const io::Batch b = planted_batch(layout, 128, step + 1);
    Tensor z = m->forward(b, true), dz;
    nn::bce_with_logits(z, b.labels.data(), &dz);
    m->backward_and_update(dz, 1.0);
  }
  const double after = eval_loss(*m, held_out);
  EXPECT_LT(after, before - 0.08) << opt << ": loss " << before << " -> " << after;
  EXPECT_LT(after, 0.62) << opt;
}

TEST(Dlrm, TrainingLowersTheLossSgd) { check_learns("sgd", 0.5); }
TEST(Dlrm, TrainingLowersTheLossAdagrad) { check_learns("adagrad", 0.05); }

std::string build_error(const ModelConfig& mc, const io::ShardLayout& l,
                        Device d = Device::cpu()) {
  try {
    build_model(mc, OptimizerConfig{}, l, d, 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Dlrm, BuildErrors) {
  ModelConfig mc;
  const auto layout = make_layout(13, {10});
  // Without a usable GPU (or without CUDA support in the build) a clear error names CUDA.
  if (cuda::device_count() == 0) {
    EXPECT_NE(build_error(mc, layout, Device::cuda(0)).find("CUDA"), std::string::npos);
  }
  ModelConfig bad = mc;
  bad.arch = "wdl";
  EXPECT_NE(build_error(bad, layout).find("unknown model arch 'wdl'"), std::string::npos);
  bad = mc;
  bad.bottom_mlp = {64, 8};
  EXPECT_NE(build_error(bad, layout).find("embedding_dim"), std::string::npos);
  EXPECT_NE(build_error(mc, make_layout(0, {10})).find("dense features"), std::string::npos);
  bad = mc;
  bad.interaction = "cat";
  EXPECT_EQ(build_error(bad, make_layout(0, {10, 4})), "");  // cat works without dense inputs
  EXPECT_EQ(build_error(bad, make_layout(13, {10, 4})), "");
}

TEST(Dlrm, CatWithoutDenseFeaturesTrains) {
  ModelConfig mc;
  mc.interaction = "cat";
  const auto layout = make_layout(0, {10, 4});
  auto m = build_model(mc, OptimizerConfig{}, layout, Device::cpu(), 1);
  const io::Batch b = make_batch(layout, 16, 1, true);
  Tensor z = m->forward(b, true), dz;
  EXPECT_EQ(z.shape(), (Shape{16}));
  nn::bce_with_logits(z, b.labels.data(), &dz);
  m->backward_and_update(dz, 1.0);
}

TEST(Dlrm, BatchAndCallOrderErrors) {
  ModelConfig mc;
  const auto layout = make_layout(13, {10, 20});
  auto m = build_model(mc, OptimizerConfig{}, layout, Device::cpu(), 1);
  io::Batch b = make_batch(layout, 4, 1, false);
  EXPECT_THROW(m->backward_and_update(Tensor::zeros({4}, DType::F32)), Error);  // no forward
  m->forward(b, false);
  EXPECT_THROW(m->backward_and_update(Tensor::zeros({4}, DType::F32)), Error);  // not training
  m->forward(b, true);
  EXPECT_THROW(m->backward_and_update(Tensor::zeros({5}, DType::F32)), Error);  // wrong size
  io::Batch wrong = make_batch(make_layout(12, {10, 20}), 4, 1, false);
  EXPECT_THROW(m->forward(wrong, false), Error);
  io::Batch bad_id = b;
  bad_id.cat_indices[1][0] = 20;
  EXPECT_THROW(m->forward(bad_id, false), Error);
  io::Batch empty = make_batch(layout, 0, 1, false);
  EXPECT_EQ(m->forward(empty, false).numel(), 0);
}

}  // namespace
}  // namespace dlrec::model
