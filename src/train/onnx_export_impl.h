// The ONNX exporter over a given layer-type lookup (onnx_export.cc): onnx_model_bytes passes the
// registry's (model::layer_type); tests pass one in which a type has no emitter, as a newly
// added type would, to see the error.
#pragma once

#include <functional>
#include <string>

#include "../model/layers/layer.h"  // relative: tests include this header too
#include "dlrec/model/model.h"

namespace dlrec::train {

using LayerTypeLookup = std::function<const model::LayerType&(const std::string& name)>;

// Constants of at least 1 KiB go to `external_path` (ONNX external data, named in the model by
// its file name) when their total exceeds `inline_limit` bytes; with an empty `external_path`
// that is an error.
std::string onnx_model_bytes_with(const model::ModelConfig& config, const io::ShardLayout& layout,
                                  model::Model& model, const LayerTypeLookup& type_of,
                                  int64_t inline_limit, const std::string& external_path);

}  // namespace dlrec::train
