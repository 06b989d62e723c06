// The compressed records of an export (2:4 masks, INT8 weights and scales) read for a model
// that serves them through model::Model::set_compressed (the CUDA engine; docs/COMPRESSION.md,
// "Compressed layers on the GPU"). The CPU engine takes them through prunable_weights().
#pragma once

#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/model/model.h"

namespace dlrec::compress {

// The weights `meta` (weights.dlrec's meta) lists under "masks" and "quant", read from `path`
// with the shapes of the model's parameters of those names, checked as the CPU loader checks
// them: a mask holds only 0 and 1, an int8 value is in -127 .. 127, a scale is finite and > 0
// (each an error naming the file, the tensor and the element). Empty when the file has none.
std::vector<model::CompressedWeight> read_compressed_weights(const json& meta,
                                                             const std::string& path,
                                                             model::Model& model);

}  // namespace dlrec::compress
