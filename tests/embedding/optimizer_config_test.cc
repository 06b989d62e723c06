// The optimizer section of the run config (keys, errors naming them, the embedding override,
// the schedules), the optimizer factory, and checkpoint/resume of the CPU DLRM with every
// optimizer kind: a model resumed from a checkpoint ends bit-identical to an uninterrupted one.
// (These live in the embedding test program because it links the model and train layers.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "dlrec/model/model.h"
#include "dlrec/model/optimizer_factory.h"
#include "dlrec/nn/loss.h"
#include "dlrec/train/trainer.h"
#include "model/test_batches.h"

namespace dlrec::model {
namespace {

std::string error_of(const std::string& text) {
  try {
    RunConfig::from_json(json::parse(text));
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(OptimizerConfig, ParsesEveryKeyAndRoundTrips) {
  const RunConfig c = RunConfig::from_json(json::parse(R"({"optimizer": {
      "type": "adam", "lr": 0.001, "beta1": 0.8, "beta2": 0.99, "adam_eps": 1e-7,
      "weight_decay": 0.01, "clip_norm": 1.5, "clip_value": 10,
      "schedule": {"warmup_steps": 10, "decay_every": 100, "gamma": 0.5},
      "embedding": {"type": "rowwise_adagrad", "lr": 0.05, "adagrad_init": 0.01}}})"));
  const OptimizerConfig& o = c.optimizer;
  EXPECT_EQ(o.type, "adam");
  EXPECT_DOUBLE_EQ(o.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.beta2, 0.99);
  EXPECT_DOUBLE_EQ(o.adam_eps, 1e-7);
  EXPECT_DOUBLE_EQ(o.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(o.clip_norm, 1.5);
  EXPECT_DOUBLE_EQ(o.clip_value, 10);
  EXPECT_EQ(o.schedule.decay_every, 100);
  EXPECT_DOUBLE_EQ(o.schedule.gamma, 0.5);
  ASSERT_EQ(o.embedding.size(), 1u);
  const OptimizerConfig e = o.embedding_config();
  EXPECT_EQ(e.type, "rowwise_adagrad");
  EXPECT_DOUBLE_EQ(e.lr, 0.05);
  EXPECT_DOUBLE_EQ(e.adagrad_init, 0.01);
  EXPECT_DOUBLE_EQ(e.clip_value, 10);  // inherited from the section
  EXPECT_DOUBLE_EQ(o.embedding_lr_value(), 0.05);
  // The factory: Adam with decoupled decay for the dense layers, row-wise Adagrad without
  // decay or global-norm clipping for the tables.
  nn::Optimizer dense = make_dense_optimizer(o), emb = make_embedding_optimizer(o);
  EXPECT_EQ(dense.kind(), nn::OptimizerKind::Adam);
  EXPECT_FLOAT_EQ(dense.options().weight_decay, 0.01f);
  EXPECT_FLOAT_EQ(dense.options().clip_norm, 1.5f);
  EXPECT_EQ(emb.kind(), nn::OptimizerKind::RowWiseAdagrad);
  EXPECT_EQ(emb.options().weight_decay, 0.f);
  EXPECT_EQ(emb.options().clip_norm, 0.f);
  EXPECT_FLOAT_EQ(emb.options().clip_value, 10.f);
  // to_json writes every key; reading it back gives the same configuration.
  const json j = c.to_json();
  const RunConfig back = RunConfig::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.optimizer.embedding_config().type, "rowwise_adagrad");
  // No override: the embedding optimizer is the section's, at embedding_lr.
  const RunConfig d = RunConfig::from_json(
      json::parse(R"({"optimizer": {"type": "sgd", "momentum": 0.9, "nesterov": true,
                      "lr": 0.1, "embedding_lr": 0.3, "weight_decay": 0.5}})"));
  EXPECT_TRUE(d.optimizer.embedding.empty());
  EXPECT_DOUBLE_EQ(d.optimizer.embedding_lr_value(), 0.3);
  nn::Optimizer de = make_embedding_optimizer(d.optimizer);
  EXPECT_EQ(de.kind(), nn::OptimizerKind::SGD);
  EXPECT_FLOAT_EQ(de.options().momentum, 0.9f);
  EXPECT_TRUE(de.options().nesterov);
  EXPECT_EQ(de.options().weight_decay, 0.f);
  EXPECT_EQ(RunConfig::from_json(d.to_json()).to_json(), d.to_json());
}

TEST(OptimizerConfig, ErrorsNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"optimizer": {"type": "adamw"}})", "optimizer.type"},
      {R"({"optimizer": {"beta1": -0.1}})", "optimizer.beta1"},
      {R"({"optimizer": {"beta2": 1.0}})", "optimizer.beta2"},
      {R"({"optimizer": {"momentum": 1}})", "optimizer.momentum"},
      {R"({"optimizer": {"nesterov": true}})", "optimizer.nesterov"},
      {R"({"optimizer": {"adam_eps": 0}})", "optimizer.adam_eps"},
      {R"({"optimizer": {"weight_decay": -1}})", "optimizer.weight_decay"},
      {R"({"optimizer": {"clip_norm": -1}})", "optimizer.clip_norm"},
      {R"({"optimizer": {"clip_value": -1}})", "optimizer.clip_value"},
      {R"({"optimizer": {"ftrl_l1": -1}})", "optimizer.ftrl_l1"},
      {R"({"optimizer": {"type": "ftrl", "ftrl_beta": 0}})", "optimizer.ftrl_beta"},
      {R"({"optimizer": {"embedding": {"type": "lamb"}}})", "optimizer.embedding.type"},
      {R"({"optimizer": {"embedding": {"weight_decay": 0.1}}})", "optimizer.embedding.weight_decay"},
      {R"({"optimizer": {"embedding": {"beta2": 2}}})", "optimizer.embedding.beta2"},
      {R"({"optimizer": {"embedding_lr": 0.1, "embedding": {"lr": 0.2}}})", "optimizer.embedding.lr"},
      {R"({"optimizer": {"schedule": {"decay_every": 10, "decay_steps": 5}}})",
       "optimizer.schedule.decay_every"},
      {R"({"optimizer": {"schedule": {"gamma": 2}}})", "optimizer.schedule.gamma"},
      {R"({"optimizer": {"beta_1": 0.9}})", "beta1"},  // did-you-mean
  };
  for (const auto& [text, key] : cases) {
    const std::string msg = error_of(text);
    EXPECT_NE(msg.find(key), std::string::npos) << text << " -> " << msg;
  }
}

TEST(LrSchedule, StepDecayAndWarmup) {
  LrSchedule s;
  s.warmup_steps = 4;
  s.decay_start_step = 10;
  s.decay_every = 5;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(s.factor(0, 100), 0.25);
  EXPECT_DOUBLE_EQ(s.factor(3, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(9, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(10, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(14, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(15, 100), 0.5);
  EXPECT_DOUBLE_EQ(s.factor(24, 100), 0.25);
  EXPECT_DOUBLE_EQ(s.factor(25, 100), 0.125);
  // Polynomial decay unchanged.
  LrSchedule p;
  p.decay_start_step = 0;
  p.decay_steps = 10;
  p.decay_power = 1;
  EXPECT_DOUBLE_EQ(p.factor(5, 100), 0.5);
  EXPECT_DOUBLE_EQ(p.factor(20, 100), 0.0);
}

// --- Checkpoint/resume with every optimizer --------------------------------------------------

std::vector<std::vector<float>> all_state(Model& m) {
  std::vector<std::vector<float>> out;
  for (auto& [n, t] : m.parameters()) out.push_back(t.to_vector<float>());
  for (auto& [n, t] : m.optimizer_state()) out.push_back(t.to_vector<float>());
  return out;
}

void train_range(Model& m, const io::ShardLayout& l, const OptimizerConfig& oc, int from, int to,
                 int total) {
  for (int s = from; s < to; ++s) {
    io::Batch b = testing::make_batch(l, 32, 1000 + s, true);
    m.train_step(b, oc.schedule.factor(s, total), false);
  }
}

TEST(OptimizerResume, EveryKindResumesBitIdentically) {
  const io::ShardLayout l = testing::make_layout(3, {40, 9, 25});
  ModelConfig mc;
  mc.embedding_dim = 4;
  mc.bottom_mlp = {8, 4};
  mc.top_mlp = {8, 1};
  const std::vector<std::string> configs = {
      R"({"type": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 1e-3})",
      R"({"type": "adagrad", "lr": 0.05, "clip_norm": 0.5})",
      R"({"type": "rowwise_adagrad", "lr": 0.05, "adagrad_init": 0.01})",
      R"({"type": "adam", "lr": 0.01, "weight_decay": 0.01, "clip_value": 0.5,
          "schedule": {"warmup_steps": 3, "decay_every": 4, "gamma": 0.7}})",
      R"({"type": "ftrl", "lr": 0.1, "ftrl_l1": 0.001, "ftrl_l2": 0.01})",
      R"({"type": "adam", "lr": 0.01, "embedding": {"type": "rowwise_adagrad", "lr": 0.1}})",
      R"({"type": "sgd", "lr": 0.05, "embedding": {"type": "adam", "lr": 0.01}})",
  };
  const std::string path = ::testing::TempDir() + "/opt_resume.dlrec";
  const int total = 12, cut = 7;
  for (const auto& text : configs) {
    RunConfig rc = RunConfig::from_json(json{{"optimizer", json::parse(text)}});
    const OptimizerConfig& oc = rc.optimizer;
    auto a = build_model(mc, oc, l, Device::cpu(), 9);
    train_range(*a, l, oc, 0, total, total);

    auto b = build_model(mc, oc, l, Device::cpu(), 9);
    train_range(*b, l, oc, 0, cut, total);
    train::save_checkpoint(path, *b, rc, l, {cut, cut * 32});
    b.reset();
    auto c = build_model(mc, oc, l, Device::cpu(), 9);
    EXPECT_EQ(train::load_checkpoint(path, *c).step, cut);
    train_range(*c, l, oc, cut, total, total);

    const auto sa = all_state(*a), sc = all_state(*c);
    ASSERT_EQ(sa.size(), sc.size()) << text;
    for (size_t i = 0; i < sa.size(); ++i) ASSERT_EQ(sa[i], sc[i]) << text << " tensor " << i;
    // The state is really there and named after the kind.
    auto st = a->optimizer_state();
    ASSERT_FALSE(st.empty()) << text;
    EXPECT_EQ(st.back().first.rfind("emb.", 0), 0u) << text;
    // Training moved the parameters.
    auto fresh = build_model(mc, oc, l, Device::cpu(), 9);
    EXPECT_NE(all_state(*fresh)[0], sa[0]) << text;
  }
  std::remove(path.c_str());
}

TEST(OptimizerResume, StateNamesFollowTheKinds) {
  const io::ShardLayout l = testing::make_layout(3, {10, 5});
  ModelConfig mc;
  mc.embedding_dim = 4;
  mc.bottom_mlp = {4};
  mc.top_mlp = {1};
  RunConfig rc = RunConfig::from_json(json::parse(
      R"({"optimizer": {"type": "adam", "embedding": {"type": "rowwise_adagrad"}}})"));
  auto m = build_model(mc, rc.optimizer, l, Device::cpu(), 1);
  std::vector<std::string> names;
  for (auto& [n, t] : m->optimizer_state()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"bottom.0.weight.adam", "bottom.0.bias.adam",
                                             "top.0.weight.adam", "top.0.bias.adam",
                                             "emb.0.weight.rowwise_adagrad",
                                             "emb.1.weight.rowwise_adagrad"}));
  auto st = m->optimizer_state();
  EXPECT_EQ(st[4].second.shape(), (Shape{10}));  // one accumulator per row
  // SGD without momentum keeps no state; with momentum it does.
  RunConfig plain = RunConfig::from_json(json::parse(R"({"optimizer": {"type": "sgd"}})"));
  EXPECT_TRUE(build_model(mc, plain.optimizer, l, Device::cpu(), 1)->optimizer_state().empty());
  RunConfig mom = RunConfig::from_json(json::parse(R"({"optimizer": {"type": "sgd", "momentum": 0.5}})"));
  EXPECT_EQ(build_model(mc, mom.optimizer, l, Device::cpu(), 1)->optimizer_state().size(), 6u);
}


// Every kind actually optimises inside the model: the mean loss over a few fixed batches falls.
TEST(OptimizerResume, EveryKindLowersTheTrainingLoss) {
  const io::ShardLayout l = testing::make_layout(3, {30, 8, 20});
  ModelConfig mc;
  mc.embedding_dim = 4;
  mc.bottom_mlp = {8, 4};
  mc.top_mlp = {8, 1};
  std::vector<io::Batch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(testing::make_batch(l, 64, 500 + i, true, 0.3));
  const std::vector<std::string> configs = {
      R"({"type": "sgd", "lr": 0.1, "momentum": 0.9})",
      R"({"type": "adagrad", "lr": 0.05})",
      R"({"type": "rowwise_adagrad", "lr": 0.05})",
      R"({"type": "adam", "lr": 0.01, "weight_decay": 1e-4})",
      R"({"type": "ftrl", "lr": 0.1})",
      R"({"type": "adam", "lr": 0.01, "clip_norm": 1.0, "embedding": {"type": "ftrl", "lr": 0.1}})",
  };
  for (const auto& text : configs) {
    RunConfig rc = RunConfig::from_json(json{{"optimizer", json::parse(text)}});
    auto m = build_model(mc, rc.optimizer, l, Device::cpu(), 3);
    auto mean_loss = [&] {
      double sum = 0;
      for (const auto& b : batches) {
        const auto logits = m->forward(b, false).to_vector<float>();
        for (size_t r = 0; r < logits.size(); ++r) {
          const double p = 1 / (1 + std::exp(-static_cast<double>(logits[r])));
          sum -= b.labels[r] > 0.5f ? std::log(p) : std::log(1 - p);
        }
      }
      return sum / (64.0 * batches.size());
    };
    const double before = mean_loss();
    for (int epoch = 0; epoch < 30; ++epoch)
      for (const auto& b : batches) m->train_step(b, 1.0, false);
    const double after = mean_loss();
    EXPECT_LT(after, before - 0.02) << text << ": " << before << " -> " << after;
  }
}

}  // namespace
}  // namespace dlrec::model
