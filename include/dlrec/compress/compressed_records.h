// The compressed records of an export (2:4 masks, INT8 weights and scales) read for a model
// that serves them through model::Model::set_compressed (the CUDA engine; docs/COMPRESSION.md,
// "Compressed layers on the GPU"). The CPU engine takes them through prunable_weights().
// And the row-wise quantized tables' records (codes, scales, biases), written and read for
// model::Model::set_quantized_tables (any engine).
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

// A quantized table's tensors in weights.dlrec, beside no fp32 values: "<name>.codes" (U8
// [rows, row_bytes]), "<name>.qscale" and "<name>.qbias" (F32, or F16 when q.fp16, [rows]).
std::vector<model::NamedTensor> quantized_table_tensors(const std::string& name,
                                                        const nn::RowQuantRows& q);
// The entry of such a table in the meta's "embedding_quant" list.
json quantized_table_meta(const std::string& name, const nn::RowQuantRows& q);
// The tables the meta lists under "embedding_quant" (empty when none), read from `path` with
// the shapes of the model's parameters of those names and checked (nn::check_row_quant). Errors
// name the file and the table: a malformed entry, a name that is not a 2-d parameter of the
// model, a tensor missing or of another shape, a bad record.
std::vector<model::QuantizedTable> read_quantized_tables(const json& meta, const std::string& path,
                                                         model::Model& model);

}  // namespace dlrec::compress
