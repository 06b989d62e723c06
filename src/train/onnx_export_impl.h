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

std::string onnx_model_bytes_with(const model::ModelConfig& config, const io::ShardLayout& layout,
                                  model::Model& model, const LayerTypeLookup& type_of);

}  // namespace dlrec::train
