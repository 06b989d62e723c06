// INT8 post-training calibration (docs/COMPRESSION.md): activation ranges of the quantized
// Linears' inputs from batches of training data (max, percentile, entropy), the weights'
// per-channel scales, and each layer's error against fp32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "dlrec/compress/quantize.h"
#include "dlrec/nn/param.h"

namespace dlrec::compress {

namespace {

constexpr int64_t kHistBins = 2048;
constexpr int64_t kLevels = 128;  // the non-negative int8 levels 0..127 of |x|

// Pass 1: NaN/Inf check and the largest |x| of a layer's input.
class RangeObserver final : public nn::LinearHook {
 public:
  RangeObserver(std::string weight, const int64_t* batch)
      : weight_(std::move(weight)), batch_(batch) {}
  bool forward(const Tensor&, const Tensor&, bool, Tensor&) override { return false; }
  void observe(const Tensor& x, const Tensor&, bool, const Tensor&) override {
    const float* v = x.data<float>();
    const int64_t cols = x.dim(1);
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (!std::isfinite(v[i]))
        fail("int8 calibration: the input of '", weight_, "' holds ", v[i],
             " on calibration batch ", *batch_, ", row ", i / cols, ", column ", i % cols,
             " (the model or the calibration data is broken: nothing was written)");
      amax = std::max(amax, static_cast<double>(std::fabs(v[i])));
    }
  }
  double amax = 0;

 private:
  std::string weight_;
  const int64_t* batch_;
};

// Pass 2: the histogram of |x| over [0, range).
class HistObserver final : public nn::LinearHook {
 public:
  explicit HistObserver(double range) {
    hist.range = range;
    hist.counts.assign(kHistBins, 0.0);
  }
  bool forward(const Tensor&, const Tensor&, bool, Tensor&) override { return false; }
  void observe(const Tensor& x, const Tensor&, bool, const Tensor&) override {
    const float* v = x.data<float>();
    const double per_bin = kHistBins / hist.range;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t b = static_cast<int64_t>(std::fabs(v[i]) * per_bin);
      hist.counts[std::min(b, kHistBins - 1)] += 1;
    }
  }
  AbsHistogram hist;
};

// Pass 3: the layer's INT8 output on the fp32 input it got, against its fp32 output.
class ErrorObserver final : public nn::LinearHook {
 public:
  explicit ErrorObserver(std::shared_ptr<Int8Linear> q) : q_(std::move(q)) {}
  bool forward(const Tensor&, const Tensor&, bool, Tensor&) override { return false; }
  void observe(const Tensor& x, const Tensor& bias, bool relu, const Tensor& y) override {
    q_->forward(x, bias, relu, yq_);
    const float* a = y.data<float>();
    const float* b = yq_.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double d = static_cast<double>(b[i]) - a[i];
      err2 += d * d;
      ref2 += static_cast<double>(a[i]) * a[i];
    }
  }
  double err2 = 0, ref2 = 0;

 private:
  std::shared_ptr<Int8Linear> q_;
  Tensor yq_;
};

double entropy_threshold(const AbsHistogram& h, double amax) {
  const std::vector<double>& c = h.counts;
  const int64_t bins = static_cast<int64_t>(c.size());
  const double width = h.range / bins;
  double total = 0;
  for (double v : c) total += v;
  if (total == 0 || bins <= kLevels) return amax;
  double best_kl = std::numeric_limits<double>::infinity();
  int64_t best_i = bins;
  std::vector<double> p, q;
  for (int64_t i = kLevels; i <= bins; ++i) {
    // P: the first i bins, everything beyond folded into the last (what clipping at i does).
    p.assign(c.begin(), c.begin() + i);
    for (int64_t k = i; k < bins; ++k) p[i - 1] += c[k];
    // Q: the first i bins merged into kLevels groups, each group's mass spread evenly over its
    // non-empty bins (an empty bin stays empty: its value cannot appear).
    q.assign(static_cast<size_t>(i), 0.0);
    for (int64_t g = 0; g < kLevels; ++g) {
      const int64_t lo = g * i / kLevels, hi = (g + 1) * i / kLevels;
      double mass = 0;
      int64_t nonzero = 0;
      for (int64_t k = lo; k < hi; ++k) {
        mass += c[k];
        nonzero += c[k] != 0;
      }
      if (nonzero == 0) continue;
      for (int64_t k = lo; k < hi; ++k)
        if (c[k] != 0) q[k] = mass / nonzero;
    }
    double psum = 0, qsum = 0;
    for (int64_t k = 0; k < i; ++k) {
      psum += p[k];
      qsum += q[k];
    }
    if (psum == 0 || qsum == 0) continue;
    // KL(P || Q); a bin with P > 0 and Q = 0 (the folded outliers on an empty last bin) gets a
    // tiny Q instead of an infinite divergence.
    double kl = 0;
    for (int64_t k = 0; k < i; ++k) {
      if (p[k] == 0) continue;
      const double pk = p[k] / psum;
      const double qk = std::max(q[k] / qsum, 1e-12);
      kl += pk * std::log(pk / qk);
    }
    if (kl < best_kl) {
      best_kl = kl;
      best_i = i;
    }
  }
  return std::min(amax, best_i * width);
}

}  // namespace

double threshold_from_histogram(const AbsHistogram& h, double amax, const std::string& method,
                                double percentile) {
  if (method == "max" || amax == 0) return amax;
  DLREC_CHECK(!h.counts.empty() && h.range > 0, "int8 calibration: empty histogram");
  if (method == "percentile") {
    double total = 0;
    for (double v : h.counts) total += v;
    const double want = percentile / 100.0 * total;
    const double width = h.range / static_cast<double>(h.counts.size());
    double cum = 0;
    for (size_t k = 0; k < h.counts.size(); ++k) {
      cum += h.counts[k];
      if (cum >= want) return std::min(amax, (k + 1) * width);
    }
    return amax;
  }
  if (method == "entropy") return entropy_threshold(h, amax);
  fail("int8 calibration: unknown method '", method, "' (max, percentile, entropy)");
}

// The quantizable weights of the config's layers, with the skip entries applied. Errors name
// the unknown layer or skip entry and list what exists.
std::vector<std::pair<model::PrunableWeight, bool>> select_quant_weights(const QuantizeConfig& cfg,
                                                                         model::Model& model,
                                                                         const std::string& where) {
  const std::vector<model::PrunableWeight> all = model.prunable_weights();
  std::set<std::string> layers, weights;
  for (const auto& w : all) {
    layers.insert(w.layer);
    weights.insert(w.name.substr(0, w.name.size() - 7));  // without ".weight"
  }
  auto list = [](const std::set<std::string>& s) {
    std::string out;
    for (const auto& n : s) out += (out.empty() ? "" : ", ") + n;
    return out.empty() ? std::string("none") : out;
  };
  if (!cfg.all_dense)
    for (const std::string& l : cfg.layers)
      if (!layers.count(l))
        fail(where, ".layers: '", l,
             "' is not an mlp or cross layer of the model (quantizable layers: ", list(layers),
             ")");
  std::vector<std::pair<model::PrunableWeight, bool>> out;
  std::set<std::string> used;
  for (const auto& w : all) {
    if (!cfg.all_dense &&
        std::find(cfg.layers.begin(), cfg.layers.end(), w.layer) == cfg.layers.end())
      continue;
    const std::string base = w.name.substr(0, w.name.size() - 7);
    bool skip = false;
    for (const std::string& s : cfg.skip)
      if (s == w.layer || s == base || s == w.name) {
        skip = true;
        used.insert(s);
      }
    out.emplace_back(w, skip);
  }
  for (const std::string& s : cfg.skip)
    if (!used.count(s))
      fail(where, ".skip: '", s,
           "' names no quantized layer or weight of the model (layers: ", list(layers),
           "; weights: ", list(weights), ")");
  return out;
}

namespace {

// Runs the model (fp32, hooks observing) over every batch; `batch` tells observers which.
void run_batches(model::Model& model, const std::vector<io::Batch>& batches, int64_t& batch) {
  for (batch = 0; batch < static_cast<int64_t>(batches.size()); ++batch)
    model.forward(batches[batch], false);
}

double rel_l2_weight(const Tensor& w, const QuantWeight& q) {
  const float* v = w.data<float>();
  double e2 = 0, r2 = 0;
  for (int64_t j = 0; j < q.out; ++j)
    for (int64_t k = 0; k < q.in; ++k) {
      const double a = v[j * q.in + k], b = static_cast<double>(q.q[j * q.in + k]) * q.scales[j];
      e2 += (a - b) * (a - b);
      r2 += a * a;
    }
  return r2 > 0 ? std::sqrt(e2 / r2) : 0.0;
}

}  // namespace

std::vector<LayerQuant> calibrate_and_quantize(const QuantizeConfig& config, model::Model& model,
                                               const std::vector<io::Batch>& batches) {
  config.validate("compress.quantize");
  if (model.device().is_cuda())
    fail("compress.quantize: INT8 layers are CPU-only in this build (the model is on ",
         model.device().str(), ")");
  DLREC_CHECK(!batches.empty(), "int8 calibration: no calibration batches");
  const auto selected = select_quant_weights(config, model, "compress.quantize");
  DLREC_CHECK(!selected.empty(), "compress.quantize: the model has no mlp or cross weight");
  std::vector<LayerQuant> out;
  std::vector<nn::Param*> params;
  for (const auto& [w, skip] : selected) {
    DLREC_CHECK(w.param, "compress.quantize: the model does not expose '", w.name, "'");
    LayerQuant l;
    l.layer = w.layer;
    l.weight = w.name;
    l.skipped = skip;
    const float* v = w.weight.data<float>();
    for (int64_t k = 0; k < w.weight.numel(); ++k) l.zeros += v[k] == 0.f;
    out.push_back(l);
    params.push_back(w.param);
    w.param->quant.reset();
  }
  int64_t batch = 0;
  // Pass 1: ranges (and the NaN check).
  std::vector<std::shared_ptr<RangeObserver>> ranges(out.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (!out[i].skipped)
      params[i]->quant = ranges[i] = std::make_shared<RangeObserver>(out[i].weight, &batch);
  try {
    run_batches(model, batches, batch);
    // Pass 2: histograms below the largest |x|.
    if (config.calibration != "max") {
      std::vector<std::shared_ptr<HistObserver>> hists(out.size());
      for (size_t i = 0; i < out.size(); ++i)
        if (!out[i].skipped && ranges[i]->amax > 0)
          params[i]->quant = hists[i] = std::make_shared<HistObserver>(ranges[i]->amax);
      run_batches(model, batches, batch);
      for (size_t i = 0; i < out.size(); ++i)
        if (hists[i])
          out[i].threshold = threshold_from_histogram(hists[i]->hist, ranges[i]->amax,
                                                      config.calibration, config.percentile);
    }
    // Scales; an input that was always 0 gets any scale (1/127).
    std::vector<std::shared_ptr<Int8Linear>> q(out.size());
    std::vector<std::shared_ptr<ErrorObserver>> errs(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].skipped) continue;
      out[i].amax = ranges[i]->amax;
      if (config.calibration == "max") out[i].threshold = out[i].amax;
      if (!(out[i].threshold > 0)) out[i].threshold = 1.0;
      out[i].x_scale = static_cast<float>(out[i].threshold / 127.0);
      QuantWeight qw = quantize_weight(params[i]->value);
      out[i].weight_rel_l2 = rel_l2_weight(params[i]->value, qw);
      q[i] = std::make_shared<Int8Linear>(std::move(qw), out[i].x_scale);
      params[i]->quant = errs[i] = std::make_shared<ErrorObserver>(q[i]);
    }
    // Pass 3: each layer's own error (its INT8 output on the fp32 input it gets).
    run_batches(model, batches, batch);
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].skipped) continue;
      out[i].output_rel_l2 = errs[i]->ref2 > 0 ? std::sqrt(errs[i]->err2 / errs[i]->ref2) : 0.0;
      params[i]->quant = q[i];
    }
  } catch (...) {
    for (nn::Param* p : params) p->quant.reset();
    throw;
  }
  return out;
}

void set_int8(model::Model& model, const std::vector<LayerQuant>& layers, bool on) {
  for (const auto& w : model.prunable_weights())
    for (const LayerQuant& l : layers) {
      if (l.weight != w.name || l.skipped) continue;
      if (!on) {
        w.param->quant.reset();
      } else if (!w.param->quant) {
        w.param->quant = std::make_shared<Int8Linear>(quantize_weight(w.weight), l.x_scale);
      }
    }
}

}  // namespace dlrec::compress
