// Dense ops: FillMissing, Clip, LogOp, Normalize (docs/ETL.md).
#include <cmath>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

double finite_number(ConfigReader& r, const std::string& key, double fallback) {
  double v = r.get_range(key, fallback, -std::numeric_limits<double>::max(),
                         std::numeric_limits<double>::max());
  return v;
}

// {"op": "FillMissing", "value": 0}: a missing value (NaN) becomes `value`.
class FillMissing final : public DenseOp {
 public:
  explicit FillMissing(float value) : value_(value) {}
  std::string name() const override { return "FillMissing"; }
  json to_json() const override { return {{"op", name()}, {"value", value_}}; }
  void transform(float* v, int64_t n, int64_t stride) const override {
    for (int64_t i = 0; i < n; ++i) {
      float& x = v[i * stride];
      if (std::isnan(x)) x = value_;
    }
  }

 private:
  float value_;
};

// {"op": "Clip", "min": 0, "max": 100}: clamps into [min, max]; either bound may be absent.
// A missing value stays missing.
class Clip final : public DenseOp {
 public:
  Clip(float lo, float hi) : lo_(lo), hi_(hi) {}
  std::string name() const override { return "Clip"; }
  json to_json() const override {
    json j = {{"op", name()}};
    if (lo_ != -std::numeric_limits<float>::infinity()) j["min"] = lo_;
    if (hi_ != std::numeric_limits<float>::infinity()) j["max"] = hi_;
    return j;
  }
  void transform(float* v, int64_t n, int64_t stride) const override {
    for (int64_t i = 0; i < n; ++i) {
      float& x = v[i * stride];
      if (x < lo_) x = lo_;  // false for NaN
      if (x > hi_) x = hi_;
    }
  }

 private:
  float lo_, hi_;
};

// {"op": "LogOp"}: x -> log(1 + x). Values <= -1 give -inf/NaN, which the workflow rejects
// after the pipeline: clip them first ({"op": "Clip", "min": 0}).
class LogOp final : public DenseOp {
 public:
  std::string name() const override { return "LogOp"; }
  json to_json() const override { return {{"op", name()}}; }
  void transform(float* v, int64_t n, int64_t stride) const override {
    for (int64_t i = 0; i < n; ++i) {
      float& x = v[i * stride];
      x = std::log1p(x);
    }
  }
};

// {"op": "Normalize"}: x -> (x - mean) / std with mean and (population) std fitted on the
// finite training values. Statistics are merged chunk by chunk with Chan et al.'s pairwise
// update (each chunk's own mean and sum of squared deviations computed in two passes), which
// stays accurate when the mean is large relative to the spread. A constant column gets std 1.
class Normalize final : public DenseOp {
 public:
  Normalize() = default;
  Normalize(double mean, double std, int64_t count)
      : mean_(mean), std_(std), count_(count), fitted_(true) {}
  std::string name() const override { return "Normalize"; }
  bool needs_fit() const override { return true; }
  bool fitted() const override { return fitted_; }
  json to_json() const override {
    json j = {{"op", name()}};
    if (fitted_) {
      j["mean"] = mean_;
      j["std"] = std_;
      j["count"] = count_;
    }
    return j;
  }
  json fit_summary() const override { return {{"mean", mean_}, {"std", std_}}; }

  void fit_begin() override {
    n_ = 0;
    acc_mean_ = 0;
    m2_ = 0;
    fitted_ = false;
  }
  void fit_chunk(const float* v, int64_t n) override {
    int64_t nb = 0;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(v[i])) {
        sum += v[i];
        ++nb;
      }
    if (nb == 0) return;
    const double mb = sum / nb;
    double m2b = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(v[i])) {
        const double d = v[i] - mb;
        m2b += d * d;
      }
    const double total = static_cast<double>(n_ + nb);
    const double delta = mb - acc_mean_;
    acc_mean_ += delta * (nb / total);
    m2_ += m2b + delta * delta * (static_cast<double>(n_) * nb / total);
    n_ += nb;
  }
  void fit_end() override {
    count_ = n_;
    mean_ = n_ ? acc_mean_ : 0.0;
    std_ = n_ ? std::sqrt(m2_ / n_) : 1.0;
    if (!(std_ > 0) || !std::isfinite(std_)) std_ = 1.0;
    fitted_ = true;
  }
  void transform(float* v, int64_t n, int64_t stride) const override {
    const double inv = 1.0 / std_;
    for (int64_t i = 0; i < n; ++i) {
      float& x = v[i * stride];
      x = static_cast<float>((static_cast<double>(x) - mean_) * inv);
    }
  }

 private:
  double mean_ = 0, std_ = 1;
  int64_t count_ = 0;
  bool fitted_ = false;
  // Running statistics during fit.
  int64_t n_ = 0;
  double acc_mean_ = 0, m2_ = 0;
};

}  // namespace

void register_dense_ops(OpRegistry& reg) {
  reg.add("FillMissing", ColumnType::Dense, [](ConfigReader& r, bool) {
    return std::make_unique<FillMissing>(static_cast<float>(finite_number(r, "value", 0.0)));
  });
  reg.add("Clip", ColumnType::Dense, [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    const float inf = std::numeric_limits<float>::infinity();
    if (!r.has("min") && !r.has("max"))
      fail("'", r.path(), "': Clip needs \"min\" and/or \"max\"");
    float lo = r.has("min") ? static_cast<float>(finite_number(r, "min", 0)) : -inf;
    float hi = r.has("max") ? static_cast<float>(finite_number(r, "max", 0)) : inf;
    if (lo > hi) fail("'", r.path(), "': Clip min ", lo, " is greater than max ", hi);
    return std::make_unique<Clip>(lo, hi);
  });
  reg.add("LogOp", ColumnType::Dense,
          [](ConfigReader&, bool) { return std::make_unique<LogOp>(); });
  reg.add("Normalize", ColumnType::Dense, [](ConfigReader& r, bool fitted) -> std::unique_ptr<Op> {
    if (!fitted) return std::make_unique<Normalize>();
    double mean = r.require<double>("mean");
    double std = r.require<double>("std");
    int64_t count = r.get<int64_t>("count", 0);
    if (!(std > 0) || !std::isfinite(mean) || !std::isfinite(std))
      fail("'", r.path(), "': Normalize needs a finite mean and a positive std");
    return std::make_unique<Normalize>(mean, std, count);
  });
}

}  // namespace dlrec::etl
