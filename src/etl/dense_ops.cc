// Dense ops: FillMissing, FillMedian, Clip, LogOp, Normalize, NormalizeMinMax, Binarize, and the
// dense encoder Bucketize (docs/ETL.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/etl/key_map.h"
#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

// v[i * stride] = f(v[i * stride]) for i in [0, n): contiguous values (stride 1, how the
// workflow's transform calls the ops) in a loop of their own, which the compiler vectorizes.
template <class F>
inline void map_values(float* v, int64_t n, int64_t stride, F f) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) v[i] = f(v[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) v[i * stride] = f(v[i * stride]);
  }
}

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
    const float value = value_;
    map_values(v, n, stride, [value](float x) { return std::isnan(x) ? value : x; });
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
    const float lo = lo_, hi = hi_;
    map_values(v, n, stride, [lo, hi](float x) {
      x = x < lo ? lo : x;  // false for NaN
      return x > hi ? hi : x;
    });
  }

 private:
  float lo_, hi_;
};

// {"op": "Binarize", "threshold": 3, "compare": "gt"}: x -> 1 when `x compare threshold` holds,
// else 0 (a 1-5 rating into a click-like label: NVTabular users write `rating > 3`). A missing
// value stays missing, so a missing rating is reported as a missing label, not read as 0.
class Binarize final : public DenseOp {
 public:
  enum class Compare { Gt, Ge, Lt, Le, Eq, Ne };
  static const std::vector<std::string>& compare_names() {
    static const std::vector<std::string> names = {"gt", "ge", "lt", "le", "eq", "ne"};
    return names;
  }
  Binarize(float threshold, Compare compare) : threshold_(threshold), compare_(compare) {}
  std::string name() const override { return "Binarize"; }
  json to_json() const override {
    return {{"op", name()},
            {"threshold", threshold_},
            {"compare", compare_names()[static_cast<int>(compare_)]}};
  }
  void transform(float* v, int64_t n, int64_t stride) const override {
    const float t = threshold_;
    // One loop per comparison, so each is a branch-free (vectorizable) select.
    auto apply = [&](auto holds) {
      map_values(v, n, stride, [holds](float x) {
        return std::isnan(x) ? x : (holds(x) ? 1.f : 0.f);
      });
    };
    switch (compare_) {
      case Compare::Gt: apply([t](float x) { return x > t; }); break;
      case Compare::Ge: apply([t](float x) { return x >= t; }); break;
      case Compare::Lt: apply([t](float x) { return x < t; }); break;
      case Compare::Le: apply([t](float x) { return x <= t; }); break;
      case Compare::Eq: apply([t](float x) { return x == t; }); break;
      case Compare::Ne: apply([t](float x) { return x != t; }); break;
    }
  }

 private:
  float threshold_;
  Compare compare_;
};

// {"op": "LogOp"}: x -> log(1 + x). Values <= -1 give -inf/NaN, which the workflow rejects
// after the pipeline: clip them first ({"op": "Clip", "min": 0}).
class LogOp final : public DenseOp {
 public:
  std::string name() const override { return "LogOp"; }
  json to_json() const override { return {{"op", name()}}; }
  void transform(float* v, int64_t n, int64_t stride) const override {
    // Count-like columns hold small non-negative integers: their log1p comes from a table
    // filled by the same std::log1p, so the result is bit-identical, without the libm call.
    const float* table = small_log1p_table();
    if (stride == 1) {
      // Contiguous values, in blocks: first each one's table index (-1: not in the table) in a
      // loop without branches (vectorized), then the table or log1p.
      constexpr int64_t kStep = 512;
      int32_t idx[kStep];
      for (int64_t b = 0; b < n; b += kStep) {
        const int64_t m = std::min(kStep, n - b);
        float* w = v + b;
        for (int64_t i = 0; i < m; ++i) {
          const float x = w[i];
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          const float c = x >= 0.f && x < static_cast<float>(kTableSize) ? x : 0.f;  // NaN: 0
          const int32_t k = static_cast<int32_t>(c);
          // +0 and up (not -0: log1p(-0) is -0), a whole number below the table size.
          idx[i] = (bits >> 31) == 0 && static_cast<float>(k) == x ? k : -1;
        }
        for (int64_t i = 0; i < m; ++i) w[i] = idx[i] >= 0 ? table[idx[i]] : std::log1p(w[i]);
      }
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      float& x = v[i * stride];
      if (x >= 0.f && x < static_cast<float>(kTableSize) && !std::signbit(x)) {
        const uint32_t k = static_cast<uint32_t>(x);
        if (static_cast<float>(k) == x) {
          x = table[k];
          continue;
        }
      }
      x = std::log1p(x);
    }
  }

 private:
  static constexpr uint32_t kTableSize = 1u << 14;
  static const float* small_log1p_table() {
    static const std::vector<float> t = [] {
      std::vector<float> v(kTableSize);
      for (uint32_t k = 0; k < kTableSize; ++k) v[k] = std::log1p(static_cast<float>(k));
      return v;
    }();
    return t.data();
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
    pending_.clear();
    fitted_ = false;
  }
  // Values are merged in blocks of kBlock consecutive values whatever the chunks they come in,
  // so the fitted mean/std do not depend on the reader's chunk size (bit for bit).
  void fit_chunk(const float* v, int64_t n) override {
    while (n > 0) {
      if (pending_.empty() && n >= kBlock) {
        merge_block(v, kBlock);
      } else {
        const int64_t take = std::min<int64_t>(n, kBlock - static_cast<int64_t>(pending_.size()));
        pending_.insert(pending_.end(), v, v + take);
        if (static_cast<int64_t>(pending_.size()) < kBlock) return;
        merge_block(pending_.data(), kBlock);
        pending_.clear();
        v += take;
        n -= take;
        continue;
      }
      v += kBlock;
      n -= kBlock;
    }
  }
  void fit_end() override {
    merge_block(pending_.data(), static_cast<int64_t>(pending_.size()));
    std::vector<float>().swap(pending_);
    count_ = n_;
    mean_ = n_ ? acc_mean_ : 0.0;
    std_ = n_ ? std::sqrt(m2_ / n_) : 1.0;
    if (!(std_ > 0) || !std::isfinite(std_)) std_ = 1.0;
    fitted_ = true;
  }
  void transform(float* v, int64_t n, int64_t stride) const override {
    const double inv = 1.0 / std_, mean = mean_;
    map_values(v, n, stride, [inv, mean](float x) {
      return static_cast<float>((static_cast<double>(x) - mean) * inv);
    });
  }

 private:
  static constexpr int64_t kBlock = int64_t{1} << 16;

  void merge_block(const float* v, int64_t n) {
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

  double mean_ = 0, std_ = 1;
  int64_t count_ = 0;
  bool fitted_ = false;
  // Running statistics during fit.
  int64_t n_ = 0;
  double acc_mean_ = 0, m2_ = 0;
  std::vector<float> pending_;  // values of the block being filled
};


// {"op": "FillMedian"}: a missing value becomes the median of the finite training values
// reaching the op (the mean of the two middle values for an even count; 0 without values).
// Fitting counts distinct values in a hash map keyed by the value's order-preserving 32-bit
// pattern: exact while the column has at most kMaxDistinct distinct values. Past that, the low
// bits of the keys are dropped (4 at a time) until the map is at most half full again, so the
// memory stays bounded and the median is that of the values rounded to 2^(23 - shift) relative
// precision (the middle of the bucket is reported; docs/ETL.md).
class FillMedian final : public DenseOp {
 public:
  static constexpr size_t kMaxDistinct = size_t{1} << 20;

  FillMedian() = default;
  FillMedian(float median, int64_t count, int shift)
      : median_(median), count_(count), shift_(shift), fitted_(true) {}
  std::string name() const override { return "FillMedian"; }
  bool needs_fit() const override { return true; }
  bool fitted() const override { return fitted_; }
  json to_json() const override {
    json j = {{"op", name()}};
    if (fitted_) {
      j["median"] = median_;
      j["count"] = count_;
      j["exact"] = shift_ == 0;
    }
    return j;
  }
  json fit_summary() const override {
    return {{"median", median_}, {"exact", shift_ == 0}};
  }

  static uint32_t order_key(float x) {
    if (x == 0) x = 0;  // -0 and +0 are one value
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  }
  static float from_order_key(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  }

  void fit_begin() override {
    counts_ = KeyMap<uint64_t>();
    shift_ = 0;
    fitted_ = false;
  }
  void fit_chunk(const float* v, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(v[i])) continue;
      ++counts_[order_key(v[i]) >> shift_];
      if (counts_.size() > kMaxDistinct) coarsen();
    }
  }
  void fit_end() override {
    std::vector<std::pair<uint64_t, uint64_t>> kc;  // (key, count)
    kc.reserve(counts_.size());
    int64_t total = 0;
    counts_.for_each([&](uint64_t k, uint64_t c) {
      kc.emplace_back(k, c);
      total += static_cast<int64_t>(c);
    });
    counts_ = KeyMap<uint64_t>();
    std::sort(kc.begin(), kc.end());
    count_ = total;
    median_ = 0;
    if (total > 0) {
      // The values at sorted positions (total - 1) / 2 and total / 2.
      auto value_at = [&](int64_t pos) {
        int64_t seen = 0;
        for (const auto& [k, c] : kc) {
          seen += static_cast<int64_t>(c);
          if (pos < seen) return bucket_value(k);
        }
        return bucket_value(kc.back().first);
      };
      const double a = value_at((total - 1) / 2), b = value_at(total / 2);
      median_ = static_cast<float>(0.5 * a + 0.5 * b);
    }
    fitted_ = true;
  }
  void transform(float* v, int64_t n, int64_t stride) const override {
    const float median = median_;
    map_values(v, n, stride, [median](float x) { return std::isnan(x) ? median : x; });
  }

 private:
  void coarsen() {
    while (counts_.size() > kMaxDistinct / 2) {
      shift_ += 4;
      KeyMap<uint64_t> next(counts_.size() / 8);
      counts_.for_each([&](uint64_t k, uint64_t c) { next[k >> 4] += c; });
      counts_ = std::move(next);
    }
  }
  // A key's value: exact at shift 0, else the middle of the bucket's value range.
  double bucket_value(uint64_t k) const {
    if (shift_ == 0) return from_order_key(static_cast<uint32_t>(k));
    const uint64_t lo = k << shift_, hi = lo + ((uint64_t{1} << shift_) - 1);
    return 0.5 * from_order_key(static_cast<uint32_t>(lo)) +
           0.5 * from_order_key(static_cast<uint32_t>(hi));
  }

  float median_ = 0;
  int64_t count_ = 0;
  int shift_ = 0;
  bool fitted_ = false;
  KeyMap<uint64_t> counts_;  // during fit only
};

// {"op": "NormalizeMinMax"}: x -> (x - min) / (max - min), min and max fitted on the finite
// training values reaching it. A constant column (max == min) maps to x - min. Missing values
// stay missing.
class NormalizeMinMax final : public DenseOp {
 public:
  NormalizeMinMax() = default;
  NormalizeMinMax(double lo, double hi, int64_t count)
      : min_(lo), max_(hi), count_(count), fitted_(true) {}
  std::string name() const override { return "NormalizeMinMax"; }
  bool needs_fit() const override { return true; }
  bool fitted() const override { return fitted_; }
  json to_json() const override {
    json j = {{"op", name()}};
    if (fitted_) {
      j["min"] = min_;
      j["max"] = max_;
      j["count"] = count_;
    }
    return j;
  }
  json fit_summary() const override { return {{"min", min_}, {"max", max_}}; }
  void fit_begin() override {
    lo_ = std::numeric_limits<double>::infinity();
    hi_ = -lo_;
    n_ = 0;
    fitted_ = false;
  }
  void fit_chunk(const float* v, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(v[i])) {
        lo_ = std::min<double>(lo_, v[i]);
        hi_ = std::max<double>(hi_, v[i]);
        ++n_;
      }
  }
  void fit_end() override {
    count_ = n_;
    min_ = n_ ? lo_ : 0.0;
    max_ = n_ ? hi_ : 0.0;
    fitted_ = true;
  }
  void transform(float* v, int64_t n, int64_t stride) const override {
    const double range = max_ > min_ ? max_ - min_ : 1.0;
    const double inv = 1.0 / range, lo = min_;
    map_values(v, n, stride, [inv, lo](float x) {
      return static_cast<float>((static_cast<double>(x) - lo) * inv);
    });
  }

 private:
  double min_ = 0, max_ = 0;
  int64_t count_ = 0;
  bool fitted_ = false;
  double lo_ = 0, hi_ = 0;
  int64_t n_ = 0;
};

// {"op": "Bucketize", "boundaries": [0, 10, 100]}: ends a dense column's chain and makes it a
// one-hot categorical feature. Id 0 = missing (NaN), id 1 + (number of boundaries <= x)
// otherwise: x < b[0] -> 1, b[0] <= x < b[1] -> 2, ..., x >= b[last] -> len + 1.
// Cardinality = len(boundaries) + 2.
class Bucketize final : public DenseEncoder {
 public:
  explicit Bucketize(std::vector<double> b) : b_(std::move(b)) {}
  std::string name() const override { return "Bucketize"; }
  json to_json() const override { return {{"op", name()}, {"boundaries", b_}}; }
  int64_t cardinality() const override { return static_cast<int64_t>(b_.size()) + 2; }
  void encode(const float* v, int64_t n, int64_t stride, int64_t* ids) const override {
    for (int64_t i = 0; i < n; ++i) {
      const float x = v[i * stride];
      ids[i] = std::isnan(x) ? 0
                             : 1 + (std::upper_bound(b_.begin(), b_.end(), static_cast<double>(x)) -
                                    b_.begin());
    }
  }

 private:
  std::vector<double> b_;
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
  reg.add("Binarize", ColumnType::Dense, [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    if (!r.has("threshold"))
      fail("config key '", r.key_path("threshold"), "' is required (Binarize compares with it)");
    const float threshold = static_cast<float>(finite_number(r, "threshold", 0));
    const auto& names = Binarize::compare_names();
    const std::string cmp = r.get_choice("compare", "gt", names);
    auto it = std::find(names.begin(), names.end(), cmp);
    return std::make_unique<Binarize>(threshold,
                                      static_cast<Binarize::Compare>(it - names.begin()));
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
  reg.add("FillMedian", ColumnType::Dense, [](ConfigReader& r, bool fitted) -> std::unique_ptr<Op> {
    if (!fitted) return std::make_unique<FillMedian>();
    double median = r.require<double>("median");
    int64_t count = r.get<int64_t>("count", 0);
    bool exact = r.get<bool>("exact", true);
    if (!std::isfinite(median)) fail("'", r.path(), "': FillMedian needs a finite median");
    return std::make_unique<FillMedian>(static_cast<float>(median), count, exact ? 0 : 4);
  });
  reg.add("NormalizeMinMax", ColumnType::Dense,
          [](ConfigReader& r, bool fitted) -> std::unique_ptr<Op> {
            if (!fitted) return std::make_unique<NormalizeMinMax>();
            double lo = r.require<double>("min");
            double hi = r.require<double>("max");
            int64_t count = r.get<int64_t>("count", 0);
            if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
              fail("'", r.path(), "': NormalizeMinMax needs finite min <= max");
            return std::make_unique<NormalizeMinMax>(lo, hi, count);
          });
  reg.add("Bucketize", ColumnType::Dense, [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    if (!r.has("boundaries"))
      fail("config key '", r.key_path("boundaries"), "' is required (a list of increasing numbers)");
    std::vector<double> b;
    for (const auto& x : r.raw("boundaries")) {
      if (!x.is_number() || !std::isfinite(x.get<double>()))
        fail("'", r.key_path("boundaries"), "' holds ", x.dump(), ", expected finite numbers");
      b.push_back(x.get<double>());
    }
    if (!r.raw("boundaries").is_array() || b.empty())
      fail("'", r.key_path("boundaries"), "' must be a non-empty list of numbers");
    for (size_t i = 1; i < b.size(); ++i)
      if (!(b[i] > b[i - 1]))
        fail("'", r.key_path("boundaries"), "' must be strictly increasing: ", b[i - 1],
             " then ", b[i]);
    return std::make_unique<Bucketize>(std::move(b));
  });
}

}  // namespace dlrec::etl
