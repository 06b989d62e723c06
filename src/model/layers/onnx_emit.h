// ONNX export of the layer registry (docs/EXPORT.md, "ONNX"): each layer type's to_onnx (declared
// beside the layer in src/model/layers/<type>.cc) appends the ONNX nodes that compute its output
// from its inputs' values to an OnnxGraph. OnnxGraph is a plain description of the graph (nodes,
// constants); src/train/onnx_export.cc turns it into the ONNX protobuf, so this module needs no
// protobuf.
//
// Values are row-major [N, width] float tensors, N the batch (a symbolic dimension). The model's
// inputs (OnnxEmit::dense, OnnxEmit::ids) are the graph's inputs:
//   dense   float [N, num_dense]
//   cat     int64 [N, T]: one id per row for each one-hot categorical feature (column t =
//           feature t; the columns of multi-hot features are not read)
//   cat_<t>_ids int64 [nnz], cat_<t>_offsets int64 [N + 1]: a multi-hot feature t as CSR (the
//           ids of row r are ids[offsets[r] .. offsets[r + 1]); offsets[0] = 0)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/graph.h"

namespace dlrec::model {

struct ValueShape;

struct OnnxAttr {
  enum class Kind { Int, Float, Ints, String };
  std::string name;
  Kind kind = Kind::Int;
  int64_t i = 0;
  float f = 0;
  std::vector<int64_t> ints;
  std::string s;
  static OnnxAttr integer(const std::string& n, int64_t v);
  static OnnxAttr real(const std::string& n, float v);
  static OnnxAttr integers(const std::string& n, std::vector<int64_t> v);
  static OnnxAttr text(const std::string& n, const std::string& v);
};

struct OnnxNode {
  std::string op, domain;  // domain "" is the default ONNX operator set
  std::vector<std::string> inputs, outputs;
  std::vector<OnnxAttr> attrs;
};

// A constant of the graph: a CPU tensor of F32, I32 or I64.
struct OnnxConstant {
  std::string name;
  Tensor value;
};

class OnnxGraph {
 public:
  // A value name not used yet, from `hint` ("top.0.gemm" -> "top.0.gemm", then
  // "top.0.gemm_1", ...).
  std::string unique(const std::string& hint);
  // Adds a constant; returns its (unique) name.
  std::string constant(const std::string& hint, Tensor value);
  std::string ints(const std::string& hint, const std::vector<int64_t>& v);  // int64 [n]
  std::string scalar(const std::string& hint, float v);                      // float [1]
  // Adds a node with one output named from `hint`; returns the output's name.
  std::string op(const std::string& type, const std::vector<std::string>& inputs,
                 const std::string& hint, std::vector<OnnxAttr> attrs = {},
                 const std::string& domain = "");
  const std::vector<OnnxNode>& nodes() const { return nodes_; }
  const std::vector<OnnxConstant>& constants() const { return constants_; }
  // Marks names as taken (the graph's inputs).
  void reserve(const std::string& name);

 private:
  std::vector<OnnxNode> nodes_;
  std::vector<OnnxConstant> constants_;
  std::vector<std::string> taken_;
};

// A categorical feature's ids in the graph.
struct OnnxIds {
  bool multi_hot = false;
  std::string ids;      // one-hot: int64 [N]; multi-hot: int64 [nnz]
  std::string offsets;  // multi-hot: int64 [N + 1]
};

// What a layer's to_onnx gets.
struct OnnxEmit {
  const LayerSpec& spec;
  const std::vector<ValueShape>& in;  // the inputs' shapes
  const ValueShape& shape;            // the output's
  const io::ShardLayout& layout;
  const std::vector<std::string>& inputs;  // the inputs' values, [N, in[i].width]
  OnnxGraph& g;
  // The model's tensor `name` (as Model::parameters() names it: "top.0.weight"), on the CPU;
  // fails naming it when the model has none.
  std::function<Tensor(const std::string& name)> param;
  std::function<std::string()> dense;           // float [N, num_dense]
  std::function<OnnxIds(int64_t feature)> ids;  // categorical feature's ids
};

// Shared pieces of the emitters (onnx_emit.cc).
// Pools rows of `table` (a value float [R, d]) over the bags of `ids` (sum or mean; an empty bag
// gives zeros) -> [N, d].
std::string onnx_pooled_lookup(OnnxGraph& g, const OnnxIds& ids, const std::string& table,
                               int64_t dim, const std::string& pooling, const std::string& hint);
// A fixed or hashed table of an embedding or wide layer: the parameter "<layer>.<feature>"'s
// rows pooled over the feature's bags -> [N, dim]. Hashed tables map ids to their slots with
// ai.onnx.ml LabelEncoder (unknown ids pool as zeros, as dlrec's inference does).
std::string onnx_table_lookup(OnnxEmit& e, int64_t feature, int64_t dim);
// The inputs side by side [N, sum of widths] (the one input itself when there is one).
std::string onnx_concat(OnnxGraph& g, const std::vector<std::string>& inputs,
                        const std::string& hint);
// x [N, in] times weight [out, in] (transposed) plus bias [out] (optional: "" for none).
std::string onnx_linear(OnnxGraph& g, const std::string& x, const std::string& weight,
                        const std::string& bias, const std::string& hint);

}  // namespace dlrec::model
