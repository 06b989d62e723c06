// dlrec compress --quantize (cmd_compress_quant.cc), called by cmd_compress.cc.
#pragma once

#include <string>

namespace dlrec::cli {

struct QuantizeArgs {
  std::string run, out, layers, skip, calibration, calib_data;
  double percentile = -1;                             // < 0: the config's (or the default)
  int64_t calib_batches = -1, calib_batch_size = -1;  // < 0: the config's (or the default)
  bool overwrite = false;
};

// Calibrates and quantizes RUN's checkpoint to INT8 and writes an export to `out` with
// quant_report.json in it (docs/COMPRESSION.md).
int run_compress_quantize(const QuantizeArgs& a);

}  // namespace dlrec::cli
