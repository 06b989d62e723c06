// Models built from a graph of named layers (model.arch = "graph"; docs/MODELS.md).
//
//   "model": {"arch": "graph", "layers": [
//     {"name": "dense", "type": "dense"},
//     {"name": "emb",   "type": "embedding", "dim": 16},
//     {"name": "deep",  "type": "mlp", "input": "dense", "sizes": [64, 16], "relu_last": true},
//     {"name": "inter", "type": "dot", "inputs": ["deep", "emb"]},
//     {"name": "top",   "type": "mlp", "input": "inter", "sizes": [64, 1]},
//     {"name": "logit", "type": "output", "input": "top"}]}
//
// GraphSpec::parse checks what needs no data layout (keys, types, names, inputs, cycles, the
// one output); build_graph_model checks the shapes against the layout.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/model/model.h"

namespace dlrec::model {

// A hashed (dynamic) embedding table instead of a fixed one (docs/EMBEDDINGS.md): raw ids,
// insert on first sight, LRU eviction at `capacity` rows.
struct HashedSpec {
  bool on = false;
  int64_t capacity = 0;          // rows; clamped to the feature's cardinality at build time
  std::string eviction = "lru";  // the only policy
  double init_scale = -1;        // rows start uniform in [-s, s); < 0: sqrt(1 / capacity)
};

// Per-table settings of an embedding or wide layer ("tables": {"<feature>": {...}}).
struct TableSpec {
  json optimizer;     // override object over the layer's optimizer; null: none
  HashedSpec hashed;  // embedding layers only; off: the layer's setting
  std::string where;  // "model.layers[1] (layer 'emb', embedding): tables.3" for messages
};

struct LayerSpec {
  std::string name, type;
  std::vector<std::string> inputs;
  std::vector<int> input_ids;       // indices of the inputs in GraphSpec::layers
  std::string input_key = "input";  // the key that named them ("input" or "inputs")
  std::string where;  // "model.layers[3] ('top', mlp)": the prefix of this layer's errors
  bool has_init_tag = false;
  uint64_t init_tag = 0;  // seeds the layer's parameters: derive_seed(run seed, init_tag)
  // embedding / wide
  bool all_features = true;
  std::vector<int64_t> features;  // categorical feature indices when !all_features
  int64_t dim = 16;
  std::vector<int64_t> dims;  // per selected feature (embedding), overrides dim when set
  std::string pooling = "sum";
  // Optimizer override (a JSON object of optimizer keys, docs/MODELS.md) for the layer's
  // parameters; null: the optimizer section's.
  json optimizer;
  // embedding: hashed tables for every feature of the layer (per table: tables[f].hashed)
  HashedSpec hashed;
  // embedding / wide: per-feature settings, by categorical feature index
  std::map<int64_t, TableSpec> tables;
  // mlp
  std::vector<int64_t> sizes;
  bool relu_last = false;
  // cross
  int64_t num_layers = 1;
  int64_t low_rank = 0;
};

struct GraphSpec {
  std::vector<LayerSpec> layers;  // as listed
  std::vector<int> order;         // a topological order (inputs before their consumers)
  int output = -1;                // index of the "output" layer
  // `layers` is the JSON list, `path` its config path ("model.layers") for messages.
  static GraphSpec parse(const json& layers, const std::string& path);
};

// The optimizer of a layer or table: `override_json` (an object of optimizer keys, see
// docs/MODELS.md) over `base`; `path` names it in errors ("model.layers[2].optimizer").
// `dense`: the parameters are dense ones (weight_decay allowed). Unknown keys, keys that only
// the optimizer section may hold (schedule, clip_norm, ...) and bad values are errors.
OptimizerConfig layer_optimizer(const OptimizerConfig& base, const json& override_json,
                                const std::string& path, bool dense);

// The layer types GraphSpec knows.
const std::vector<std::string>& graph_layer_types();

// The graph of arch "dlrm" for data of this layout (src/model/presets.cc): layers "dense",
// "bottom" (mlp, init_tag 1; absent without bottom_mlp or dense features), "emb" (embedding,
// init_tag 3), "inter" (dot, or concat for interaction "cat"), "top" (mlp, init_tag 2) and
// "logit". DLRM's own checks (the dot interaction's widths, ...) are errors here.
json dlrm_graph_layers(const ModelConfig& model, const io::ShardLayout& layout);

// What the CUDA graph engine does not support in this graph at this precision ("" when it runs
// it): the first layer, optimizer or precision it refuses, with the layer's config path
// ("model.layers[2] (layer 'emb', embedding): key 'dims': ..."). Asked before anything is built
// (make_graph_cuda refuses with this message); tests/parity chooses its GPU cases by it. Shape
// errors of the graph are thrown as when it is built.
std::string graph_cuda_unsupported(const GraphSpec& spec, const OptimizerConfig& opt,
                                   const io::ShardLayout& layout, const std::string& precision);

std::unique_ptr<Model> build_graph_model(const ModelConfig& model, const OptimizerConfig& opt,
                                         const io::ShardLayout& layout, Device device,
                                         uint64_t seed);

}  // namespace dlrec::model
