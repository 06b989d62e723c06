// Row-wise INT8 / 4-bit quantization of embedding tables (docs/COMPRESSION.md), as FBGEMM's
// quantized TBE: per row a scale and a bias (fp32 or fp16),
//   scale = (max_k x[k] - min_k x[k]) / (2^bits - 1),  bias = min_k x[k]
//   q[k]  = clamp(rint((x[k] - bias) / scale), 0, 2^bits - 1)       (0 for a constant row)
//   x'[k] = q[k] * scale + bias
// with scale and bias rounded to fp16 first when scale_bias is "fp16" (q is computed with the
// rounded values). |x - x'| <= scale / 2 for fp32 scale/bias; with fp16 add the bias's fp16
// rounding (<= 2^-11 |bias|) and 2^bits times the scale's (the last level's drift).
//
//   "compress": {"embeddings": {"dtype": "int8" | "int4", "tables": "all" | ["emb.0", ...],
//                               "scale_bias": "fp32" | "fp16"}}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/core/tensor.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/row_quant.h"

namespace dlrec::compress {

struct EmbeddingQuantConfig {
  bool on = false;
  int bits = 8;  // 8 (int8) or 4 (int4)
  bool all_tables = true;
  std::vector<std::string> tables;  // table names ("<layer>.<feature>") when !all_tables
  bool fp16_scale_bias = false;
  json to_json() const;
  static EmbeddingQuantConfig from_json(ConfigReader& r);
};

// One table, quantized row-wise (codes, scale and bias per row: nn/row_quant.h).
using RowQuantTable = nn::RowQuantRows;

RowQuantTable quantize_rows(const Tensor& table, int bits, bool fp16);

// What quantizing one table did.
struct TableQuantReport {
  std::string table;
  int64_t rows = 0, dim = 0;
  double max_abs_err = 0, rel_l2 = 0;
  int64_t fp32_bytes = 0, quant_bytes = 0;
};

// Replaces the selected fixed tables' values by their row-wise quantized values (the model
// then computes exactly what the quantized tables give) and, with `records`, gives their codes
// (for Model::set_quantized_tables and the export). Errors: an unknown table name (listing the
// tables), a model without fixed tables.
std::vector<TableQuantReport> quantize_embedding_tables(
    const EmbeddingQuantConfig& config, model::Model& model,
    std::vector<model::QuantizedTable>* records = nullptr);

}  // namespace dlrec::compress
