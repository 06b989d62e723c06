// INT8 post-training quantization of the engine's mlp and cross weights (docs/COMPRESSION.md).
//
// The config section (validated by QuantizeConfig::from_json, inside "compress"):
//
//   "compress": {"quantize": {
//       "dtype": "int8",                         // the only one
//       "layers": "all_dense" | ["top", "cross"],  // graph layers (mlp or cross), as sparsity
//       "skip": ["top.1", "bottom"],             // opt-out: layer names or weights ("top.1")
//       "calibration": "max" | "percentile" | "entropy",
//       "percentile": 99.99,                     // calibration "percentile": in (50, 100)
//       "batches": 16, "batch_size": 4096}}      // calibration data: N batches of the shards
//
// A quantized Linear y = act(x W^T + b) computes
//   qx = clamp(rint(x * (1 / sx)), -127, 127)           (per tensor, sx from calibration)
//   qw[j, k] = clamp(rint(W[j, k] / sw[j]), -127, 127)  (per output channel, sw[j] = max|W_j|/127)
//   acc[r, j] = sum_k qx[r, k] * qw[j, k]               (int8 x int8 -> exact int32)
//   y[r, j] = act(float(acc[r, j]) * (sx * sw[j]) + b[j])   (dequantize, bias, ReLU fused)
// The same arithmetic on the CPU (AVX2 kernel or the scalar reference) gives the same bits.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/core/tensor.h"
#include "dlrec/io/batch.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/linear.h"

namespace dlrec::compress {

struct QuantizeConfig {
  bool on = false;
  bool all_dense = true;
  std::vector<std::string> layers;  // when !all_dense
  std::vector<std::string> skip;    // layer names or weight names without ".weight"
  std::string calibration = "entropy";
  double percentile = 99.99;
  int64_t batches = 16;
  int64_t batch_size = 4096;
  json to_json() const;
  // `section` is compress.quantize; `path` the key path for errors ("compress.quantize").
  static QuantizeConfig from_json(ConfigReader& r);
  // Checks calibration and percentile (also for values set from the command line).
  void validate(const std::string& where) const;
};

// ---- The quantized arithmetic (the CPU reference the parity harness uses) ----

// Per-output-channel symmetric int8 of a weight [out, in]: scales[j] = max|W_j| / 127 (1 for an
// all-zero row), q[j, k] = clamp(rint(W[j, k] / scales[j]), -127, 127). Zeros (2:4 masks) stay 0.
struct Int8Packed;  // the weight in a SIMD kernel's layout (src/compress/int8_gemm_packed.h)
struct QuantWeight {
  int64_t out = 0, in = 0;
  std::vector<int8_t> q;      // [out, in]
  std::vector<float> scales;  // [out]
  // q packed for the fastest SIMD kernel of this CPU, built once by Int8Linear (null otherwise:
  // int8_linear then packs a copy per call).
  std::shared_ptr<const Int8Packed> packed;
};
QuantWeight quantize_weight(const Tensor& weight);

// The int8 value of x at scale s: clamp(rint(x * (1 / s)), -127, 127) (round half to even).
int8_t quantize_value(float x, float inv_scale);

// The CPU kernels of the int8 GEMM. Every one gives the reference's bits: the int32 sums are
// exact in any order, and the quantize and dequantize steps compute the same values.
enum class Int8Kernel {
  Reference,   // scalar
  Avx2,        // int16 pairs, madd into int32, on packed weights: tiles of 4 rows x 16 channels
  Avx512Vnni,  // vpdpbusd (u8 x s8 -> int32) on packed weights, tiles of 8 rows x 32 channels
  Auto,        // the fastest one this CPU runs: Avx512Vnni, else Avx2, else Reference
};
bool int8_kernel_available(Int8Kernel k);
const char* int8_kernel_name(Int8Kernel k);
// What Auto runs on this CPU.
Int8Kernel int8_best_kernel();

// The quantized Linear: y [B, out] = act(dequant(int8 GEMM(quant(x), qw)) + bias), with the
// given kernel (an unavailable one is an error; Reference is what the parity harness takes).
void int8_linear(const Tensor& x, float x_scale, const QuantWeight& w, const Tensor& bias,
                 bool relu, Tensor& y, Int8Kernel kernel = Int8Kernel::Auto);
// acc [rows, out] = qx [rows, in] . qw [out, in]^T in int32, scalar (the reference).
void int8_gemm_reference(const int8_t* qx, const int8_t* qw, int64_t rows, int64_t out, int64_t in,
                         int32_t* acc);

// The inference record of one quantized Linear (nn::Param::quant).
class Int8Linear final : public nn::LinearHook {
 public:
  // Packs the weight for the fastest SIMD kernel of this CPU.
  Int8Linear(QuantWeight w, float x_scale);
  bool forward(const Tensor& x, const Tensor& bias, bool relu, Tensor& y) override;
  std::string kernel() const override;  // "int8 <the kernel int8_linear runs here>"
  const QuantWeight& weight() const { return w_; }
  float x_scale() const { return x_scale_; }

 private:
  QuantWeight w_;
  float x_scale_;
};

// ---- Calibration ----

// A histogram of |x| over [0, range) in `bins` bins (the last holds everything >= range).
struct AbsHistogram {
  double range = 0;
  std::vector<double> counts;
};
// The clipping threshold of a histogram: "max" (the largest |x| seen, `amax`), "percentile"
// (the upper edge of the bin where the cumulative count reaches p % of all), "entropy" (the
// threshold minimising KL(P || Q) between the clipped distribution P and its 128-level
// quantization Q, as TensorRT's entropy calibrator).
double threshold_from_histogram(const AbsHistogram& h, double amax, const std::string& method,
                                double percentile);

// One quantizable weight and what calibration found for it.
struct LayerQuant {
  std::string layer, weight;  // graph layer, parameter ("top.0.weight")
  bool skipped = false;       // opted out (kept fp32)
  double amax = 0;            // largest |input| seen
  double threshold = 0;       // the calibrated clipping range of the input
  float x_scale = 0;          // threshold / 127
  double output_rel_l2 = 0;   // ||y_int8 - y_fp32|| / ||y_fp32|| over the calibration batches
  double weight_rel_l2 = 0;   // ||dequant(qw) - W|| / ||W||
  int64_t zeros = 0;          // weight values that are exactly zero (2:4 masks)
};

// The quantizable weights of a config's layers, each with whether `skip` opts it out. Errors
// (prefixed by `where`, e.g. "compress.quantize") name an unknown layer or skip entry.
std::vector<std::pair<model::PrunableWeight, bool>> select_quant_weights(const QuantizeConfig& cfg,
                                                                         model::Model& model,
                                                                         const std::string& where);

// Calibrates the selected weights of `model` (CPU engine) on `batches` and quantizes them:
// the model's forward runs INT8 for those layers afterwards. Errors: a config naming layers or
// skip entries the model does not have, NaN/Inf activations (naming the layer, batch, row and
// column), a model that cannot hold quantized layers (CUDA).
std::vector<LayerQuant> calibrate_and_quantize(const QuantizeConfig& config, model::Model& model,
                                               const std::vector<io::Batch>& batches);

// Drops every quantization record (the model computes fp32 again) / installs them back.
void set_int8(model::Model& model, const std::vector<LayerQuant>& layers, bool on);

// ---- Files ----
// In a weights file, each quantized weight W has tensors "W.qweight" (U8 [out, in]: the int8
// values' two's-complement bytes), "W.wscale" (F32 [out]) and "W.xscale" (F32 [1]); the meta's
// "quant" lists the weights: {"dtype": "int8", "weights": [...]}.
std::vector<model::NamedTensor> quant_tensors(model::Model& model, json& meta_quant);
// Given the file's meta: the tensors to load for its quantized weights (allocated here), or
// none for a file without "quant". Errors name the file.
std::vector<model::NamedTensor> prepare_quant(const json& meta, const std::string& path,
                                              model::Model& model);
// After loading them: checks (int8 in [-127, 127], scales finite and > 0, naming the file and
// tensor) and installs the INT8 records.
void apply_loaded_quant(const std::vector<model::NamedTensor>& loaded, const std::string& path,
                        model::Model& model);

}  // namespace dlrec::compress
