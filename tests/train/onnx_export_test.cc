// ONNX export (include/dlrec/train/onnx_export.h): every registered layer type has an emitter,
// a type without one is an error naming the layer, and the inputs' encoding. onnxruntime checks
// the exported models' predictions in tests/python/test_onnx_export.py.
#include "dlrec/train/onnx_export.h"

#include <gtest/gtest.h>

#include "dlrec/model/graph.h"
// The registry and the exporter's lookup are internal (the test removes an emitter to see the
// error).
#include "../../src/train/onnx_export_impl.h"
#include "test_errors.h"

namespace dlrec::train {
namespace {

using dlrec::testing::expect_error;

io::ShardLayout small_layout() {
  io::ShardLayout l;
  l.num_dense = 3;
  l.cardinalities = {10, 20, 30};
  l.multi_hot = {false, true, false};
  return l;
}

model::ModelConfig dlrm_config() {
  model::ModelConfig c;
  c.embedding_dim = 4;
  c.bottom_mlp = {8, 4};
  c.top_mlp = {8, 1};
  return c;
}

TEST(OnnxExport, EveryRegisteredLayerTypeHasAnEmitter) {
  for (const model::LayerType* t : model::layer_registry())
    EXPECT_TRUE(static_cast<bool>(t->to_onnx))
        << "layer type '" << t->name << "' has no ONNX export (to_onnx)";
}

TEST(OnnxExport, WritesAModelForEveryPreset) {
  const io::ShardLayout layout = small_layout();
  for (const std::string& arch : model::preset_archs()) {
    model::ModelConfig c = dlrm_config();
    c.arch = arch;
    if (arch != "dlrm") c.bottom_mlp = {8, 4};
    auto m = model::build_model(c, model::OptimizerConfig(), layout, Device::cpu(), 1);
    const std::string bytes = onnx_model_bytes(c, layout, *m);
    EXPECT_GT(bytes.size(), 1000u) << arch;
    // The graph's inputs and outputs by name (protobuf strings are stored as they are).
    for (const char* name :
         {"dense", "cat", "cat_1_ids", "cat_1_offsets", "logit", "probability", "ai.onnx.ml"})
      EXPECT_NE(bytes.find(name), std::string::npos) << arch << ": " << name;
  }
}

TEST(OnnxExport, LayerTypeWithoutEmitterIsAnErrorNamingTheLayer) {
  // A newly registered type that has no to_onnx yet: the registry with fm's emitter removed.
  model::LayerType fm_without = model::layer_type("fm");
  fm_without.to_onnx = nullptr;
  const LayerTypeLookup lookup = [&](const std::string& name) -> const model::LayerType& {
    return name == "fm" ? fm_without : model::layer_type(name);
  };
  model::ModelConfig c = dlrm_config();
  c.arch = "deepfm";
  const io::ShardLayout layout = small_layout();
  auto m = model::build_model(c, model::OptimizerConfig(), layout, Device::cpu(), 1);
  expect_error(
      [&] { onnx_model_bytes_with(c, layout, *m, lookup, INT64_MAX, ""); },
      {"ONNX export: model.layers[3] (layer 'fm', fm)", "layer type 'fm' has no ONNX export"});
  EXPECT_NO_THROW(onnx_model_bytes_with(c, layout, *m, model::layer_type, INT64_MAX, ""));
}

TEST(OnnxExport, WeightsTooLargeToHoldInlineAreAnError) {
  model::ModelConfig c = dlrm_config();
  const io::ShardLayout layout = small_layout();
  auto m = model::build_model(c, model::OptimizerConfig(), layout, Device::cpu(), 1);
  // A 1-byte limit stands for protobuf's 2 GB: with nowhere to put external data, an error.
  expect_error([&] { onnx_model_bytes_with(c, layout, *m, model::layer_type, 1, ""); },
               {"ONNX export: the model's weights take", "--onnx-external-data"});
}

TEST(OnnxExport, InputsOfABatch) {
  const io::ShardLayout layout = small_layout();
  io::Batch b;
  b.reset(3, 3);
  b.rows = 2;
  b.dense = {1, 2, 3, 4, 5, 6};
  b.cat_offsets = {{0, 1, 2}, {0, 3, 3}, {0, 1, 2}};
  b.cat_indices = {{4, 5}, {7, 8, 9}, {11, 12}};
  const json j = onnx_inputs_json(b, layout);
  EXPECT_EQ(j.at("dense"), json::parse("[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]"));
  // Column 1 (multi-hot) is not read: 0.
  EXPECT_EQ(j.at("cat"), json::parse("[[4, 0, 11], [5, 0, 12]]"));
  EXPECT_EQ(j.at("cat_1_ids"), json::parse("[7, 8, 9]"));
  EXPECT_EQ(j.at("cat_1_offsets"), json::parse("[0, 3, 3]"));
  // A one-hot feature with two ids in a row cannot be a column of "cat".
  b.cat_offsets[0] = {0, 2, 2};
  expect_error([&] { onnx_inputs_json(b, layout); }, {"one-hot feature 0 has 2 ids in row 0"});
}

}  // namespace
}  // namespace dlrec::train
