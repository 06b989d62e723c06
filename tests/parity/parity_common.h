// The parity harness's shared part (docs/PARITY.md): the table of layer cases and the helpers
// that build, run and read a case's model. The checks are in parity_test.cc (CPU: finite
// differences, optimizers, the registry) and parity_gpu_test.cc (GPU against the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/model/model.h"

namespace dlrec::parity {

struct Size {
  int64_t dim;    // the width under test: substituted for $D in the case's model JSON
  int64_t batch;  // rows per batch
};

struct LayerCase {
  std::string name;   // gtest name part
  std::string model;  // the "model" section, $D standing for Size::dim
  bool multi_hot;     // bags of 0..3 ids (empty bags too) in every other feature, else one id
  std::vector<Size> sizes;
  // The registered layer types (model::graph_layer_types) this case is about; "preset:<arch>"
  // for a preset. Registry.EveryLayerTypeHasACase fails for a type no case names.
  std::vector<std::string> layers;
};

struct OptCase {
  const char* name;
  const char* json;
};

// Data layout of every case: 5 dense features, 3 small tables (duplicate ids in a batch are the
// rule).
io::ShardLayout layout();

// The cases; Registry.EveryLayerTypeHasACase checks that every layer type has one.
const std::vector<LayerCase>& cases();

// The case's "model" section with $D replaced by `dim`, and `optimizer` (a JSON object).
model::RunConfig config(const LayerCase& c, int64_t dim, const std::string& optimizer);

// A batch of the case's kind (multi-hot or not) of `rows` rows.
io::Batch batch_of(const LayerCase& c, int64_t rows, uint64_t seed);

std::unique_ptr<model::Model> build(const model::RunConfig& cfg, Device dev, uint64_t seed,
                                    const std::string& precision = "fp32");

// SGD with learning rate 1 for every parameter: one step subtracts the gradient.
extern const char* const kUnitSgd;

// Every parameter's values, in the model's order.
std::vector<std::vector<float>> values(model::Model& m);

// dL/dw of every parameter for dlogits `r`, at the parameters of `m`, read out of one SGD step
// (lr 1) of `twin` (a model of the same config with kUnitSgd) after copying them into it.
std::vector<std::vector<double>> gradients(model::Model& twin, model::Model& m,
                                           const io::Batch& b, const Tensor& r);

}  // namespace dlrec::parity
