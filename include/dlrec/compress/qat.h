// Quantization-aware training and distillation (docs/COMPRESSION.md): the CPU engine (one
// process or data-parallel ranks) and one GPU.
//
//   "compress": {"qat": {
//       "layers": "all_dense" | ["top", "cross"],   // as compress.quantize
//       "skip": ["top.2"],                          // kept fp32 (as compress.quantize.skip)
//       "ema_decay": 0.99},                         // input range: running max, in [0, 1)
//     "distill": {"teacher": "DENSE_MODEL_DIR", "alpha": 0.5, "temperature": 2.0}}
//
// QAT: each selected Linear computes y = act(fq_x(x) fq_w(W)^T + b) in fp32, where
//   fq_w(W)[j, k] = sw[j] * clamp(rint(W[j, k] / sw[j]), -127, 127),  sw[j] = max_k |W[j, k]| / 127
//   fq_x(x)       = sx * clamp(rint(x / sx), -127, 127),              sx = amax / 127
// (the INT8 path's arithmetic, compress::int8_linear), amax the running max of the layer's
// input: the first training step's max|x|, then amax <- d * amax + (1 - d) * max|x| after each
// training step (d = ema_decay); a forward uses the value from before its step. The backward is
// the straight-through estimator: dL/dx = (dL/dfq_x) * [|x| <= 127 sx], dL/dW = (dL/dfq_w) *
// [|W| <= 127 sw] (rint's derivative taken as 1, the clamp's kept). The export is the INT8 model
// of these scales (compress::Int8Linear), which `dlrec predict` / `dlrec serve` run on the CPU.
//
// Distillation: L = alpha * BCE(sigmoid(z), y) + (1 - alpha) * BCE(sigmoid(z / T), sigmoid(t / T))
// averaged over the batch, z the student's logit, t the teacher's, y the label; no T^2 factor.
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/compress/quantize.h"
#include "dlrec/core/config.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/linear.h"

namespace dlrec::compress {

struct QatConfig {
  bool on = false;
  QuantizeConfig select;  // its layers and skip (the calibration keys are not read)
  double ema_decay = 0.99;
  json to_json() const;
  static QatConfig from_json(ConfigReader& r);
};

struct DistillConfig {
  bool on = false;
  std::string teacher;       // an exported (dense) model directory
  double alpha = 0.5;        // weight of the label's BCE, in [0, 1]
  double temperature = 1.0;  // > 0
  json to_json() const;
  static DistillConfig from_json(ConfigReader& r);
};

// The fake-quantized value sx * clamp(rint(x / sx), -127, 127) (the int8 path's rounding).
float fake_quant(float x, float scale);
// The straight-through estimator's gate: whether |x| <= 127 * scale (the gradient passes).
inline bool ste_passes(float x, float scale) { return std::abs(x) <= 127.f * scale; }

// The QAT record of one Linear (nn::Param::quant).
class QatLinear final : public nn::LinearHook {
 public:
  // `amax` < 0: no range yet (the first training step sets it).
  QatLinear(std::string weight, double ema_decay, double amax = -1.0)
      : weight_(std::move(weight)), decay_(ema_decay), amax_(amax) {}
  bool forward(const Tensor&, const Tensor&, bool, Tensor&) override { return false; }
  nn::FakeQuantOperands fake_quant(const Tensor& x, const Tensor& w) override;
  void straight_through(Tensor* dx, Tensor& dw) override;
  double amax() const { return amax_; }
  QatRange qat_range() const override { return {true, amax_, decay_}; }
  void set_qat_range(double amax) override { amax_ = amax; }
  void set_decay(double d) { decay_ = d; }
  // Data-parallel ranks (the trainer on the CPU engine): the maximum of a value over the ranks,
  // a collective that every rank reaches at the same points. A training step takes the batch's
  // max|x| through it (on the first step before the forward quantizes, else before the EMA
  // update), so that every rank keeps the global batch's range, as one process would; outside
  // training steps it must return its argument. Unset: this process's batch alone.
  void set_range_reducer(std::function<double(double)> max_over_ranks) {
    reduce_ = std::move(max_over_ranks);
  }
  // The INT8 inference record of the current weight and input range (the export).
  std::shared_ptr<Int8Linear> to_int8(const Tensor& weight) const;

 private:
  std::string weight_;
  double decay_;
  double amax_;            // running max of |x|; < 0 before the first training step
  double batch_amax_ = 0;  // max |x| of the last forward
  bool batch_reduced_ = false;  // batch_amax_ is already the ranks' maximum
  std::function<double(double)> reduce_;
  float x_scale_ = 1.f;    // the input scale of the last forward
  Tensor x_, xq_, wq_;     // the last forward's input and fake-quantized operands
  std::vector<float> w_scales_;
};

// Installs QAT records on the selected weights (keeping the running ranges of records a
// checkpoint brought, dropping those of weights no longer selected). Errors: as
// compress.quantize's layers/skip (under "compress.qat"). Returns how many. On the CUDA graph
// engine the records sit on host shells of the weights, which the engine takes up before its
// next step (src/model/graph_cuda_compress.cu).
int64_t install_qat(const QatConfig& config, model::Model& model);

// QAT ranges in checkpoints: tensors "<weight>.qat_amax" (F32 [1]) and the meta's "qat" list.
std::vector<model::NamedTensor> qat_tensors(model::Model& model, json& meta_qat);
std::vector<model::NamedTensor> prepare_qat(const json& meta, const std::string& path,
                                            model::Model& model);
void apply_loaded_qat(const std::vector<model::NamedTensor>& loaded, const std::string& path,
                      model::Model& model);

// The distillation loss (above) of n rows and, when dlogits is not null, dL/dz:
// alpha (sigmoid(z) - y) / n + (1 - alpha) (sigmoid(z / T) - sigmoid(t / T)) / (T n).
double distill_loss(const float* logits, const float* labels, const float* teacher_logits,
                    int64_t n, double alpha, double temperature, float* dlogits);

}  // namespace dlrec::compress
