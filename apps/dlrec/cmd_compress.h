// dlrec compress --quantize (cmd_compress_quant.cc), called by cmd_compress.cc.
#pragma once

#include <string>

#include "dlrec/train/trainer.h"

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

// The trained run a compress command reads (cmd_compress.cc): its run.json, dataset directory
// and checkpoint; no run.json, no checkpoint or an --out equal to --run are errors.
struct CompressSource {
  train::RunInfo info;
  std::string data_dir, ckpt;
};
CompressSource open_compress_source(const std::string& run, const std::string& out);

// Calibrates and quantizes RUN's checkpoint to INT8 and writes an export to `out` with
// quant_report.json in it (docs/COMPRESSION.md).
int run_compress_quantize(const QuantizeArgs& a);

}  // namespace dlrec::cli
