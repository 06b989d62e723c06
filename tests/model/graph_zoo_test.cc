// Graph models, issue 6: per-layer and per-table optimizers (config errors, which optimizer
// each parameter gets, equivalences that pin the routing down) and hashed embedding tables as a
// layer option (config errors, training with eviction, state round trip through parameters()).
#include <gtest/gtest.h>

#include "test_errors.h"

#include <cmath>
#include <functional>
#include <map>
#include <string>

#include "dlrec/model/graph.h"
#include "dlrec/model/model.h"
#include "model/test_batches.h"

namespace dlrec::model {
namespace {

using testing::make_batch;
using testing::make_layout;

RunConfig config_from(const std::string& text) { return RunConfig::from_json(json::parse(text)); }

std::string graph_json(const std::string& layers, const std::string& opt) {
  return R"({"model": {"arch": "graph", "layers": [)" + layers + R"(]}, "optimizer": )" + opt + "}";
}

using dlrec::testing::error_of;
using dlrec::testing::expect_error;

// Wide & Deep with a placeholder for each layer's extra keys.
std::string wide_deep(const std::string& wide_extra, const std::string& emb_extra,
                      const std::string& deep_extra) {
  return R"(
    {"name": "dense", "type": "dense"},
    {"name": "wide", "type": "wide")" +
         wide_extra + R"(},
    {"name": "emb", "type": "embedding", "dim": 4)" +
         emb_extra + R"(},
    {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
    {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [8, 1])" +
         deep_extra + R"(},
    {"name": "sum", "type": "add", "inputs": ["wide", "deep"]},
    {"name": "logit", "type": "output", "input": "sum"})";
}

std::map<std::string, Tensor> named(const std::vector<NamedTensor>& v) {
  std::map<std::string, Tensor> m;
  for (auto& [n, t] : v) m[n] = t;
  return m;
}

TEST(GraphZooConfig, LayerOptimizerErrorsNameLayerAndKey) {
  auto bad = [](const std::string& layers, const std::vector<std::string>& parts) {
    expect_error([&] { config_from(graph_json(layers, R"({"type": "adagrad", "lr": 0.1})")); },
                 parts);
  };
  bad(wide_deep(R"(, "optimizer": {"type": "ftrl", "lr": 0.1, "ftrl_l3": 1})", "", ""),
      {"layer 'wide', wide", "model.layers[1].optimizer.ftrl_l3", "did you mean 'ftrl_l1'"});
  bad(wide_deep(R"(, "optimizer": {"type": "lamb"})", "", ""),
      {"layer 'wide'", "optimizer.type", "lamb", "ftrl"});
  bad(wide_deep("", "", R"(, "optimizer": {"lr": 0})"),
      {"layer 'deep', mlp", "optimizer.lr", "> 0"});
  bad(wide_deep("", "", R"(, "optimizer": {"schedule": {"warmup_steps": 3}})"),
      {"layer 'deep'", "optimizer.schedule", "whole run"});
  bad(wide_deep("", "", R"(, "optimizer": {"clip_norm": 1})"),
      {"optimizer.clip_norm", "whole run"});
  bad(wide_deep("", R"(, "optimizer": {"embedding_lr": 0.1})", ""),
      {"layer 'emb'", "embedding_lr", "give this override an 'lr'"});
  bad(wide_deep("", R"(, "optimizer": {"weight_decay": 0.1})", ""),
      {"layer 'emb'", "weight_decay", "never decay"});
  bad(wide_deep("", "", R"(, "optimizer": "adam")"), {"layer 'deep'", "must be an object"});
  bad(wide_deep("", "", R"(, "optimizer": {"nesterov": true})"), {"nesterov", "momentum"});
  // Layers without parameters take no optimizer.
  expect_error(
      [] {
        config_from(graph_json(R"(
        {"name": "dense", "type": "dense", "optimizer": {"type": "sgd"}},
        {"name": "top", "type": "mlp", "input": "dense", "sizes": [1]},
        {"name": "logit", "type": "output", "input": "top"})",
                               R"({"type": "sgd"})"));
      },
      {"layer 'dense', dense", "no parameters"});
  // Per-table settings.
  bad(wide_deep("", R"(, "tables": {"C3": {"optimizer": {"type": "sgd"}}})", ""),
      {"layer 'emb'", "tables.C3", "feature index"});
  bad(wide_deep("", R"(, "features": [0, 1], "tables": {"2": {"optimizer": {"type": "sgd"}}})", ""),
      {"layer 'emb'", "tables.2", "feature 2 is not one of the layer's 'features'"});
  bad(wide_deep("", R"(, "tables": {"1": {"optimiser": {"type": "sgd"}}})", ""),
      {"tables.1.optimiser", "did you mean 'optimizer'"});
  bad(wide_deep("", R"(, "tables": {"1": {"optimizer": {"typ": "sgd"}}})", ""),
      {"tables.1.optimizer.typ", "did you mean 'type'"});
  bad(wide_deep("", R"(, "tables": [1])", ""), {"layer 'emb'", "tables", "must be an object"});
  bad(wide_deep("", "", R"(, "tables": {"1": {}})"),
      {"layer 'deep'", "tables", "embedding and wide"});
}

TEST(GraphZooConfig, HashedErrorsNameLayerAndKey) {
  auto bad = [](const std::string& emb_extra, const std::vector<std::string>& parts) {
    expect_error(
        [&] { config_from(graph_json(wide_deep("", emb_extra, ""), R"({"type": "adagrad"})")); },
        parts);
  };
  bad(R"(, "hashed": {"capacity": 0})",
      {"layer 'emb', embedding", "hashed.capacity", "out of range [1"});
  bad(R"(, "hashed": {"capacity": -5})", {"layer 'emb'", "hashed.capacity", "-5"});
  bad(R"(, "hashed": {"capacity": 4294967296})", {"hashed.capacity"});
  bad(R"(, "hashed": {})", {"hashed.capacity", "required"});
  bad(R"(, "hashed": {"capacity": 10, "eviction": "lfu"})",
      {"hashed.eviction", "not implemented", "lru"});
  bad(R"(, "hashed": {"capacity": 10, "eviction": "fifo"})", {"hashed.eviction", "fifo"});
  bad(R"(, "hashed": {"capacity": 10, "capacty": 10})",
      {"hashed.capacty", "did you mean 'capacity'"});
  bad(R"(, "hashed": {"capacity": 10, "init_scale": -1})", {"hashed.init_scale"});
  bad(R"(, "hashed": 1000)", {"layer 'emb'", "hashed", "must be an object"});
  bad(R"(, "tables": {"0": {"hashed": {"capacity": 0}}})", {"tables.0.hashed.capacity"});
  // Hashed tables are for embedding layers.
  expect_error(
      [] {
        config_from(
            graph_json(wide_deep(R"(, "hashed": {"capacity": 10})", "", ""), R"({"type": "sgd"})"));
      },
      {"layer 'wide', wide", "hashed tables are for embedding layers"});
  expect_error(
      [] {
        config_from(
            graph_json(wide_deep(R"(, "tables": {"0": {"hashed": {"capacity": 10}}})", "", ""),
                       R"({"type": "sgd"})"));
      },
      {"layer 'wide', wide", "tables.0.hashed", "embedding layers"});
}

// At build time: a table entry for a feature the data does not have.
TEST(GraphZooConfig, TableOfAMissingFeatureIsABuildError) {
  RunConfig c = config_from(
      graph_json(wide_deep("", R"(, "tables": {"7": {"optimizer": {"type": "sgd"}}})", ""),
                 R"({"type": "sgd"})"));
  const io::ShardLayout l = make_layout(2, {5, 6, 7});
  expect_error([&] { build_model(c.model, c.optimizer, l, Device::cpu(), 1); },
               {"layer 'emb', embedding", "tables", "feature 7 is not one of the layer's 3"});
}

// The optimizer state names say which optimizer each parameter has.
TEST(GraphZooOptimizers, EachParameterGetsItsLayersOrTablesOptimizer) {
  RunConfig c = config_from(
      graph_json(wide_deep(R"(, "optimizer": {"type": "ftrl", "lr": 0.05, "ftrl_l1": 2})",
                           R"(, "tables": {"1": {"optimizer": {"type": "rowwise_adagrad"}},
                                "2": {"optimizer": {"type": "sgd", "lr": 0.3}}})",
                           ""),
                 R"({"type": "adam", "lr": 0.001, "embedding": {"type": "adagrad", "lr": 0.02}})"));
  const io::ShardLayout l = make_layout(2, {5, 6, 7});
  auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
  std::map<std::string, Shape> s;
  for (auto& [n, t] : m->optimizer_state()) s[n] = t.shape();
  EXPECT_EQ(s.at("wide.0.weight.ftrl"), (Shape{5, 2}));  // z, n per value
  EXPECT_EQ(s.at("wide.2.weight.ftrl"), (Shape{7, 2}));
  EXPECT_EQ(s.at("wide.bias.ftrl"), (Shape{1, 2}));        // the wide part's bias too
  EXPECT_EQ(s.at("emb.0.weight.adagrad"), (Shape{5, 4}));  // optimizer.embedding
  EXPECT_EQ(s.at("emb.1.weight.rowwise_adagrad"), (Shape{6}));
  EXPECT_FALSE(s.count("emb.2.weight.adagrad"));  // plain SGD keeps no state
  EXPECT_FALSE(s.count("emb.2.weight.momentum"));
  EXPECT_EQ(s.at("deep.0.weight.adam"), (Shape{8, 2 * (2 + 3 * 4) + 1}));  // input 14 wide
  EXPECT_EQ(s.size(), 3u + 1 + 1 + 1 + 4);  // wide 3 tables + bias, emb 0 and 1, deep 2 layers x2
  // And they train: FTRL's L1 holds wide weights at exactly 0 (every row is in the batches;
  // without L1 none is 0).
  RunConfig no_l1 = c;
  no_l1.model.layers[1]["optimizer"]["ftrl_l1"] = 0;
  auto m0 = build_model(no_l1.model, no_l1.optimizer, l, Device::cpu(), 1);
  for (int k = 0; k < 20; ++k) {
    m->train_step(make_batch(l, 32, 10 + k, false), 1.0, false);
    m0->train_step(make_batch(l, 32, 10 + k, false), 1.0, false);
  }
  auto zeros = [](Model& x) {
    int n = 0;
    for (float v : named(x.parameters()).at("wide.0.weight").to_vector<float>()) n += v == 0.f;
    return n;
  };
  EXPECT_GT(zeros(*m), 0);
  EXPECT_EQ(zeros(*m0), 0);
}

// Two spellings of one assignment of optimizers to parameters train bit-identically:
//   A: section adagrad 0.05; the wide layer overrides with FTRL 0.1.
//   B: section FTRL 0.1 (dense and tables); emb and deep override with adagrad 0.05.
// Both give the wide tables and bias FTRL 0.1 and the rest adagrad 0.05.
TEST(GraphZooOptimizers, OverridesRouteLikeTheSectionWould) {
  RunConfig a =
      config_from(graph_json(wide_deep(R"(, "optimizer": {"type": "ftrl", "lr": 0.1})", "", ""),
                             R"({"type": "adagrad", "lr": 0.05})"));
  RunConfig b =
      config_from(graph_json(wide_deep("", R"(, "optimizer": {"type": "adagrad", "lr": 0.05})",
                                       R"(, "optimizer": {"type": "adagrad", "lr": 0.05})"),
                             R"({"type": "ftrl", "lr": 0.1})"));
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto ma = build_model(a.model, a.optimizer, l, Device::cpu(), 3);
  auto mb = build_model(b.model, b.optimizer, l, Device::cpu(), 3);
  for (int k = 0; k < 10; ++k) {
    io::Batch batch = make_batch(l, 32, 100 + k, true);
    ASSERT_EQ(ma->train_step(batch, 1.0, true), mb->train_step(batch, 1.0, true)) << "step " << k;
  }
  auto pa = named(ma->parameters()), pb = named(mb->parameters());
  ASSERT_EQ(pa.size(), pb.size());
  for (auto& [n, t] : pa) EXPECT_EQ(t.to_vector<float>(), pb.at(n).to_vector<float>()) << n;
  // And differ from the section's optimizer everywhere (the override is not ignored).
  RunConfig plain =
      config_from(graph_json(wide_deep("", "", ""), R"({"type": "adagrad", "lr": 0.05})"));
  auto mp = build_model(plain.model, plain.optimizer, l, Device::cpu(), 3);
  for (int k = 0; k < 10; ++k) mp->train_step(make_batch(l, 32, 100 + k, true), 1.0, false);
  EXPECT_NE(named(mp->parameters()).at("wide.0.weight").to_vector<float>(),
            pa.at("wide.0.weight").to_vector<float>());
}

// A per-table optimizer equals splitting the table into its own layer with that optimizer (the
// same init_tag gives the same initial rows; concat keeps the field order).
TEST(GraphZooOptimizers, PerTableOptimizerEqualsASeparateLayer) {
  const std::string opt = R"({"type": "adagrad", "lr": 0.05, "clip_norm": 0.5})";
  RunConfig a = config_from(graph_json(R"(
    {"name": "dense", "type": "dense"},
    {"name": "emb", "type": "embedding", "dim": 4, "init_tag": 9,
     "tables": {"0": {"optimizer": {"type": "adam", "lr": 0.01}}}},
    {"name": "x", "type": "concat", "inputs": ["dense", "emb"]},
    {"name": "deep", "type": "mlp", "input": "x", "sizes": [6, 1], "init_tag": 4,
     "optimizer": {"type": "sgd", "lr": 0.2, "momentum": 0.5, "weight_decay": 0.01}},
    {"name": "logit", "type": "output", "input": "deep"})",
                                       opt));
  RunConfig b = config_from(graph_json(R"(
    {"name": "dense", "type": "dense"},
    {"name": "e0", "type": "embedding", "dim": 4, "init_tag": 9, "features": [0],
     "optimizer": {"type": "adam", "lr": 0.01}},
    {"name": "e12", "type": "embedding", "dim": 4, "init_tag": 9, "features": [1, 2]},
    {"name": "x", "type": "concat", "inputs": ["dense", "e0", "e12"]},
    {"name": "deep", "type": "mlp", "input": "x", "sizes": [6, 1], "init_tag": 4,
     "optimizer": {"type": "sgd", "lr": 0.2, "momentum": 0.5, "weight_decay": 0.01}},
    {"name": "logit", "type": "output", "input": "deep"})",
                                       opt));
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto ma = build_model(a.model, a.optimizer, l, Device::cpu(), 5);
  auto mb = build_model(b.model, b.optimizer, l, Device::cpu(), 5);
  for (int k = 0; k < 10; ++k) {
    io::Batch batch = make_batch(l, 32, 200 + k, true);
    ASSERT_EQ(ma->train_step(batch, 1.0, true), mb->train_step(batch, 1.0, true)) << "step " << k;
  }
  auto pa = named(ma->parameters()), pb = named(mb->parameters());
  EXPECT_EQ(pa.at("emb.0.weight").to_vector<float>(), pb.at("e0.0.weight").to_vector<float>());
  EXPECT_EQ(pa.at("emb.2.weight").to_vector<float>(), pb.at("e12.2.weight").to_vector<float>());
  EXPECT_EQ(pa.at("deep.0.weight").to_vector<float>(), pb.at("deep.0.weight").to_vector<float>());
  auto sa = named(ma->optimizer_state());
  EXPECT_TRUE(sa.count("emb.0.weight.adam"));
  EXPECT_TRUE(sa.count("emb.1.weight.adagrad"));
  EXPECT_TRUE(sa.count("deep.0.weight.momentum"));
}

const char* kHashedLayers = R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [4], "relu_last": true},
  {"name": "emb", "type": "embedding", "dim": 4, "hashed": {"capacity": 40},
   "tables": {"2": {"hashed": {"capacity": 1000000, "init_scale": 0.05}}}},
  {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
  {"name": "top", "type": "mlp", "input": "inter", "sizes": [6, 1]},
  {"name": "logit", "type": "output", "input": "top"})";

// Ids far beyond any vocabulary: the layout's cardinalities are 2^40 (what ETL's HashBucket
// with a huge num_buckets declares); ids drawn from a few hundred values per feature.
io::Batch raw_batch(const io::ShardLayout& l, int64_t rows, uint64_t seed) {
  io::Batch b = make_batch(l, rows, seed, true);
  for (auto& ids : b.cat_indices)
    for (auto& id : ids) id = (id % 300) * 0x9E3779B97F4A7 + 12345;
  return b;
}

TEST(GraphZooHashed, TrainsWithEvictionAndNamesItsTensors) {
  RunConfig c = config_from(graph_json(kHashedLayers, R"({"type": "adagrad", "lr": 0.05})"));
  const int64_t big = int64_t{1} << 40;
  const io::ShardLayout l = make_layout(3, {big, big, big, 30});
  auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
  auto s = named(m->parameters());
  // Feature 3 has 30 ids: its capacity is clamped to 30. Table 2 has its own capacity.
  EXPECT_EQ(s.at("emb.0.weight").shape(), (Shape{40, 4}));
  EXPECT_EQ(s.at("emb.0.keys").shape(), (Shape{40}));
  EXPECT_EQ(s.at("emb.0.keys").dtype(), DType::I64);
  EXPECT_EQ(s.at("emb.0.lru").shape(), (Shape{2, 40}));
  EXPECT_EQ(s.at("emb.0.hash_meta").shape(), (Shape{8}));
  EXPECT_EQ(s.at("emb.2.weight").shape(), (Shape{1000000, 4}));
  EXPECT_EQ(s.at("emb.3.weight").shape(), (Shape{30, 4}));
  EXPECT_EQ(named(m->optimizer_state()).at("emb.0.weight.adagrad").shape(), (Shape{40, 4}));
  double first = 0, last = 0;
  for (int k = 0; k < 60; ++k) {
    const double loss = m->train_step(raw_batch(l, 16, 300 + k), 1.0, true);
    ASSERT_TRUE(std::isfinite(loss));
    if (k < 10) first += loss;
    if (k >= 50) last += loss;
  }
  s = named(m->parameters());
  const auto meta0 = s.at("emb.0.hash_meta").to_vector<int64_t>();
  const auto meta2 = s.at("emb.2.hash_meta").to_vector<int64_t>();
  EXPECT_EQ(meta0[0], 40);       // full
  EXPECT_GT(meta0[6], 0);        // evictions
  EXPECT_EQ(meta0[3], 60 * 16);  // one id per row (feature 0 is one-hot)
  EXPECT_EQ(meta2[6], 0);        // room for every id: no evictions
  EXPECT_LE(meta2[0], 300);
  EXPECT_GT(meta2[4], 0);         // hits
  EXPECT_EQ(meta2[5], meta2[0]);  // inserts = rows
  EXPECT_TRUE(std::isfinite(first) && std::isfinite(last));
}

// The checkpoint path: parameters and optimizer state copied into another model built from the
// same config and seed (as the trainer resumes) predict the same and keep training identically
// (recency order and counters included). The seed matters: a key inserted later starts from
// rows drawn from it.
TEST(GraphZooHashed, StateRoundTripContinuesBitIdentically) {
  for (const char* opt : {R"({"type": "sgd", "lr": 0.1})", R"({"type": "adagrad", "lr": 0.05})",
                          R"({"type": "adam", "lr": 0.01})", R"({"type": "ftrl", "lr": 0.1})",
                          R"({"type": "rowwise_adagrad", "lr": 0.05})"}) {
    RunConfig c = config_from(graph_json(kHashedLayers, opt));
    const int64_t big = int64_t{1} << 40;
    const io::ShardLayout l = make_layout(3, {big, big, big, 30});
    auto a = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
    for (int k = 0; k < 20; ++k) a->train_step(raw_batch(l, 16, 400 + k), 1.0, false);
    std::map<std::string, Tensor> saved;
    for (auto& p : a->parameters()) saved[p.first] = p.second.clone();
    for (auto& p : a->optimizer_state()) saved[p.first] = p.second.clone();
    auto b = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
    b->train_step(raw_batch(l, 16, 999), 1.0, false);  // some other state first
    size_t copied = 0;
    for (auto& p : b->parameters()) p.second.copy_from(saved.at(p.first)), ++copied;
    for (auto& p : b->optimizer_state()) p.second.copy_from(saved.at(p.first)), ++copied;
    EXPECT_EQ(copied, saved.size()) << opt;
    io::Batch e = raw_batch(l, 50, 77);
    EXPECT_EQ(a->forward(e, false).to_vector<float>(), b->forward(e, false).to_vector<float>())
        << opt;
    for (int k = 0; k < 15; ++k) {
      io::Batch t = raw_batch(l, 16, 500 + k);
      ASSERT_EQ(a->train_step(t, 1.0, true), b->train_step(t, 1.0, true)) << opt << " step " << k;
    }
    auto pa = named(a->parameters()), pb = named(b->parameters());
    for (auto& [n, t] : pa) {
      if (t.dtype() == DType::F32)
        EXPECT_EQ(t.to_vector<float>(), pb.at(n).to_vector<float>()) << opt << " " << n;
      else if (t.dtype() == DType::I64)
        EXPECT_EQ(t.to_vector<int64_t>(), pb.at(n).to_vector<int64_t>()) << opt << " " << n;
      else
        EXPECT_EQ(t.to_vector<int32_t>(), pb.at(n).to_vector<int32_t>()) << opt << " " << n;
    }
  }
}

// A state that no table wrote is refused with the table's name, and the table is left empty
// (usable) rather than half-built.
TEST(GraphZooHashed, CorruptStateIsAClearError) {
  RunConfig c = config_from(graph_json(kHashedLayers, R"({"type": "sgd", "lr": 0.1})"));
  const int64_t big = int64_t{1} << 40;
  const io::ShardLayout l = make_layout(3, {big, big, big, 30});
  auto corrupt = [&](const std::function<void(std::map<std::string, Tensor>&)>& edit,
                     const std::vector<std::string>& parts) {
    auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
    for (int k = 0; k < 5; ++k) m->train_step(raw_batch(l, 16, 600 + k), 1.0, false);
    auto p = named(m->parameters());
    edit(p);
    expect_error([&] { m->forward(raw_batch(l, 4, 1), false); }, parts);
    // Emptied, not broken: the table holds no rows and training goes on from there.
    EXPECT_EQ(named(m->parameters()).at("emb.0.hash_meta").to_vector<int64_t>()[0], 0);
    EXPECT_TRUE(std::isfinite(m->train_step(raw_batch(l, 16, 700), 1.0, true)));
  };
  corrupt([](auto& p) { p.at("emb.0.hash_meta").template data<int64_t>()[0] = 41; },
          {"hashed table 'emb.0'", "size 41"});
  corrupt([](auto& p) { p.at("emb.0.hash_meta").template data<int64_t>()[7] = 50; },
          {"hashed table 'emb.0'", "capacity 50"});
  corrupt([](auto& p) { p.at("emb.0.lru").template data<int32_t>()[40 + 3] = 3; },
          {"hashed table 'emb.0'", "LRU list"});
  corrupt(
      [](auto& p) {
        int64_t* k = p.at("emb.0.keys").template data<int64_t>();
        k[1] = k[0];
      },
      {"hashed table 'emb.0'", "has two rows"});
}

}  // namespace
}  // namespace dlrec::model
