// The layer registry (docs/ADDING_A_LAYER.md): every layer type of the graph engine is declared
// once, as one LayerType in src/model/layers/<type>.cc, with
//   - its keys (parse: the type's own keys; the keys every layer has are read by GraphSpec),
//   - its shape inference (infer: the output's width and fields from the inputs' and the data
//     layout; the same for every backend, so shape errors read the same on CPU and CUDA),
//   - its CPU implementation (make_cpu: the reference, always built),
//   - what the CUDA engine supports (cuda_unsupported: a predicate over the layer's keys, the
//     precision and its optimizers, asked before anything is built), and
//   - its CUDA implementation (make_cuda, in <type>_cuda.cu; null in builds without CUDA), and
//   - its ONNX export (to_onnx: the ONNX nodes computing it, onnx_emit.h; null: the type has
//     none, and exporting a model with it is an error naming the layer).
// No code outside the layer's files switches on the type's name: the engines look the type up
// here and call its functions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/graph.h"

namespace dlrec::model {

// What a layer outputs: [B, width], made of fields (vectors) of the given widths. Embedding
// layers output one field per table; concat keeps its inputs' fields; the rest output one.
struct ValueShape {
  int64_t width = 0;
  std::vector<int64_t> fields;
};

namespace cpu_graph {
class Node;
struct Build;
}  // namespace cpu_graph
namespace gpu_graph {
class Node;
struct Build;
}  // namespace gpu_graph

struct OnnxEmit;  // onnx_emit.h

// What the CUDA engine is asked to run for one layer.
struct CudaQuery {
  const LayerSpec& spec;
  const std::vector<ValueShape>& in;  // the inputs' shapes
  const io::ShardLayout& layout;
  std::string precision;             // "fp32" | "tf32" | "bf16" | "fp16"
};

struct LayerType {
  std::string name;
  // 0: reads the batch (no inputs); 1: exactly one input ("input"); -1: one or more ("inputs").
  int arity = -1;
  bool trainable = false;      // has parameters: takes an "optimizer" override
  bool dense_params = false;   // its override may hold weight_decay (mlp, cross)
  bool table_keys = false;     // takes "features", "pooling", "tables" (embedding, wide)
  bool hashed_tables = false;  // takes "hashed" (embedding)
  bool is_output = false;      // the graph's logit ("output"): exactly one per graph
  bool cuda_single = false;    // the CUDA engine runs at most one layer of this type per graph
  // Reads the type's own keys from r into s (unknown keys are left for r.finish()).
  std::function<void(ConfigReader& r, LayerSpec& s)> parse;
  // The output's shape. Errors name the key ("key 'low_rank': ...").
  std::function<ValueShape(const LayerSpec& s, const std::vector<ValueShape>& in,
                           const io::ShardLayout& layout)>
      infer;
  std::function<std::unique_ptr<cpu_graph::Node>(cpu_graph::Build& b)> make_cpu;
  // "" when the CUDA engine runs the layer as configured, else what it does not support
  // (without the layer's name: the caller prefixes it).
  std::function<std::string(const CudaQuery& q)> cuda_unsupported;
  // Null in builds without CUDA.
  std::unique_ptr<gpu_graph::Node> (*make_cuda)(gpu_graph::Build& b) = nullptr;
  // Appends the layer's ONNX nodes; returns the name of its output value [N, width].
  std::function<std::string(OnnxEmit& e)> to_onnx;
};

// The registered types, in a fixed order; find_layer_type: null when unknown.
const std::vector<const LayerType*>& layer_registry();
const LayerType* find_layer_type(const std::string& name);
const LayerType& layer_type(const std::string& name);  // throws when unknown

// The layer types (one function per file, src/model/layers/<type>.cc).
const LayerType& dense_layer();
const LayerType& embedding_layer();
const LayerType& wide_layer();
const LayerType& mlp_layer();
const LayerType& cross_layer();
const LayerType& dot_layer();
const LayerType& concat_layer();
const LayerType& fm_layer();
const LayerType& add_layer();
const LayerType& output_layer();

// The CUDA factories (src/model/layers/<type>_cuda.cu), for the LayerType declarations.
#ifdef DLREC_WITH_CUDA
#define DLREC_CUDA_LAYER(fn) (&fn)
namespace gpu_graph {
std::unique_ptr<Node> make_dense(Build& b);
std::unique_ptr<Node> make_embedding(Build& b);
std::unique_ptr<Node> make_wide(Build& b);
std::unique_ptr<Node> make_mlp(Build& b);
std::unique_ptr<Node> make_cross(Build& b);
std::unique_ptr<Node> make_dot(Build& b);
std::unique_ptr<Node> make_concat(Build& b);
std::unique_ptr<Node> make_fm(Build& b);
std::unique_ptr<Node> make_add(Build& b);
std::unique_ptr<Node> make_output(Build& b);
}  // namespace gpu_graph
#else
#define DLREC_CUDA_LAYER(fn) nullptr
#endif

// Shared pieces of the layer declarations (registry.cc).
std::vector<int64_t> read_int_list(ConfigReader& r, const std::string& key, int64_t lo,
                                   int64_t hi, bool allow_empty);
// The categorical features a table layer reads, checked against the layout.
std::vector<int64_t> table_features(const LayerSpec& s, const io::ShardLayout& layout);
// The fields of the inputs of a dot or fm interaction: all of one width d; returns {n, d}.
// `hint` ends the message when the widths differ.
std::pair<int64_t, int64_t> interaction_fields(const LayerSpec& s,
                                               const std::vector<ValueShape>& in,
                                               const std::string& hint);
// A hashed-table object of a layer or table ("hashed": {...}; graph_config.cc).
HashedSpec parse_hashed(ConfigReader& parent, const std::string& key);
// "[16, 16, 8]" (at most 8 widths).
std::string fields_str(const ValueShape& s);
// The CUDA engine reads every categorical feature in order in a table layer ("" if so).
std::string cuda_all_features(const LayerSpec& s, const io::ShardLayout& layout);
// In bf16, layers with GEMMs read their input in the compute type ("" if they can).
std::string cuda_compute_type_input(const CudaQuery& q);

}  // namespace dlrec::model
