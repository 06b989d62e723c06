// ONNX export of any engine model (docs/EXPORT.md, "ONNX"): `dlrec export --onnx` writes
// model.onnx beside model.json. The graph is built from the layer registry (each layer type's
// to_onnx, src/model/layers/<type>.cc); a layer type without one is an error naming the layer.
//
// The ONNX model (opset 17, IR version 8, plus ai.onnx.ml 3 for hashed tables' LabelEncoder)
// takes the encoded features (after the workflow), N rows:
//   dense                 float [N, num_dense]     (when the data has dense features)
//   cat                   int64 [N, T]             (when a categorical feature is one-hot: column
//                                                   t holds feature t's id; columns of multi-hot
//                                                   features are not read)
//   cat_<t>_ids           int64 [nnz]              (multi-hot feature t: its ids, row by row)
//   cat_<t>_offsets       int64 [N + 1]            (row r's ids are ids[offsets[r] ..
//   offsets[r+1]),
//                                                   offsets[0] = 0)
// and gives
//   logit                 float [N]
//   probability           float [N]                (sigmoid of the logit: what dlrec predict gives)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/batch.h"
#include "dlrec/model/model.h"

namespace dlrec::train {

constexpr int kOnnxOpset = 17;

// The serialized ONNX ModelProto of `model` (its current parameters; any device), a model of
// `config` for data of `layout`, weights inside (a protobuf file holds at most 2 GB).
std::string onnx_model_bytes(const model::ModelConfig& config, const io::ShardLayout& layout,
                             model::Model& model);

// Where write_onnx_model puts the weights: inside model.onnx, in model.onnx.data beside it (ONNX
// external data), or the latter when they exceed kOnnxInlineLimit bytes (auto).
enum class OnnxWeights { Auto, Inline, External };
constexpr int64_t kOnnxInlineLimit = int64_t{1} << 30;

// Writes <dir>/model.onnx and, with external weights, <dir>/model.onnx.data (`dir` exists; the
// caller makes the directory appear atomically, as export_model does).
void write_onnx_model(const std::string& dir, const model::ModelConfig& config,
                      const io::ShardLayout& layout, model::Model& model,
                      OnnxWeights weights = OnnxWeights::Auto);

// The ONNX model's inputs for an encoded batch, as JSON: {"dense": [[...], ...], "cat": [[...]],
// "cat_<t>_ids": [...], "cat_<t>_offsets": [...]} (the names and shapes above).
json onnx_inputs_json(const io::Batch& batch, const io::ShardLayout& layout);

// Raw text lines (as in the logs, the workflow's schema) encoded by the workflow into one batch;
// `source` names the input in errors.
io::Batch encode_lines(const etl::Workflow& wf, const std::vector<std::string>& lines,
                       const std::string& source);

}  // namespace dlrec::train
