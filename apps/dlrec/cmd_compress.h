// dlrec compress --quantize (cmd_compress_quant.cc), called by cmd_compress.cc.
#pragma once

#include <string>

namespace dlrec::cli {

struct QuantizeArgs {
  std::string run, out, layers, skip, calibration, calib_data;
  double percentile = -1;                             // < 0: the config's (or the default)
  int64_t calib_batches = -1, calib_batch_size = -1;  // < 0: the config's (or the default)
  bool overwrite = false;
  bool int8_layers = true;  // --quantize: the mlp/cross layers (false: --embeddings alone)
  // --embeddings int8|int4, --embedding-tables a,b, --embedding-scale fp32|fp16
  std::string embeddings, embedding_tables, embedding_scale;
};

// Calibrates and quantizes RUN's checkpoint to INT8 and writes an export to `out` with
// quant_report.json in it (docs/COMPRESSION.md).
int run_compress_quantize(const QuantizeArgs& a);

}  // namespace dlrec::cli
