// The graph model (arch "graph"): config errors, equivalence with the DLRM class, whole-graph
// gradients, training, parameters round trip, the shipped zoo configs and the CLI.
#include <gtest/gtest.h>

#include "test_errors.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include <unistd.h>

#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "model/test_batches.h"

namespace dlrec::model {
namespace {

using testing::make_batch;
using testing::make_layout;

RunConfig config_from(const std::string& text) { return RunConfig::from_json(json::parse(text)); }

RunConfig load_config(const std::string& name) {
  return RunConfig::load(std::string(DLREC_SOURCE_DIR) + "/configs/" + name);
}

// A model JSON with the given layers and an SGD optimizer.
std::string graph_json(const std::string& layers, const std::string& opt = R"({"type": "sgd",
    "lr": 0.1})") {
  return R"({"model": {"arch": "graph", "layers": [)" + layers + R"(]}, "optimizer": )" + opt +
         "}";
}

using dlrec::testing::error_of;
using dlrec::testing::expect_error;

const char* kDeepFmLayers = R"(
  {"name": "dense", "type": "dense"},
  {"name": "first", "type": "wide"},
  {"name": "emb", "type": "embedding", "dim": 4, "pooling": "mean"},
  {"name": "fm", "type": "fm", "inputs": ["emb"]},
  {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [8, 1]},
  {"name": "sum", "type": "add", "inputs": ["first", "fm", "deep"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// Both DCNv2 variants on one graph: a low-rank stack feeding an MLP and a full-rank cross in
// parallel with an MLP, plus a dot interaction over differently-sized embeddings' fields.
const char* kCrossLayers = R"(
  {"name": "dense", "type": "dense"},
  {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [4], "relu_last": true},
  {"name": "emb", "type": "embedding", "features": [0, 2], "dim": 4},
  {"name": "emb2", "type": "embedding", "features": [1], "dims": [3]},
  {"name": "x0", "type": "concat", "inputs": ["bottom", "emb", "emb2"]},
  {"name": "stacked", "type": "cross", "input": "x0", "num_layers": 2, "low_rank": 3},
  {"name": "top", "type": "mlp", "input": "stacked", "sizes": [5, 1]},
  {"name": "par_cross", "type": "cross", "input": "x0", "num_layers": 1},
  {"name": "par_deep", "type": "mlp", "input": "x0", "sizes": [3], "relu_last": true},
  {"name": "par", "type": "concat", "inputs": ["par_cross", "par_deep"]},
  {"name": "par_head", "type": "mlp", "input": "par", "sizes": [1]},
  {"name": "dot", "type": "dot", "inputs": ["emb", "bottom"]},
  {"name": "dot_head", "type": "mlp", "input": "dot", "sizes": [1]},
  {"name": "sum", "type": "add", "inputs": ["top", "par_head", "dot_head"]},
  {"name": "logit", "type": "output", "input": "sum"})";

// ---- config errors ----

TEST(GraphConfig, ParsesAndRoundTrips) {
  RunConfig c = config_from(graph_json(kDeepFmLayers));
  EXPECT_EQ(c.model.arch, "graph");
  GraphSpec g = GraphSpec::parse(c.model.layers, "model.layers");
  ASSERT_EQ(g.layers.size(), 8u);
  EXPECT_EQ(g.layers[g.output].name, "logit");
  // Inputs come before their consumers.
  std::map<std::string, size_t> pos;
  for (size_t k = 0; k < g.order.size(); ++k) pos[g.layers[g.order[k]].name] = k;
  EXPECT_LT(pos["emb"], pos["fm"]);
  EXPECT_LT(pos["deep"], pos["sum"]);
  RunConfig d = RunConfig::from_json(c.to_json());
  EXPECT_EQ(d.to_json(), c.to_json());
  // A dlrm config's JSON is unchanged (no layers key).
  EXPECT_FALSE(RunConfig().to_json()["model"].contains("layers"));
}

TEST(GraphConfig, UnknownLayerTypeNamesLayerAndKey) {
  expect_error([] { config_from(graph_json(R"({"name": "x", "type": "crosss"},
      {"name": "o", "type": "output", "input": "x"})")); },
               {"layer 'x'", "model.layers[0].type", "cross"});
}

TEST(GraphConfig, UnknownInputNamesLayerKeyAndNearestName) {
  expect_error([] { config_from(graph_json(R"({"name": "dense", "type": "dense"},
      {"name": "top", "type": "mlp", "input": "dnse", "sizes": [1]},
      {"name": "o", "type": "output", "input": "top"})")); },
               {"layer 'top'", "key 'input'", "unknown layer 'dnse'", "did you mean 'dense'"});
  expect_error([] { config_from(graph_json(R"({"name": "dense", "type": "dense"},
      {"name": "c", "type": "concat", "inputs": ["dense", "nope"]},
      {"name": "top", "type": "mlp", "input": "c", "sizes": [1]},
      {"name": "o", "type": "output", "input": "top"})")); },
               {"layer 'c'", "key 'inputs'", "unknown layer 'nope'"});
}

TEST(GraphConfig, CycleIsNamed) {
  expect_error([] { config_from(graph_json(R"({"name": "dense", "type": "dense"},
      {"name": "a", "type": "concat", "inputs": ["dense", "b"]},
      {"name": "b", "type": "mlp", "input": "a", "sizes": [4]},
      {"name": "top", "type": "mlp", "input": "b", "sizes": [1]},
      {"name": "o", "type": "output", "input": "top"})")); },
               {"cycle", "'a'", "'b'"});
}

TEST(GraphConfig, StructuralErrors) {
  // Unknown option key, with the nearest valid one.
  expect_error([] { config_from(graph_json(R"({"name": "dense", "type": "dense"},
      {"name": "top", "type": "mlp", "input": "dense", "size": [1]},
      {"name": "o", "type": "output", "input": "top"})")); },
               {"layer 'top'", "model.layers[1]"});
  expect_error([] { config_from(graph_json(R"({"name": "dense", "type": "dense"},
      {"name": "top", "type": "mlp", "input": "dense", "sizes": [1], "relu_lst": true},
      {"name": "o", "type": "output", "input": "top"})")); },
               {"layer 'top'", "model.layers[1].relu_lst", "relu_last"});
  // Duplicate names, no output, two outputs, a layer feeding nothing, wrong input counts.
  expect_error([] { config_from(graph_json(R"({"name": "d", "type": "dense"},
      {"name": "d", "type": "mlp", "input": "d", "sizes": [1]},
      {"name": "o", "type": "output", "input": "d"})")); },
               {"name 'd' is already used"});
  expect_error([] { config_from(graph_json(R"({"name": "d", "type": "dense"})")); },
               {"no layer of type \"output\""});
  expect_error([] { config_from(graph_json(R"({"name": "d", "type": "dense"},
      {"name": "m", "type": "mlp", "input": "d", "sizes": [1]},
      {"name": "o1", "type": "output", "input": "m"},
      {"name": "o2", "type": "output", "input": "m"})")); },
               {"layer 'o2'", "second output"});
  expect_error([] { config_from(graph_json(R"({"name": "d", "type": "dense"},
      {"name": "e", "type": "embedding"},
      {"name": "m", "type": "mlp", "input": "d", "sizes": [1]},
      {"name": "o", "type": "output", "input": "m"})")); },
               {"layer 'e'", "does not feed the output"});
  expect_error([] { config_from(graph_json(R"({"name": "d", "type": "dense", "input": "d"},
      {"name": "o", "type": "output", "input": "d"})")); },
               {"layer 'd'", "takes no 'input'"});
  expect_error([] { config_from(graph_json(R"({"name": "d", "type": "dense"},
      {"name": "m", "type": "mlp", "inputs": ["d", "d"], "sizes": [1]},
      {"name": "o", "type": "output", "input": "m"})")); },
               {"layer 'm'", "exactly one input"});
  // layers without arch graph; arch graph without layers.
  expect_error([] { config_from(R"({"model": {"layers": []}})"); },
               {"model.layers", "\"graph\""});
  expect_error([] { config_from(R"({"model": {"arch": "graph"}})"); }, {"model.layers"});
}

TEST(GraphConfig, ShapeMismatchesNameLayerAndKey) {
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto build = [&](const std::string& layers) {
    RunConfig c = config_from(graph_json(layers));
    build_model(c.model, c.optimizer, l, Device::cpu(), 1);
  };
  // dot: the bottom MLP's 8 outputs against embeddings of 4.
  expect_error([&] { build(R"({"name": "dense", "type": "dense"},
      {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [8], "relu_last": true},
      {"name": "emb", "type": "embedding", "dim": 4},
      {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
      {"name": "top", "type": "mlp", "input": "inter", "sizes": [1]},
      {"name": "o", "type": "output", "input": "top"})"); },
               {"layer 'inter'", "key 'inputs'", "widths [4, 4, 4]"});
  // output wider than one logit.
  expect_error([&] { build(R"({"name": "dense", "type": "dense"},
      {"name": "top", "type": "mlp", "input": "dense", "sizes": [2]},
      {"name": "o", "type": "output", "input": "top"})"); },
               {"layer 'o'", "key 'input'", "'top' is 2 wide"});
  // add over different widths.
  expect_error([&] { build(R"({"name": "dense", "type": "dense"},
      {"name": "a", "type": "mlp", "input": "dense", "sizes": [2]},
      {"name": "b", "type": "mlp", "input": "dense", "sizes": [1]},
      {"name": "s", "type": "add", "inputs": ["a", "b"]},
      {"name": "o", "type": "output", "input": "s"})"); },
               {"layer 's'", "key 'inputs'"});
  // a feature index beyond the data; a low rank above the width.
  expect_error([&] { build(R"({"name": "w", "type": "wide", "features": [0, 3]},
      {"name": "o", "type": "output", "input": "w"})"); },
               {"layer 'w'", "key 'features'", "feature 3"});
  expect_error([&] { build(R"({"name": "dense", "type": "dense"},
      {"name": "c", "type": "cross", "input": "dense", "low_rank": 4},
      {"name": "top", "type": "mlp", "input": "c", "sizes": [1]},
      {"name": "o", "type": "output", "input": "top"})"); },
               {"layer 'c'", "key 'low_rank'"});
  // A graph CUDA cannot train (a layer's own optimizer; or any graph in a build without CUDA)
  // is refused before the device is touched, pointing at the CPU.
  RunConfig c = config_from(graph_json(R"({"name": "w", "type": "wide", "optimizer": {"type": "ftrl"}},
      {"name": "o", "type": "output", "input": "w"})"));
  expect_error([&] { build_model(c.model, c.optimizer, l, Device::parse("cuda"), 1); }, {"CPU"});
}

// ---- the engine ----

// arch "graph" with configs/dlrm_graph.json equals arch "dlrm" with the same sizes and seed:
// the same parameters, logits and training trajectory, bit for bit.
void expect_same_as_dlrm(const RunConfig& g, const RunConfig& d,
                         const io::ShardLayout& l = make_layout(13, {40, 7, 300, 1, 25})) {
  ASSERT_EQ(g.optimizer.to_json(), d.optimizer.to_json());
  auto mg = build_model(g.model, g.optimizer, l, Device::cpu(), 77);
  auto md = build_model(d.model, d.optimizer, l, Device::cpu(), 77);
  auto pg = mg->parameters(), pd = md->parameters();
  ASSERT_EQ(pg.size(), pd.size());
  std::map<std::string, Tensor> byname;
  for (auto& p : pd) byname[p.first] = p.second;
  for (auto& p : pg) {
    ASSERT_TRUE(byname.count(p.first)) << p.first;
    EXPECT_EQ(p.second.to_vector<float>(), byname[p.first].to_vector<float>()) << p.first;
  }
  for (int step = 0; step < 5; ++step) {
    io::Batch b = make_batch(l, 96, 100 + step, /*multi_hot=*/true);
    const double lg = mg->train_step(b, 1.0, true), ld = md->train_step(b, 1.0, true);
    EXPECT_EQ(lg, ld) << "step " << step;
  }
  io::Batch e = make_batch(l, 50, 999, true);
  EXPECT_EQ(mg->forward(e, false).to_vector<float>(), md->forward(e, false).to_vector<float>());
  auto sg = mg->optimizer_state(), sd = md->optimizer_state();
  ASSERT_EQ(sg.size(), sd.size());
  for (auto& s : sd) byname[s.first] = s.second;
  for (auto& s : sg) EXPECT_EQ(s.second.to_vector<float>(), byname.at(s.first).to_vector<float>());
}

TEST(GraphModel, DlrmGraphMatchesDlrmClass) {
  expect_same_as_dlrm(load_config("dlrm_graph.json"), load_config("dlrm_small.json"));
}

// DLRM's cat interaction is the graph's concat.
TEST(GraphModel, DlrmCatGraphMatchesDlrmClass) {
  RunConfig g = load_config("dlrm_graph.json");
  RunConfig d = load_config("dlrm_small.json");
  d.model.interaction = "cat";
  for (auto& layer : g.model.layers)
    if (layer["name"] == "inter") layer["type"] = "concat";
  expect_same_as_dlrm(g, d);
}

// arch "dlrm" is a preset (model::dlrm_graph_layers): for every variant (dot or cat, sum or
// mean pooling, with or without a bottom MLP, without dense features) and optimizer, its graph
// is arch "dlrm" bit for bit (parameters, names, losses, logits, optimizer state). Until commit
// cc34c18 arch "dlrm" on the CPU was a class of its own (src/model/dlrm.cc): this test passed
// against it for every variant and optimizer below, and the class was then deleted. Since then
// it checks that build_model expands arch "dlrm" to this graph, and DlrmGraphMatchesDlrmClass
// that configs/dlrm_graph.json (written by hand) is that graph.
TEST(GraphModel, DlrmPresetVariantsMatchArchDlrm) {
  struct Variant {
    const char* interaction;
    const char* pooling;
    std::vector<int64_t> bottom;
    int64_t num_dense, dim;
  };
  const std::vector<Variant> variants = {{"dot", "sum", {32, 8}, 13, 8},
                                         {"dot", "mean", {8}, 5, 8},
                                         {"cat", "sum", {16, 4}, 13, 8},
                                         {"cat", "mean", {}, 6, 4},
                                         {"dot", "sum", {}, 4, 4},
                                         {"cat", "sum", {}, 0, 5}};
  const std::vector<const char*> opts = {
      R"({"type": "sgd", "lr": 0.1})",
      R"({"type": "adagrad", "lr": 0.05, "embedding_lr": 0.2, "clip_norm": 0.5})",
      R"({"type": "adam", "lr": 0.01, "weight_decay": 0.01, "embedding": {"type": "ftrl"}})"};
  for (const Variant& v : variants)
    for (const char* o : opts) {
      SCOPED_TRACE(std::string(v.interaction) + " " + v.pooling + " dense " +
                   std::to_string(v.num_dense) + " " + o);
      RunConfig d = config_from(R"({"model": {"arch": "dlrm"}, "optimizer": )" + std::string(o) +
                                R"(, "train": {}})");
      d.model.interaction = v.interaction;
      d.model.pooling = v.pooling;
      d.model.bottom_mlp = v.bottom;
      d.model.embedding_dim = v.dim;
      d.model.top_mlp = {7, 1};
      const io::ShardLayout l = make_layout(v.num_dense, {40, 7, 300, 1, 25});
      RunConfig g = d;
      g.model.arch = "graph";
      g.model.layers = dlrm_graph_layers(d.model, l);
      expect_same_as_dlrm(g, d, l);
    }
}

// The zoo presets (arch "dcnv2", "deepfm", "wide_deep") with the keys of the shipped graph
// configs are those configs: the same parameters (names, values), losses and logits, bit for bit
// (the wide part's FTRL override of wide_deep.json taken out: presets use the optimizer section).
TEST(GraphModel, ZooPresetsMatchShippedConfigs) {
  struct Zoo {
    const char* file;
    const char* preset;
  };
  for (const Zoo& z : {Zoo{"dcnv2.json", R"({"arch": "dcnv2", "embedding_dim": 128,
                              "bottom_mlp": [512, 256, 128], "cross_layers": 3,
                              "cross_low_rank": 512, "top_mlp": [1024, 1024, 512, 256, 1]})"},
                       Zoo{"deepfm.json", R"({"arch": "deepfm", "embedding_dim": 10,
                              "top_mlp": [400, 400, 400, 1]})"},
                       Zoo{"wide_deep.json", R"({"arch": "wide_deep", "embedding_dim": 16,
                              "top_mlp": [1024, 1024, 1024, 1]})"}}) {
    SCOPED_TRACE(z.file);
    RunConfig g = load_config(z.file);
    for (auto& l : g.model.layers) l.erase("optimizer");
    RunConfig p = g;
    const json pj = json::parse(z.preset);  // ConfigReader keeps a reference
    ConfigReader r(pj, "model");
    p.model = ModelConfig::from_json(r);
    expect_same_as_dlrm(g, p, make_layout(13, {40, 7, 300, 1, 25}));
    // The preset's keys survive the run's config (checkpoints and exports keep it).
    const json back_json = p.model.to_json();
    ConfigReader back(back_json, "model");
    EXPECT_EQ(ModelConfig::from_json(back).to_json(), p.model.to_json());
  }
  // Keys of one preset are errors on another.
  RunConfig bad = config_from(R"({"model": {"arch": "dcnv2"}, "optimizer": {}, "train": {}})");
  EXPECT_EQ(bad.model.cross_layers, 3);
  EXPECT_NE(error_of([] {
              config_from(R"({"model": {"arch": "dlrm", "cross_layers": 2}, "optimizer": {},
                              "train": {}})");
            }).find("needs \"arch\": \"dcnv2\""),
            std::string::npos);
}

double batch_loss(Model& m, const io::Batch& b) {
  Tensor z = m.forward(b, false);
  return nn::bce_with_logits(z.data<float>(), b.labels.data(), b.rows, nullptr);
}

// Whole-graph gradients: with SGD, w_after = w_before - lr * dL/dw, so one step with lr = 1
// reveals the gradient backward_and_update used. Checked against central differences of the
// batch loss for a sample of every parameter's elements (shared inputs, concat, dot, add,
// cross, FM, wide, embeddings with mean pooling and multi-hot bags).
void check_graph_grads(const char* layers) {
  RunConfig c = config_from(graph_json(layers, R"({"type": "sgd", "lr": 1.0})"));
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 5);
  io::Batch b = make_batch(l, 12, 31, /*multi_hot=*/true);
  // Central differences of the loss in double around the current parameters.
  std::map<std::string, std::vector<double>> numeric;
  std::map<std::string, std::vector<int64_t>> picked;
  nn::Rng rng(3);
  const double eps = 1e-3;
  for (auto& p : m->parameters()) {
    float* v = p.second.data<float>();
    const int64_t n = p.second.numel();
    for (int k = 0; k < std::min<int64_t>(n, 12); ++k) {
      const int64_t i = n <= 12 ? k : rng.below(n);
      const float saved = v[i];
      v[i] = saved + static_cast<float>(eps);
      const double up = batch_loss(*m, b);
      v[i] = saved - static_cast<float>(eps);
      const double down = batch_loss(*m, b);
      v[i] = saved;
      numeric[p.first].push_back((up - down) / (2 * eps));
      picked[p.first].push_back(i);
    }
  }
  std::map<std::string, std::vector<float>> before;
  for (auto& p : m->parameters()) before[p.first] = p.second.to_vector<float>();
  m->train_step(b, 1.0, false);
  int checked = 0;
  for (auto& p : m->parameters()) {
    const std::vector<float> after = p.second.to_vector<float>();
    for (size_t k = 0; k < picked[p.first].size(); ++k) {
      const int64_t i = picked[p.first][k];
      const double analytic = static_cast<double>(before[p.first][i]) - after[i];
      const double num = numeric[p.first][k];
      EXPECT_NEAR(analytic, num, 2e-4 + 2e-2 * std::fabs(num)) << p.first << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(GraphModel, DeepFmGradientsMatchFiniteDifferences) { check_graph_grads(kDeepFmLayers); }
TEST(GraphModel, CrossAndDotGradientsMatchFiniteDifferences) { check_graph_grads(kCrossLayers); }

TEST(GraphModel, ParameterNames) {
  RunConfig c = config_from(graph_json(kCrossLayers, R"({"type": "adagrad", "lr": 0.1})"));
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 5);
  std::map<std::string, Shape> shapes;
  for (auto& p : m->parameters()) shapes[p.first] = p.second.shape();
  EXPECT_EQ(shapes.at("emb.2.weight"), (Shape{7, 4}));
  EXPECT_EQ(shapes.at("emb2.1.weight"), (Shape{6, 3}));
  EXPECT_EQ(shapes.at("stacked.1.v.weight"), (Shape{3, 15}));
  EXPECT_EQ(shapes.at("par_cross.0.w.weight"), (Shape{15, 15}));
  EXPECT_EQ(shapes.at("top.1.bias"), (Shape{1}));
  EXPECT_FALSE(shapes.count("emb.1.weight"));
  EXPECT_EQ(m->optimizer_state().size(), m->parameters().size());
  EXPECT_EQ(m->optimizer_state()[0].first, m->parameters()[0].first + ".adagrad");
}

// Training on a planted signal lowers the validation loss, for each zoo model.
void expect_learns(const RunConfig& c, const std::string& what) {
  const io::ShardLayout l = make_layout(4, {20, 30, 10, 50});
  auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 11);
  // Labels: a majority vote of the ids of features 0 and 1 and the first dense value (a
  // signal the linear parts can carry as well as the deep ones).
  auto label = [](io::Batch& b) {
    for (int64_t r = 0; r < b.rows; ++r) {
      const int64_t a = b.cat_indices[0][b.cat_offsets[0][r]];
      const int64_t s = b.cat_indices[1][b.cat_offsets[1][r]];
      const int votes = (a % 3 == 0) + (s % 2 == 0) + (b.dense[r * b.num_dense] > 0.f);
      b.labels[r] = votes >= 2 ? 1.f : 0.f;
    }
  };
  io::Batch valid = make_batch(l, 512, 1, false);
  label(valid);
  const double before = batch_loss(*m, valid);
  for (int step = 0; step < 150; ++step) {
    io::Batch b = make_batch(l, 64, 1000 + step, false);
    label(b);
    m->train_step(b, 1.0, false);
  }
  const double after = batch_loss(*m, valid);
  EXPECT_LT(after, before * 0.8) << what << ": loss " << before << " -> " << after;
  EXPECT_TRUE(std::isfinite(after)) << what;
}

TEST(GraphModel, ZooModelsLearn) {
  for (const char* name : {"criteo_sample_wide_deep.json", "criteo_sample_dcnv2.json",
                           "criteo_sample_dcnv2_parallel.json", "criteo_sample_deepfm.json"}) {
    RunConfig c = load_config(name);
    c.optimizer.lr = 0.1;
    expect_learns(c, name);
  }
  RunConfig c = load_config("criteo_sample_deepfm.json");
  c.optimizer = OptimizerConfig();
  c.optimizer.type = "adagrad";
  c.optimizer.lr = 0.05;
  expect_learns(c, "deepfm with adagrad");
}

// Parameters are shared storage: copying them into a model built with another seed makes it
// predict the same, which is how checkpoints, export and the Predictor load a model.
TEST(GraphModel, ParametersSaveAndLoad) {
  RunConfig c = config_from(graph_json(kCrossLayers, R"({"type": "adagrad", "lr": 0.05})"));
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto a = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
  for (int s = 0; s < 3; ++s) a->train_step(make_batch(l, 32, 50 + s, true), 1.0, false);
  auto b = build_model(c.model, c.optimizer, l, Device::cpu(), 2);
  io::Batch e = make_batch(l, 40, 7, true);
  EXPECT_NE(a->forward(e, false).to_vector<float>(), b->forward(e, false).to_vector<float>());
  std::map<std::string, Tensor> saved;
  for (auto& p : a->parameters()) saved[p.first] = p.second.clone();
  for (auto& s : a->optimizer_state()) saved[s.first] = s.second.clone();
  for (auto& p : b->parameters()) p.second.copy_from(saved.at(p.first));
  for (auto& s : b->optimizer_state()) s.second.copy_from(saved.at(s.first));
  EXPECT_EQ(a->forward(e, false).to_vector<float>(), b->forward(e, false).to_vector<float>());
  // And they keep training identically (the optimizer state came along).
  io::Batch t = make_batch(l, 32, 60, true);
  EXPECT_EQ(a->train_step(t, 1.0, true), b->train_step(t, 1.0, true));
  EXPECT_EQ(a->forward(e, false).to_vector<float>(), b->forward(e, false).to_vector<float>());
}

// Training is bit-identical whatever the thread count (as for the DLRM class): every layer sums
// in an order fixed by the data, never by the threads.
TEST(GraphModel, SameResultsOnAnyThreadCount) {
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto trained = [&](const char* layers, int threads) {
    set_num_threads(threads);
    RunConfig c = config_from(graph_json(layers, R"({"type": "adagrad", "lr": 0.05})"));
    auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 3);
    // Batches above the layers' parallel grain sizes, so that the threads do split them.
    for (int s = 0; s < 3; ++s) m->train_step(make_batch(l, 700, 80 + s, true), 1.0, false);
    std::map<std::string, std::vector<float>> out;
    for (auto& p : m->parameters()) out[p.first] = p.second.to_vector<float>();
    return out;
  };
  for (const char* layers : {kDeepFmLayers, kCrossLayers}) {
    const auto one = trained(layers, 1), three = trained(layers, 3);
    EXPECT_TRUE(one == three);
  }
  set_num_threads(0);
}

TEST(GraphModel, RejectsBadUse) {
  RunConfig c = config_from(graph_json(kDeepFmLayers));
  const io::ShardLayout l = make_layout(3, {5, 6, 7});
  auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
  EXPECT_THROW(m->backward_and_update(Tensor::zeros({4}, DType::F32), 1.0), Error);
  io::Batch b = make_batch(make_layout(2, {5, 6, 7}), 4, 1, false);
  EXPECT_THROW(m->forward(b, true), Error);
  io::Batch ok = make_batch(l, 4, 1, false);
  m->forward(ok, true);
  EXPECT_THROW(m->backward_and_update(Tensor::zeros({5}, DType::F32), 1.0), Error);
}

// Every shipped zoo config loads and builds; the MLPerf-sized DCNv2 has the reference's shapes.
TEST(GraphModel, ShippedConfigsBuild) {
  const io::ShardLayout l = make_layout(13, std::vector<int64_t>(26, 10));
  for (const char* name : {"wide_deep.json", "dcnv2.json", "deepfm.json", "dlrm_graph.json",
                           "criteo_sample_wide_deep.json", "criteo_sample_dcnv2.json",
                           "criteo_sample_dcnv2_parallel.json", "criteo_sample_deepfm.json"}) {
    RunConfig c = load_config(name);
    EXPECT_EQ(c.model.arch, "graph") << name;
    auto m = build_model(c.model, c.optimizer, l, Device::cpu(), 1);
    io::Batch b = make_batch(l, 3, 2, false);
    EXPECT_EQ(m->forward(b, false).numel(), 3) << name;
    if (std::string(name) == "dcnv2.json") {
      std::map<std::string, Shape> s;
      for (auto& p : m->parameters()) s[p.first] = p.second.shape();
      EXPECT_EQ(s.at("emb.0.weight"), (Shape{10, 128}));
      EXPECT_EQ(s.at("bottom.2.weight"), (Shape{128, 256}));
      EXPECT_EQ(s.at("cross.2.v.weight"), (Shape{512, 27 * 128}));
      EXPECT_EQ(s.at("cross.2.w.weight"), (Shape{27 * 128, 512}));
      EXPECT_FALSE(s.count("cross.3.w.weight"));
      EXPECT_EQ(s.at("top.0.weight"), (Shape{1024, 27 * 128}));
      EXPECT_EQ(s.at("top.4.weight"), (Shape{1, 256}));
    }
  }
}

// The CLI end to end: datagen -> etl -> train (graph configs) -> eval -> export -> predict, and
// an interrupted run resumed from its checkpoint ending where an uninterrupted one does.
class GraphCli : public ::testing::Test {
 protected:
  void SetUp() override {
    namespace fs = std::filesystem;
    bin_ = std::string(DLREC_BIN_DIR) + "/dlrec";
    if (!fs::exists(bin_)) GTEST_SKIP() << bin_ << " not built";
    bin_ += " --quiet";  // no progress lines in the outputs the tests compare
    dir_ = (fs::temp_directory_path() / ("dlrec_graph_cli_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    run(bin_ + " datagen --rows 3000 --seed 3 --out " + dir_ + "/logs.tsv");
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string run(const std::string& cmd) {
    const std::string full = cmd + " > " + dir_ + "/out.txt 2>&1";
    const int rc = std::system(full.c_str());
    std::ifstream in(dir_ + "/out.txt");
    std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(rc, 0) << cmd << "\n" << out;
    return out;
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }
  void etl(const std::string& workflow) {
    run(bin_ + " etl --input " + dir_ + "/logs.tsv --workflow " + workflow +
        " --valid-ratio 0.2 --out " + dir_ + "/data");
  }
  std::string train(const RunConfig& c, const std::string& run_name, bool resume = false) {
    write(run_name + ".json", c.to_json().dump(2));
    return run(bin_ + " train --config " + dir_ + "/" + run_name + ".json --data " + dir_ +
               "/data --run " + dir_ + "/" + run_name + (resume ? " --resume" : ""));
  }
  // Train, eval, export and predict 5 raw rows.
  void pipeline(const RunConfig& c) {
    const std::string t = train(c, "run");
    EXPECT_NE(t.find("AUC="), std::string::npos) << t;
    const std::string ev = run(bin_ + " eval --run " + dir_ + "/run");
    EXPECT_NE(ev.find("AUC"), std::string::npos) << ev;
    run(bin_ + " export --run " + dir_ + "/run --out " + dir_ + "/model");
    const std::string pred = run("head -5 " + dir_ + "/logs.tsv | " + bin_ + " predict --model " +
                                 dir_ + "/model --input -");
    int lines = 0;
    for (char ch : pred) lines += ch == '\n';
    EXPECT_GE(lines, 5) << pred;
  }
  std::string bin_, dir_;
};

TEST_F(GraphCli, DeepFmTrainEvalExportPredict) {
  etl(std::string(DLREC_SOURCE_DIR) + "/configs/etl_criteo.json");
  RunConfig c = load_config("criteo_sample_deepfm.json");
  c.train.batch_size = 128;
  c.train.epochs = 1;
  pipeline(c);
}

// Wide & Deep with crossed features: ETL's HashedCross adds features 26 and 27, which the wide
// part reads besides the 26 categorical columns; the deep part embeds only the 26.
TEST_F(GraphCli, WideDeepWithCrossedFeatures) {
  write("etl.json", R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]},
    {"columns": ["C1", "C2"], "ops": [{"op": "HashedCross", "num_buckets": 1000}]},
    {"columns": ["C3", "C4", "C5"], "ops": [{"op": "HashedCross", "num_buckets": 1000}]}]})");
  etl(dir_ + "/etl.json");
  std::vector<int> first26(26);
  for (int i = 0; i < 26; ++i) first26[i] = i;
  RunConfig c = config_from(graph_json(R"(
    {"name": "dense", "type": "dense"},
    {"name": "wide", "type": "wide"},
    {"name": "emb", "type": "embedding", "dim": 8, "features": )" + json(first26).dump() + R"(},
    {"name": "deep_in", "type": "concat", "inputs": ["dense", "emb"]},
    {"name": "deep", "type": "mlp", "input": "deep_in", "sizes": [16, 1]},
    {"name": "sum", "type": "add", "inputs": ["wide", "deep"]},
    {"name": "logit", "type": "output", "input": "sum"})", R"({"type": "adagrad", "lr": 0.05})"));
  c.train.batch_size = 128;
  pipeline(c);
  // The wide part has a weight table for each crossed feature (1001 rows: 1000 buckets + 0).
  const std::string meta = run("cat " + dir_ + "/data/dataset.json");
  EXPECT_NE(meta.find("C1_X_C2"), std::string::npos) << meta;
  auto m = build_model(c.model, c.optimizer,
                       io::DatasetInfo::load(dir_ + "/data").layout, Device::cpu(), 1);
  std::map<std::string, Shape> s;
  for (auto& p : m->parameters()) s[p.first] = p.second.shape();
  EXPECT_EQ(s.at("wide.26.weight"), (Shape{1001, 1}));
  EXPECT_EQ(s.at("wide.27.weight"), (Shape{1001, 1}));
  EXPECT_FALSE(s.count("emb.26.weight"));
}

TEST_F(GraphCli, ResumeEqualsUninterruptedRun) {
  etl(std::string(DLREC_SOURCE_DIR) + "/configs/etl_criteo.json");
  RunConfig c = load_config("criteo_sample_dcnv2.json");
  c.train.batch_size = 100;
  c.optimizer = OptimizerConfig();
  c.optimizer.type = "adagrad";
  c.optimizer.lr = 0.02;
  c.train.max_steps = 16;
  const std::string whole = train(c, "whole");
  c.train.max_steps = 8;
  train(c, "split");
  c.train.max_steps = 16;
  const std::string resumed = train(c, "split", /*resume=*/true);
  auto auc = [](const std::string& out) {
    const size_t at = out.rfind("AUC=");
    return at == std::string::npos ? std::string("none") : out.substr(at, 12);
  };
  EXPECT_NE(auc(whole), "none") << whole;
  EXPECT_EQ(auc(whole), auc(resumed)) << whole << "\n---\n" << resumed;
  // The evaluation lines without their timing ("(0.1s)" on a busy machine).
  auto untimed = [](std::string out) {
    for (size_t at; (at = out.find(" (")) != std::string::npos;) {
      const size_t end = out.find("s)", at);
      if (end == std::string::npos) break;
      out.erase(at, end + 2 - at);
    }
    return out;
  };
  EXPECT_EQ(untimed(run(bin_ + " eval --run " + dir_ + "/whole")),
            untimed(run(bin_ + " eval --run " + dir_ + "/split")));
}

}  // namespace
}  // namespace dlrec::model
