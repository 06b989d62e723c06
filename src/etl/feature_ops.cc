// Step-level ops that read raw columns and add output features (HashedCross, TargetEncoding,
// JoinGroupby) or drop rows (Filter); docs/ETL.md.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/etl/key_map.h"
#include "dlrec/etl/op.h"

namespace dlrec::etl {
namespace {

// The single key of one-hot row r of chunk column `col`; false when missing.
inline bool key_of(const io::RawChunk& c, int col, int64_t r, uint64_t* key) {
  const auto& off = c.cat_offsets[col];
  if (off[r + 1] == off[r]) return false;
  *key = c.cat_values[col][off[r]];
  return true;
}

void require_one_hot(const FeatureInputs& in, const std::string& op, const std::string& where) {
  for (size_t i = 0; i < in.cat.size(); ++i)
    if (in.cat_multi_hot[i])
      fail("op '", op, "' at '", where, "': column '", in.cat_names[i],
           "' is multi-hot; ", op, " supports one-hot columns only");
}

std::vector<uint64_t> read_keys(ConfigReader& r, const std::string& key) {
  const json& v = r.raw(key);
  if (!v.is_array()) fail("'", r.key_path(key), "' must be an array of keys");
  std::vector<uint64_t> out;
  out.reserve(v.size());
  for (const auto& k : v) {
    if (!k.is_number_unsigned() && !(k.is_number_integer() && k.get<int64_t>() >= 0))
      fail("'", r.key_path(key), "' holds ", k.dump(), ", expected a non-negative integer key");
    out.push_back(k.get<uint64_t>());
  }
  return out;
}

template <class T>
std::vector<T> read_numbers(const json& v, const std::string& where, size_t n) {
  if (!v.is_array() || v.size() != n)
    fail("'", where, "' must be an array of ", n, " numbers");
  std::vector<T> out;
  for (const auto& x : v) {
    if (!x.is_number()) fail("'", where, "' holds ", x.dump(), ", expected a number");
    out.push_back(x.get<T>());
  }
  return out;
}

// {"op": "HashedCross", "num_buckets": 100000, "name": "C1_X_C2"}: one new one-hot
// categorical feature from the step's 2+ one-hot categorical columns together. Id 0 when any of
// them is missing, else 1 + h % num_buckets with h = mix64(k1), then h = mix64(h * 0x9E37...
// + mix64(k_i)) for each next key (order matters). Default name: the names joined by "_X_".
class HashedCross final : public FeatureOp {
 public:
  HashedCross(int64_t num_buckets, std::string name)
      : num_buckets_(num_buckets), out_name_(std::move(name)) {}
  std::string name() const override { return "HashedCross"; }
  ColumnType input_type() const override { return ColumnType::Categorical; }
  bool per_column() const override { return false; }
  json to_json() const override {
    return {{"op", name()}, {"num_buckets", num_buckets_}, {"name", out_name_}};
  }
  void bind(const FeatureInputs& in, const std::string& where) override {
    if (in.cat.size() < 2)
      fail("op 'HashedCross' at '", where, "' crosses the step's columns and needs 2 or more, got ",
           in.cat.size());
    require_one_hot(in, "HashedCross", where);
    inputs_ = in;
    if (out_name_.empty())
      for (size_t i = 0; i < in.cat_names.size(); ++i)
        out_name_ += (i ? "_X_" : "") + in.cat_names[i];
  }
  std::vector<std::string> cat_outputs() const override { return {out_name_}; }
  int64_t cat_cardinality(size_t) const override { return num_buckets_ + 1; }
  void transform(const io::RawChunk& c, int64_t lo, int64_t hi, float* const*, int64_t,
                 int64_t* const* ids, const TrainRows*) const override {
    const uint64_t b = static_cast<uint64_t>(num_buckets_);
    for (int64_t r = lo; r < hi; ++r) {
      uint64_t h = 0, k = 0;
      bool missing = false;
      for (size_t i = 0; i < inputs_.cat.size() && !missing; ++i) {
        if (!key_of(c, inputs_.cat[i], r, &k)) {
          missing = true;
          break;
        }
        h = i == 0 ? mix64(k) : mix64(h * 0x9E3779B97F4A7C15ULL + mix64(k));
      }
      ids[0][r - lo] = missing ? 0 : 1 + static_cast<int64_t>(h % b);
    }
  }

 private:
  int64_t num_buckets_;
  std::string out_name_;
};

// {"op": "TargetEncoding", "smoothing": 20}: one dense feature "TE_<column>_<label>" per listed
// one-hot categorical column: (sum + smoothing * mean) / (count + smoothing), with sum and count
// of the label over the training rows holding the key and mean = the label's mean over all
// training rows. A missing or unseen key gets mean. With "kfold": k >= 2, training rows are
// encoded out of fold (docs/ETL.md).
class TargetEncoding final : public FeatureOp {
 public:
  TargetEncoding(double smoothing, int64_t kfold, uint64_t seed)
      : smoothing_(smoothing), kfold_(kfold), seed_(seed) {}
  std::string name() const override { return "TargetEncoding"; }
  ColumnType input_type() const override { return ColumnType::Categorical; }
  bool needs_fit() const override { return true; }
  bool fitted() const override { return fitted_; }
  json to_json() const override {
    json j = {{"op", name()}, {"smoothing", smoothing_}};
    if (kfold_ >= 2) {
      j["kfold"] = kfold_;
      j["seed"] = seed_;
    }
    if (fitted_) {
      j["mean"] = mean_;
      j["rows"] = rows_;
      j["keys"] = keys_;
      j["sums"] = sums_;
      j["counts"] = counts_;
    }
    return j;
  }
  json fit_summary() const override {
    return {{"feature", dense_outputs()[0]}, {"mean", mean_}, {"keys", keys_.size()}};
  }
  void bind(const FeatureInputs& in, const std::string& where) override {
    require_one_hot(in, "TargetEncoding", where);
    if (in.label_name.empty())
      fail("op 'TargetEncoding' at '", where, "' needs a label column in the schema");
    inputs_ = in;
  }
  std::vector<std::string> dense_outputs() const override {
    return {"TE_" + inputs_.cat_names[0] + "_" + inputs_.label_name};
  }
  void fit_begin() override {
    acc_ = KeyMap<Stat>();
    total_ = 0;
    n_ = 0;
    fitted_ = false;
    has_folds_ = false;
    fold_index_ = KeyMap<int64_t>();
    fold_sum_.clear();
    fold_count_.clear();
    fold_total_.assign(static_cast<size_t>(std::max<int64_t>(kfold_, 0)), 0.0);
    fold_rows_.assign(fold_total_.size(), 0);
  }
  void fit_chunk(const io::RawChunk& c) override {
    const bool has_label = static_cast<int64_t>(c.label.size()) == c.rows;
    uint64_t k;
    for (int64_t r = 0; r < c.rows; ++r) {
      const double y = has_label ? c.label[r] : 0.0;
      const int64_t f = kfold_ >= 2 ? fold_of(n_) : -1;  // n_: this row's training index
      total_ += y;
      ++n_;
      if (f >= 0) {
        fold_total_[f] += y;
        ++fold_rows_[f];
      }
      if (key_of(c, inputs_.cat[0], r, &k)) {
        Stat& s = acc_[k];
        s.sum += y;
        ++s.count;
        if (f >= 0) {
          int64_t& slot = fold_index_[k];
          if (slot == 0) {  // 1-based while fitting: 0 = new key
            fold_sum_.resize(fold_sum_.size() + kfold_, 0.0);
            fold_count_.resize(fold_count_.size() + kfold_, 0);
            slot = static_cast<int64_t>(fold_sum_.size() / kfold_);
          }
          fold_sum_[(slot - 1) * kfold_ + f] += y;
          ++fold_count_[(slot - 1) * kfold_ + f];
        }
      }
    }
  }
  void fit_end() override {
    std::vector<std::pair<uint64_t, Stat>> v;
    acc_.for_each([&](uint64_t k, const Stat& s) { v.emplace_back(k, s); });
    acc_ = KeyMap<Stat>();
    std::sort(v.begin(), v.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    keys_.clear();
    sums_.clear();
    counts_.clear();
    for (const auto& [k, s] : v) {
      keys_.push_back(k);
      sums_.push_back(s.sum);
      counts_.push_back(s.count);
    }
    rows_ = n_;
    mean_ = n_ ? total_ / n_ : 0.0;
    build();
    if (kfold_ >= 2) build_folds();
  }
  void set_state(double mean, int64_t rows, std::vector<uint64_t> keys, std::vector<double> sums,
                 std::vector<int64_t> counts) {
    mean_ = mean;
    rows_ = rows;
    keys_ = std::move(keys);
    sums_ = std::move(sums);
    counts_ = std::move(counts);
    build();
  }
  void transform(const io::RawChunk& c, int64_t lo, int64_t hi, float* const* dense,
                 int64_t stride, int64_t* const*, const TrainRows* train) const override {
    const float prior = static_cast<float>(mean_);
    uint64_t k;
    const int64_t train_end = kfold_ >= 2 && train ? std::min(hi, train->rows) : lo;
    if (train_end > lo && !has_folds_)
      fail("TargetEncoding (kfold ", kfold_, ") of column '", inputs_.cat_names[0],
           "': encoding training rows needs the per-fold statistics of a fit in this process");
    for (int64_t r = lo; r < train_end; ++r) {  // out of fold
      const int64_t f = fold_of(train->first + r);
      float v = oof_prior_[f];
      if (key_of(c, inputs_.cat[0], r, &k))
        if (const int64_t* i = fold_index_.find(k)) v = oof_[(*i - 1) * kfold_ + f];
      dense[0][(r - lo) * stride] = v;
    }
    for (int64_t r = std::max(lo, train_end); r < hi; ++r) {
      float v = prior;
      if (key_of(c, inputs_.cat[0], r, &k))
        if (const int64_t* i = index_.find(k)) v = encoded_[*i];
      dense[0][(r - lo) * stride] = v;
    }
  }

 private:
  struct Stat {
    double sum = 0;
    int64_t count = 0;
  };
  void build() {
    index_ = KeyMap<int64_t>(keys_.size());
    encoded_.resize(keys_.size());
    for (size_t i = 0; i < keys_.size(); ++i) {
      index_[keys_[i]] = static_cast<int64_t>(i);
      encoded_[i] = static_cast<float>((sums_[i] + smoothing_ * mean_) /
                                       (static_cast<double>(counts_[i]) + smoothing_));
    }
    fitted_ = true;
  }

  // Fold of training row i: a seeded hash, so folds are balanced and do not follow the input
  // order (NVTabular assigns folds at random too).
  int64_t fold_of(int64_t i) const {
    return static_cast<int64_t>(mix64(static_cast<uint64_t>(i) ^ mix64(seed_ + 0x9E3779B97F4A7C15ULL)) %
                                static_cast<uint64_t>(kfold_));
  }
  // Out-of-fold encodings: for fold f, the statistics of the training rows of the other folds.
  void build_folds() {
    const int64_t k = kfold_;
    oof_prior_.assign(k, static_cast<float>(mean_));
    for (int64_t f = 0; f < k; ++f) {
      const int64_t n = n_ - fold_rows_[f];
      if (n > 0) oof_prior_[f] = static_cast<float>((total_ - fold_total_[f]) / n);
    }
    const size_t slots = fold_sum_.size() / k;
    oof_.resize(fold_sum_.size());
    std::vector<double> key_sum(slots, 0.0);
    std::vector<int64_t> key_count(slots, 0);
    for (size_t s = 0; s < slots; ++s)
      for (int64_t f = 0; f < k; ++f) {
        key_sum[s] += fold_sum_[s * k + f];
        key_count[s] += fold_count_[s * k + f];
      }
    for (size_t s = 0; s < slots; ++s)
      for (int64_t f = 0; f < k; ++f) {
        const int64_t n = n_ - fold_rows_[f];
        const double prior = n > 0 ? (total_ - fold_total_[f]) / n : mean_;
        const double sum = key_sum[s] - fold_sum_[s * k + f];
        const int64_t count = key_count[s] - fold_count_[s * k + f];
        oof_[s * k + f] = static_cast<float>((sum + smoothing_ * prior) /
                                             (static_cast<double>(count) + smoothing_));
        if (count == 0 && smoothing_ == 0) oof_[s * k + f] = static_cast<float>(prior);
      }
    std::vector<double>().swap(fold_sum_);
    std::vector<int64_t>().swap(fold_count_);
    has_folds_ = true;
  }

  double smoothing_;
  int64_t kfold_ = 0;
  uint64_t seed_ = 0;
  bool has_folds_ = false;
  KeyMap<int64_t> fold_index_;             // key -> 1 + slot (per-fold tables below)
  std::vector<double> fold_sum_;           // [slot * kfold + fold], while fitting
  std::vector<int64_t> fold_count_;
  std::vector<double> fold_total_;         // label sum per fold
  std::vector<int64_t> fold_rows_;         // training rows per fold
  std::vector<float> oof_;                 // out-of-fold encoding [slot * kfold + fold]
  std::vector<float> oof_prior_;           // out-of-fold mean per fold
  double mean_ = 0;
  int64_t rows_ = 0;
  std::vector<uint64_t> keys_;
  std::vector<double> sums_;
  std::vector<int64_t> counts_;
  KeyMap<int64_t> index_;
  std::vector<float> encoded_;
  bool fitted_ = false;
  KeyMap<Stat> acc_;
  double total_ = 0;
  int64_t n_ = 0;
};

// {"op": "JoinGroupby", "cont_cols": ["I1"], "stats": ["count", "sum", "mean"]}: per listed
// one-hot categorical column C, dense features "C_count" (training rows holding the key) and,
// for each cont column X, "C_X_sum" / "C_X_mean" (over the finite raw values of X in those
// rows). A missing or unseen key gets 0 for every statistic.
class JoinGroupby final : public FeatureOp {
 public:
  JoinGroupby(std::vector<std::string> cont, std::vector<std::string> stats)
      : cont_(std::move(cont)), stats_(std::move(stats)) {}
  std::string name() const override { return "JoinGroupby"; }
  ColumnType input_type() const override { return ColumnType::Categorical; }
  bool needs_fit() const override { return true; }
  bool fitted() const override { return fitted_; }
  std::vector<std::string> dense_inputs() const override { return cont_; }
  bool want(const char* s) const { return std::find(stats_.begin(), stats_.end(), s) != stats_.end(); }
  json to_json() const override {
    json j = {{"op", name()}, {"cont_cols", cont_}, {"stats", stats_}};
    if (fitted_) {
      j["keys"] = keys_;
      j["counts"] = counts_;
      j["sums"] = sums_;
      j["present"] = present_;
    }
    return j;
  }
  json fit_summary() const override { return {{"keys", keys_.size()}}; }
  void bind(const FeatureInputs& in, const std::string& where) override {
    require_one_hot(in, "JoinGroupby", where);
    inputs_ = in;
  }
  std::vector<std::string> dense_outputs() const override {
    std::vector<std::string> v;
    const std::string& c = inputs_.cat_names[0];
    if (want("count")) v.push_back(c + "_count");
    for (const auto& x : cont_)
      for (const auto& s : stats_)
        if (s != "count") v.push_back(c + "_" + x + "_" + s);
    return v;
  }
  void fit_begin() override {
    acc_ = KeyMap<int64_t>();
    keys_.clear();
    counts_.clear();
    sums_.assign(cont_.size(), {});
    present_.assign(cont_.size(), {});
    fitted_ = false;
  }
  void fit_chunk(const io::RawChunk& c) override {
    uint64_t k;
    for (int64_t r = 0; r < c.rows; ++r) {
      if (!key_of(c, inputs_.cat[0], r, &k)) continue;
      int64_t& slot = acc_[k];
      if (slot == 0) {  // new key: slot holds index + 1
        keys_.push_back(k);
        counts_.push_back(0);
        for (size_t j = 0; j < cont_.size(); ++j) {
          sums_[j].push_back(0);
          present_[j].push_back(0);
        }
        slot = static_cast<int64_t>(keys_.size());
      }
      const size_t i = static_cast<size_t>(slot - 1);
      ++counts_[i];
      for (size_t j = 0; j < cont_.size(); ++j) {
        const float x = c.dense[r * c.num_dense + inputs_.dense[j]];
        if (std::isfinite(x)) {
          sums_[j][i] += x;
          ++present_[j][i];
        }
      }
    }
  }
  void fit_end() override {
    acc_ = KeyMap<int64_t>();
    // Key order, so the saved state does not depend on the order rows came in.
    std::vector<size_t> order(keys_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys_[a] < keys_[b]; });
    auto permute = [&](auto& v) {
      auto copy = v;
      for (size_t i = 0; i < order.size(); ++i) v[i] = copy[order[i]];
    };
    permute(keys_);
    permute(counts_);
    for (size_t j = 0; j < cont_.size(); ++j) {
      permute(sums_[j]);
      permute(present_[j]);
    }
    build();
  }
  void set_state(std::vector<uint64_t> keys, std::vector<int64_t> counts,
                 std::vector<std::vector<double>> sums, std::vector<std::vector<int64_t>> present) {
    keys_ = std::move(keys);
    counts_ = std::move(counts);
    sums_ = std::move(sums);
    present_ = std::move(present);
    build();
  }
  void transform(const io::RawChunk& c, int64_t lo, int64_t hi, float* const* dense,
                 int64_t stride, int64_t* const*, const TrainRows*) const override {
    const size_t nout = table_.empty() ? 0 : table_.size() / (keys_.size() + 1);
    uint64_t k;
    for (int64_t r = lo; r < hi; ++r) {
      size_t row = keys_.size();  // the all-zero row
      if (key_of(c, inputs_.cat[0], r, &k))
        if (const int64_t* i = index_.find(k)) row = static_cast<size_t>(*i);
      for (size_t j = 0; j < nout; ++j) dense[j][(r - lo) * stride] = table_[row * nout + j];
    }
  }

 private:
  void build() {
    index_ = KeyMap<int64_t>(keys_.size());
    for (size_t i = 0; i < keys_.size(); ++i) index_[keys_[i]] = static_cast<int64_t>(i);
    // Output values per key, in dense_outputs() order, plus a row of zeros.
    std::vector<float> t;
    for (size_t i = 0; i <= keys_.size(); ++i) {
      const bool known = i < keys_.size();
      if (want("count")) t.push_back(known ? static_cast<float>(counts_[i]) : 0.0f);
      for (size_t j = 0; j < cont_.size(); ++j)
        for (const auto& s : stats_) {
          if (s == "count") continue;
          float v = 0;
          if (known && s == "sum") v = static_cast<float>(sums_[j][i]);
          if (known && s == "mean" && present_[j][i] > 0)
            v = static_cast<float>(sums_[j][i] / static_cast<double>(present_[j][i]));
          t.push_back(v);
        }
    }
    table_ = std::move(t);
    fitted_ = true;
  }

  std::vector<std::string> cont_, stats_;
  std::vector<uint64_t> keys_;
  std::vector<int64_t> counts_;
  std::vector<std::vector<double>> sums_;      // [cont][key]
  std::vector<std::vector<int64_t>> present_;  // [cont][key]: finite values summed
  KeyMap<int64_t> index_;
  std::vector<float> table_;
  bool fitted_ = false;
  KeyMap<int64_t> acc_;
};

// {"op": "Filter", "min": 0, "max": 100, "keep_missing": false}: keeps a row only when the
// raw value of each listed dense column is within [min, max] (either bound may be absent); a
// missing value fails the predicate unless keep_missing.
class Filter final : public RowFilter {
 public:
  Filter(double lo, double hi, bool keep_missing) : lo_(lo), hi_(hi), keep_missing_(keep_missing) {}
  std::string name() const override { return "Filter"; }
  json to_json() const override {
    json j = {{"op", name()}};
    if (std::isfinite(lo_)) j["min"] = lo_;
    if (std::isfinite(hi_)) j["max"] = hi_;
    j["keep_missing"] = keep_missing_;
    return j;
  }
  void apply(const float* v, int64_t n, int64_t stride, uint8_t* keep) const override {
    for (int64_t i = 0; i < n; ++i) {
      const float x = v[i * stride];
      const bool ok = std::isnan(x) ? keep_missing_ : (x >= lo_ && x <= hi_);
      keep[i] = keep[i] && ok;
    }
  }

 private:
  double lo_, hi_;
  bool keep_missing_;
};

}  // namespace

void register_feature_ops(OpRegistry& reg) {
  const int64_t big = std::numeric_limits<int64_t>::max() / 4;
  reg.add("HashedCross", ColumnType::Categorical, [big](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    if (!r.has("num_buckets")) fail("config key '", r.key_path("num_buckets"), "' is required");
    int64_t b = r.get_int_range("num_buckets", 1, 1, big);
    return std::make_unique<HashedCross>(b, r.get<std::string>("name", ""));
  });
  reg.add("TargetEncoding", ColumnType::Categorical,
          [](ConfigReader& r, bool fitted) -> std::unique_ptr<Op> {
            double s = r.get_range("smoothing", 20.0, 0.0, 1e300);
            const int64_t kfold = r.get_int_range("kfold", 0, 0, 1000);
            if (kfold == 1)
              fail("'", r.key_path("kfold"), "' must be 0 (off) or at least 2, got 1");
            if (kfold == 0 && r.has("seed"))
              fail("'", r.key_path("seed"), "' applies with kfold >= 2 only");
            const int64_t seed =
                r.get_int_range("seed", 42, 0, std::numeric_limits<int64_t>::max());
            auto op = std::make_unique<TargetEncoding>(s, kfold, static_cast<uint64_t>(seed));
            if (fitted) {
              double mean = r.require<double>("mean");
              int64_t rows = r.get<int64_t>("rows", 0);
              std::vector<uint64_t> keys = read_keys(r, "keys");
              auto sums = read_numbers<double>(r.raw("sums"), r.key_path("sums"), keys.size());
              auto counts =
                  read_numbers<int64_t>(r.raw("counts"), r.key_path("counts"), keys.size());
              for (size_t i = 0; i < counts.size(); ++i)
                if (counts[i] <= 0 && s == 0)
                  fail("'", r.key_path("counts"), "' holds a non-positive count");
              op->set_state(mean, rows, std::move(keys), std::move(sums), std::move(counts));
            }
            return op;
          });
  reg.add("JoinGroupby", ColumnType::Categorical,
          [](ConfigReader& r, bool fitted) -> std::unique_ptr<Op> {
            auto cont = r.get<std::vector<std::string>>("cont_cols", {});
            auto stats = r.get<std::vector<std::string>>("stats", {"count"});
            const std::vector<std::string> known = {"count", "sum", "mean"};
            for (const auto& s : stats)
              if (std::find(known.begin(), known.end(), s) == known.end()) {
                std::string near = nearest_name(s, known);
                fail("'", r.key_path("stats"), "': unknown statistic '", s, "'",
                     near.empty() ? "" : " (did you mean '" + near + "'?)",
                     "; use count, sum, mean");
              }
            if (stats.empty()) fail("'", r.key_path("stats"), "' must not be empty");
            if (cont.empty() && (stats.size() > 1 || stats[0] != "count"))
              fail("'", r.path(), "': JoinGroupby stats sum/mean need \"cont_cols\"");
            auto op = std::make_unique<JoinGroupby>(cont, stats);
            if (fitted) {
              std::vector<uint64_t> keys = read_keys(r, "keys");
              auto counts =
                  read_numbers<int64_t>(r.raw("counts"), r.key_path("counts"), keys.size());
              const json& sj = r.raw("sums");
              const json& pj = r.raw("present");
              if (!sj.is_array() || sj.size() != cont.size() || !pj.is_array() ||
                  pj.size() != cont.size())
                fail("'", r.path(), "': 'sums' and 'present' need one list per cont column");
              std::vector<std::vector<double>> sums;
              std::vector<std::vector<int64_t>> present;
              for (size_t j = 0; j < cont.size(); ++j) {
                sums.push_back(read_numbers<double>(sj[j], r.key_path("sums"), keys.size()));
                present.push_back(read_numbers<int64_t>(pj[j], r.key_path("present"), keys.size()));
              }
              op->set_state(std::move(keys), std::move(counts), std::move(sums),
                            std::move(present));
            }
            return op;
          });
  reg.add("Filter", ColumnType::Dense, [](ConfigReader& r, bool) -> std::unique_ptr<Op> {
    const double inf = std::numeric_limits<double>::infinity();
    const double m = std::numeric_limits<double>::max();
    double lo = r.has("min") ? r.get_range("min", 0, -m, m) : -inf;
    double hi = r.has("max") ? r.get_range("max", 0, -m, m) : inf;
    bool keep_missing = r.get<bool>("keep_missing", false);
    if (lo > hi) fail("'", r.path(), "': Filter min ", lo, " is greater than max ", hi);
    return std::make_unique<Filter>(lo, hi, keep_missing);
  });
}

}  // namespace dlrec::etl
