// The parity harness's case table and helpers (parity_common.h).
#include "parity/parity_common.h"

#include <gtest/gtest.h>

#include "dlrec/model/graph.h"
#include "model/test_batches.h"

namespace dlrec::parity {

using model::Model;
using model::RunConfig;

// ---------------------------------------------------------------------------------------------
// The cases.

// Data layout of every case: 5 dense features, 3 small tables (duplicate ids in a batch are the
// rule).
io::ShardLayout layout() { return model::testing::make_layout(5, {11, 4, 23}); }

namespace {

std::string graph(const std::string& layers) {
  return R"({"arch": "graph", "layers": [)" + layers + "]}";
}

const std::vector<Size> kOdd = {{4, 1}, {5, 7}, {8, 33}};

}  // namespace

const std::vector<LayerCase>& cases() {
  static const std::vector<LayerCase> c = {
      {"embedding_onehot_sum",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       false, kOdd, {"embedding", "output"}},
      {"embedding_multihot_sum",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"embedding"}},
      {"embedding_multihot_mean",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D, "pooling": "mean"},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"embedding"}},
      // Per-table widths and a subset of the features: CPU only.
      {"embedding_dims_subset",
       graph(R"({"name": "emb", "type": "embedding", "features": [2, 0], "dims": [3, $D]},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"embedding"}},
      {"linear",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "lin", "type": "mlp", "input": "dense", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "lin"})"),
       false, kOdd, {"dense", "mlp"}},
      {"mlp_relu",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "deep", "type": "mlp", "input": "dense", "sizes": [$D, 3, 1]},
                {"name": "logit", "type": "output", "input": "deep"})"),
       false, kOdd, {"mlp"}},
      {"mlp_relu_last",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [7, $D],
                 "relu_last": true},
                {"name": "top", "type": "mlp", "input": "bottom", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       false, kOdd, {"mlp"}},
      {"dot",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [7, $D],
                 "relu_last": true},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
                {"name": "top", "type": "mlp", "input": "inter", "sizes": [5, 1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"dot"}},
      {"concat",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x", "type": "concat", "inputs": ["emb", "dense"]},
                {"name": "top", "type": "mlp", "input": "x", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"concat"}},
      {"add",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "a", "type": "mlp", "input": "dense", "sizes": [3, 1]},
                {"name": "b", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "sum", "type": "add", "inputs": ["a", "b"]},
                {"name": "logit", "type": "output", "input": "sum"})"),
       true, kOdd, {"add"}},
      {"cross_full_stacked",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
                {"name": "top", "type": "mlp", "input": "cross", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"cross"}},
      {"cross_lowrank_stacked",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2,
                 "low_rank": 3},
                {"name": "top", "type": "mlp", "input": "cross", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"cross"}},
      {"cross_full_parallel",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D, "pooling": "mean"},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
                {"name": "deep", "type": "mlp", "input": "x0", "sizes": [7], "relu_last": true},
                {"name": "both", "type": "concat", "inputs": ["cross", "deep"]},
                {"name": "head", "type": "mlp", "input": "both", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "head"})"),
       true, kOdd, {"cross"}},
      {"cross_lowrank_parallel",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 3,
                 "low_rank": 2},
                {"name": "deep", "type": "mlp", "input": "x0", "sizes": [7], "relu_last": true},
                {"name": "both", "type": "concat", "inputs": ["cross", "deep"]},
                {"name": "head", "type": "mlp", "input": "both", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "head"})"),
       true, kOdd, {"cross"}},
      {"fm",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D},
                {"name": "fm", "type": "fm", "inputs": ["emb"]},
                {"name": "logit", "type": "output", "input": "fm"})"),
       true, kOdd, {"fm"}},
      {"wide",
       graph(R"({"name": "wide", "type": "wide"},
                {"name": "logit", "type": "output", "input": "wide"})"),
       true, kOdd, {"wide"}},
      // arch "dlrm": the preset graph (src/model/presets.cc) on the CPU and the CUDA graph
      // engine (the CUDA DLRM class that CUDA ran before needed 16-bit MLP sizes that are
      // multiples of 8, hence the widths 8 and 16).
      {"dlrm_preset",
       R"({"arch": "dlrm", "embedding_dim": $D, "bottom_mlp": [16, $D], "top_mlp": [8, 1]})",
       true, {{8, 1}, {8, 7}, {16, 33}}, {"preset:dlrm"}},
  };
  return c;
}

std::string substitute(std::string s, int64_t dim) {
  const std::string d = std::to_string(dim);
  for (size_t p; (p = s.find("$D")) != std::string::npos;) s.replace(p, 2, d);
  return s;
}

RunConfig config(const LayerCase& c, int64_t dim, const std::string& optimizer) {
  return RunConfig::from_json(json::parse(R"({"model": )" + substitute(c.model, dim) +
                                          R"(, "optimizer": )" + optimizer + "}"));
}

io::Batch batch_of(const LayerCase& c, int64_t rows, uint64_t seed) {
  return model::testing::make_batch(layout(), rows, seed, c.multi_hot);
}

std::unique_ptr<Model> build(const RunConfig& cfg, Device dev, uint64_t seed,
                             const std::string& precision) {
  return model::build_model(cfg.model, cfg.optimizer, layout(), dev, seed, precision);
}

const char* const kUnitSgd = R"({"type": "sgd", "lr": 1.0})";

std::vector<std::vector<float>> values(Model& m) {
  std::vector<std::vector<float>> v;
  for (auto& [name, t] : m.parameters()) v.push_back(t.to_vector<float>());
  return v;
}

// dL/dw of every parameter for dlogits `r`, at the model's current parameters, read out of one
// SGD step (lr 1) of `twin` (a model of the same config with kUnitSgd) after copying the
// parameters of `m` into it.
std::vector<std::vector<double>> gradients(Model& twin, Model& m, const io::Batch& b,
                                           const Tensor& r) {
  auto pt = twin.parameters(), pm = m.parameters();
  EXPECT_EQ(pt.size(), pm.size());
  for (size_t i = 0; i < pt.size(); ++i) pt[i].second.copy_from(pm[i].second);
  auto before = values(twin);
  twin.forward(b, true);
  twin.backward_and_update(r, 1.0);
  auto after = values(twin);
  std::vector<std::vector<double>> g(before.size());
  for (size_t i = 0; i < before.size(); ++i)
    for (size_t k = 0; k < before[i].size(); ++k)
      g[i].push_back(double(before[i][k]) - double(after[i][k]));
  return g;
}

}  // namespace dlrec::parity
