// Quantization-aware training (fake quantization, straight-through estimator), its records in
// checkpoints, and the distillation loss (docs/COMPRESSION.md).
#include "dlrec/compress/qat.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/param.h"

namespace dlrec::compress {

QatConfig QatConfig::from_json(ConfigReader& r) {
  QatConfig c;
  c.on = true;
  c.select.on = true;
  // layers and skip as compress.quantize (the same validation); the calibration keys are not
  // QAT's and are refused by finish().
  const json layers = r.get<json>("layers", json("all_dense"));
  if (layers.is_string()) {
    if (layers.get<std::string>() != "all_dense")
      fail(r.key_path("layers"), ": must be \"all_dense\" or a list of layer names, got ",
           dump_json_safe(layers));
  } else {
    c.select.all_dense = false;
    if (!layers.is_array() || layers.empty())
      fail(r.key_path("layers"), ": must be \"all_dense\" or a non-empty list of layer names");
    for (const json& l : layers) {
      if (!l.is_string() || l.get<std::string>().empty())
        fail(r.key_path("layers"), ": every entry must be a name, got ", dump_json_safe(l));
      c.select.layers.push_back(l.get<std::string>());
    }
  }
  const json skip = r.get<json>("skip", json::array());
  if (!skip.is_array()) fail(r.key_path("skip"), ": must be a list of names");
  for (const json& s : skip) {
    if (!s.is_string() || s.get<std::string>().empty())
      fail(r.key_path("skip"), ": every entry must be a name, got ", dump_json_safe(s));
    c.select.skip.push_back(s.get<std::string>());
  }
  c.ema_decay = r.get<double>("ema_decay", c.ema_decay);
  if (!(c.ema_decay >= 0.0 && c.ema_decay < 1.0))
    fail(r.key_path("ema_decay"), ": must be in [0, 1), got ", c.ema_decay);
  r.finish();
  return c;
}

json QatConfig::to_json() const {
  json j = {{"skip", select.skip}, {"ema_decay", ema_decay}};
  j["layers"] = select.all_dense ? json("all_dense") : json(select.layers);
  return j;
}

DistillConfig DistillConfig::from_json(ConfigReader& r) {
  DistillConfig c;
  c.on = true;
  if (!r.has("teacher")) fail(r.key_path("teacher"), ": required (an exported model directory)");
  c.teacher = r.get<std::string>("teacher", "");
  if (c.teacher.empty()) fail(r.key_path("teacher"), ": must name a model directory");
  c.alpha = r.get<double>("alpha", c.alpha);
  if (!(c.alpha >= 0.0 && c.alpha <= 1.0))
    fail(r.key_path("alpha"), ": must be in [0, 1], got ", c.alpha);
  c.temperature = r.get<double>("temperature", c.temperature);
  if (!(c.temperature > 0.0 && std::isfinite(c.temperature)))
    fail(r.key_path("temperature"), ": must be > 0, got ", c.temperature);
  r.finish();
  return c;
}

json DistillConfig::to_json() const {
  return {{"teacher", teacher}, {"alpha", alpha}, {"temperature", temperature}};
}

float fake_quant(float x, float scale) {
  return static_cast<float>(quantize_value(x, 1.f / scale)) * scale;
}

nn::FakeQuantOperands QatLinear::fake_quant(const Tensor& x, const Tensor& w) {
  const int64_t n = x.numel(), out = w.dim(0), in = w.dim(1);
  const float* xs = x.data<float>();
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::abs(xs[i]);
    if (!std::isfinite(a))
      fail("QAT: layer input of '", weight_, "' holds ", xs[i], " at row ", i / in, " column ",
           i % in, " (training diverged?)");
    m = std::max<double>(m, a);
  }
  // The first step quantizes with its own batch's range: the global batch's across ranks.
  batch_reduced_ = amax_ < 0 && reduce_;
  if (batch_reduced_) m = reduce_(m);
  batch_amax_ = m;
  const double range = amax_ >= 0 ? amax_ : m;
  x_scale_ = range > 0 ? static_cast<float>(range / 127.0) : 1.f / 127.f;
  x_ = x;
  nn::ensure_buffer(xq_, x.shape());
  float* xq = xq_.data<float>();
  const float s = x_scale_, inv = 1.f / s;
  parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) xq[i] = static_cast<float>(quantize_value(xs[i], inv)) * s;
  });
  const QuantWeight q = quantize_weight(w);
  w_scales_ = q.scales;
  nn::ensure_buffer(wq_, w.shape());
  float* wq = wq_.data<float>();
  for (int64_t j = 0; j < out; ++j)
    for (int64_t k = 0; k < in; ++k) wq[j * in + k] = q.q[j * in + k] * q.scales[j];
  return {&xq_, &wq_};
}

void QatLinear::straight_through(Tensor* dx, Tensor& dw) {
  DLREC_CHECK(x_.defined(), "QAT: backward of '", weight_, "' before its forward");
  if (dx && dx->defined()) {
    const float* xs = x_.data<float>();
    float* d = dx->data<float>();
    const float s = x_scale_;
    parallel_for(0, dx->numel(), 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        if (!ste_passes(xs[i], s)) d[i] = 0.f;
    });
  }
  // With sw = max|W_j| / 127 every weight is inside its range; the gate is kept for the
  // arithmetic's sake (a weight changed since the forward is not re-scaled here).
  const int64_t out = dw.dim(0), in = dw.dim(1);
  float* g = dw.data<float>();
  const float* wq = wq_.data<float>();
  for (int64_t j = 0; j < out; ++j)
    for (int64_t k = 0; k < in; ++k)
      if (!ste_passes(wq[j * in + k], w_scales_[j])) g[j * in + k] = 0.f;
  // The step is done: its batch's range (the global batch's across ranks) enters the running max.
  if (reduce_ && !batch_reduced_) batch_amax_ = reduce_(batch_amax_);
  batch_reduced_ = false;
  amax_ = amax_ < 0 ? batch_amax_ : decay_ * amax_ + (1.0 - decay_) * batch_amax_;
}

std::shared_ptr<Int8Linear> QatLinear::to_int8(const Tensor& weight) const {
  const double range = amax_ > 0 ? amax_ : 1.0;
  return std::make_shared<Int8Linear>(quantize_weight(weight), static_cast<float>(range / 127.0));
}

int64_t install_qat(const QatConfig& config, model::Model& model) {
  const auto selected = select_quant_weights(config.select, model, "compress.qat");
  int64_t n = 0;
  for (const auto& [w, skip] : selected) {
    DLREC_CHECK(w.param, "compress.qat: the model does not expose '", w.name, "'");
    auto* existing = dynamic_cast<QatLinear*>(w.param->quant.get());
    if (skip) {
      w.param->quant.reset();
    } else if (existing) {
      existing->set_decay(config.ema_decay);  // a checkpoint's running range goes on
      n++;
    } else {
      w.param->quant = std::make_shared<QatLinear>(w.name, config.ema_decay);
      n++;
    }
  }
  // Weights outside the selection keep no QAT record.
  for (const auto& w : model.prunable_weights()) {
    bool sel = false;
    for (const auto& s : selected) sel |= s.first.name == w.name && !s.second;
    if (!sel && w.param && dynamic_cast<QatLinear*>(w.param->quant.get())) w.param->quant.reset();
  }
  DLREC_CHECK(n > 0, "compress.qat: no weight to train quantized (every one is skipped)");
  return n;
}

std::vector<model::NamedTensor> qat_tensors(model::Model& model, json& meta_qat) {
  std::vector<model::NamedTensor> out;
  json names = json::array();
  for (const auto& w : model.prunable_weights()) {
    const auto* q = w.param ? dynamic_cast<const QatLinear*>(w.param->quant.get()) : nullptr;
    if (!q) continue;
    Tensor t = Tensor::empty({1}, DType::F32, Device::cpu());
    t.data<float>()[0] = static_cast<float>(q->amax());
    out.emplace_back(w.name + ".qat_amax", t);
    names.push_back(w.name);
  }
  meta_qat = names.empty() ? json() : names;
  return out;
}

std::vector<model::NamedTensor> prepare_qat(const json& meta, const std::string& path,
                                            model::Model& model) {
  std::vector<model::NamedTensor> out;
  if (!meta.is_object() || !meta.contains("qat")) return out;
  const json& q = meta.at("qat");
  if (!q.is_array()) fail("tensor file '", path, "': meta key 'qat' must be a list of weights");
  std::set<std::string> weights;
  for (const auto& w : model.prunable_weights()) weights.insert(w.name);
  for (const json& n : q) {
    if (!n.is_string() || !weights.count(n.get<std::string>()))
      fail("tensor file '", path, "': QAT record of ", dump_json_safe(n),
           ", which is not an mlp or cross weight of the model");
    out.emplace_back(n.get<std::string>() + ".qat_amax",
                     Tensor::empty({1}, DType::F32, Device::cpu()));
  }
  return out;
}

void apply_loaded_qat(const std::vector<model::NamedTensor>& loaded, const std::string& path,
                      model::Model& model) {
  if (loaded.empty()) return;
  std::map<std::string, Tensor> t(loaded.begin(), loaded.end());
  for (const auto& w : model.prunable_weights()) {
    auto it = t.find(w.name + ".qat_amax");
    if (it == t.end()) continue;
    const float a = it->second.data<float>()[0];
    // -1: saved before its first training step; otherwise a range >= 0.
    if (!std::isfinite(a) || (a < 0 && a != -1.f))
      fail("tensor file '", path, "': tensor '", it->first, "' is ", a,
           " (a QAT input range is finite and >= 0)");
    w.param->quant = std::make_shared<QatLinear>(w.name, 0.99, a);
  }
}

double distill_loss(const float* z, const float* y, const float* t, int64_t n, double alpha,
                    double temperature, float* dz) {
  DLREC_CHECK(alpha >= 0 && alpha <= 1 && temperature > 0, "distillation: alpha ", alpha,
              " must be in [0, 1] and the temperature ", temperature, " > 0");
  auto sigmoid = [](double v) {
    return v >= 0 ? 1.0 / (1.0 + std::exp(-v)) : std::exp(v) / (1.0 + std::exp(v));
  };
  // Stable BCE of a logit v against a target p: max(v, 0) - v p + log1p(exp(-|v|)).
  auto bce = [](double v, double p) {
    return std::max(v, 0.0) - v * p + std::log1p(std::exp(-std::abs(v)));
  };
  double sum = 0;
  const double T = temperature;
  for (int64_t i = 0; i < n; ++i) {
    const double zi = z[i], soft = sigmoid(static_cast<double>(t[i]) / T);
    sum += alpha * bce(zi, y[i]) + (1 - alpha) * bce(zi / T, soft);
    if (dz)
      dz[i] = static_cast<float>(
          (alpha * (sigmoid(zi) - y[i]) + (1 - alpha) * (sigmoid(zi / T) - soft) / T) / n);
  }
  return n > 0 ? sum / n : 0.0;
}

}  // namespace dlrec::compress
