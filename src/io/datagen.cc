// Synthetic Criteo-like data. How it is made (everything below is deterministic):
//
// * Rows are generated in blocks of kBlockRows; block b draws from its own splitmix64 stream
//   seeded from (seed, b), so the output does not depend on the thread count. Blocks are made in
//   parallel in groups and written in order.
// * Categorical column c with cardinality N draws a 0-based rank k from a Zipf(s) law: ranks
//   below kHeadRanks exactly (cumulative table + guide table, integer comparisons), the tail
//   from the continuous power law x^-s on [head + 0.5, N + 0.5) by inversion, rounded — close to
//   the discrete law and O(1). Rank k is written as the 8 hex digits of a 32-bit bijection of
//   (c, k), so ids look like Criteo's hashes and never collide within a column.
// * The planted signal: logit = bias + sum_c w(c, k_c) + sum_j v_j * z_j, where
//     w(c, k) = S * a_c * g(c, k) / sqrt(1 + k / kWeightHalfRank),  g(c, k) ~ N(0,1) from a hash
//   of (c, k) only (not of the seed, so files made with different seeds share one signal and a
//   model trained on one generalises to the other). Weights fade with the rank: rare
//   categories, which a model cannot learn from a few million rows, carry little of the signal.
//   z_j is the latent normal behind dense feature j (its value is floor(exp(mu_j + sigma_j z_j))
//   + shift_j, so log(value) is learnable); missing features contribute 0. Multi-hot fields add
//   the mean weight of their values. S = signal_strength * kWeightScale makes the logit's
//   standard deviation about 1.7 at signal_strength 1.
// * The bias is solved (bisection) so that the mean click probability over a fixed calibration
//   sample is base_ctr; the label is Bernoulli(sigmoid(logit)).
// * The math in the data path (exp, log, normal quantiles) is this file's own, built from IEEE
//   +, -, *, / and sqrt only, so the bytes do not depend on the platform's libm.
#include "dlrec/io/datagen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/synthetic_batch.h"
#include "io/datagen_math.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

namespace dlrec::io {
namespace {

using namespace datagen_math;

constexpr int64_t kBlockRows = 8192;       // rows per RNG stream (fixed: part of the format)
constexpr int64_t kHeadRanks = 1024;       // Zipf ranks sampled from an exact table
constexpr int kGuideBits = 12;             // guide table of the head sampler
constexpr int kUBits = 40;                 // resolution of the uniform used by the samplers
constexpr double kWeightScale = 0.55;      // S at signal_strength 1
constexpr double kWeightHalfRank = 48.0;   // weight decays as 1/sqrt(1 + rank / this)
constexpr int kQuantileBits = 12;          // normal quantile table: 2^12 intervals
constexpr int64_t kAucMaxRows = 1 << 24;   // signal_auc uses at most this many rows
constexpr int64_t kCalibrationRows = 50000;
constexpr int kMaxFixedHotness = 1024;     // DatagenConfig::hotness: values per field at most

// A bijection of 32-bit integers (odd multiplies and xor-shifts are invertible).
inline uint32_t permute32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x9E3779B1u;
  x ^= x >> 15;
  x *= 0x85EBCA77u;
  x ^= x >> 16;
  return x;
}

// Standard normal quantiles at u = i / 2^kQuantileBits (ends pulled in by a quarter step), by
// inverting a numerically integrated CDF; interpolated between nodes, the draws are normal to
// within a few 1e-4 and clipped at about +-3.7.
class NormalQuantiles {
 public:
  NormalQuantiles() {
    const int n = 1 << kQuantileBits;
    // CDF on a fine grid by the trapezoid rule on [-8, 8].
    const int steps = 1 << 16;
    const double lo = -8.0, h = 16.0 / steps;
    std::vector<double> cdf(steps + 1);
    const double c = 1.0 / std::sqrt(2.0 * 3.14159265358979323846);
    double prev = c * det_exp(-0.5 * lo * lo), acc = 0;
    cdf[0] = 0;
    for (int i = 1; i <= steps; ++i) {
      double z = lo + h * i;
      double cur = c * det_exp(-0.5 * z * z);
      acc += 0.5 * h * (prev + cur);
      cdf[i] = acc;
      prev = cur;
    }
    for (auto& v : cdf) v /= acc;
    q_.resize(n + 1);
    int j = 0;
    for (int i = 0; i <= n; ++i) {
      double u = static_cast<double>(i) / n;
      u = std::min(std::max(u, 0.25 / n), 1.0 - 0.25 / n);
      while (j < steps && cdf[j + 1] < u) ++j;
      double t = (u - cdf[j]) / (cdf[j + 1] - cdf[j]);
      q_[i] = lo + h * (j + t);
    }
  }
  // A normal draw from 40 random bits (12 pick the interval, 28 the position in it).
  double operator()(uint64_t u40) const {
    const uint64_t i = u40 >> (kUBits - kQuantileBits);
    const double f = static_cast<double>(u40 & ((1ull << (kUBits - kQuantileBits)) - 1)) *
                     (1.0 / (1ull << (kUBits - kQuantileBits)));
    return q_[i] + f * (q_[i + 1] - q_[i]);
  }
  const std::vector<double>& nodes() const { return q_; }

 private:
  std::vector<double> q_;
};

const NormalQuantiles& normal_quantiles() {
  static const NormalQuantiles q;
  return q;
}

// ---- samplers -------------------------------------------------------------------------------

// Zipf(s) over ranks 0..n-1 (rank 0 the most frequent), from 40 uniform bits.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s) : n_(n) {
    const int64_t head = std::min(n, kHeadRanks);
    std::vector<double> w(head);
    double head_sum = 0;
    for (int64_t r = 0; r < head; ++r) {
      w[r] = det_pow(static_cast<double>(r + 1), -s);
      head_sum += w[r];
    }
    double tail_sum = 0;
    one_ = std::abs(s - 1.0) < 1e-9;
    if (n > head) {
      const double a = static_cast<double>(head) + 0.5, b = static_cast<double>(n) + 0.5;
      if (one_) {
        ta_ = det_log(a);
        tb_ = det_log(b);
        tail_sum = tb_ - ta_;
      } else {
        inv_ = 1.0 / (1.0 - s);
        ta_ = det_pow(a, 1.0 - s);
        tb_ = det_pow(b, 1.0 - s);
        tail_sum = (tb_ - ta_) * inv_;
      }
    }
    const double total = head_sum + tail_sum;
    const double scale = static_cast<double>(1ull << kUBits);
    cdf_.resize(head);
    double acc = 0;
    for (int64_t r = 0; r < head; ++r) {
      acc += w[r];
      cdf_[r] = static_cast<uint64_t>(acc / total * scale);
    }
    if (n == head) cdf_.back() = 1ull << kUBits;
    head_mass_ = cdf_.back();
    tail_scale_ = 1.0 / static_cast<double>((1ull << kUBits) - head_mass_ + 1);
    guide_.resize((1 << kGuideBits) + 1);
    int64_t r = 0;
    for (size_t g = 0; g < guide_.size(); ++g) {
      const uint64_t u = static_cast<uint64_t>(g) << (kUBits - kGuideBits);
      while (r + 1 < head && cdf_[r] <= u) ++r;
      guide_[g] = static_cast<uint32_t>(r);
    }
  }

  int64_t operator()(uint64_t u40) const {
    if (u40 < head_mass_) {
      int64_t r = guide_[u40 >> (kUBits - kGuideBits)];
      while (cdf_[r] <= u40) ++r;
      return r;
    }
    const double t = static_cast<double>(u40 - head_mass_) * tail_scale_;  // [0, 1)
    const double y = ta_ + t * (tb_ - ta_);
    const double x = one_ ? det_exp(y) : det_exp(inv_ * det_log(y));
    int64_t r = static_cast<int64_t>(x + 0.5) - 1;  // nearest 1-based rank, made 0-based
    return std::min(n_ - 1, std::max<int64_t>(static_cast<int64_t>(cdf_.size()), r));
  }

 private:
  int64_t n_;
  bool one_ = false;
  double inv_ = 0, ta_ = 0, tb_ = 0, tail_scale_ = 0;
  uint64_t head_mass_ = 0;
  std::vector<uint64_t> cdf_;    // cumulative mass of ranks 0..r, scaled to 2^40
  std::vector<uint32_t> guide_;  // first rank whose cumulative mass exceeds the bucket start
};

// ---- text output ----------------------------------------------------------------------------

struct HexPairs {
  char c[256][2];
  HexPairs() {
    const char* d = "0123456789abcdef";
    for (int i = 0; i < 256; ++i) c[i][0] = d[i >> 4], c[i][1] = d[i & 15];
  }
};
const HexPairs kHexPairs;

struct DecPairs {
  char c[100][2];
  DecPairs() {
    for (int i = 0; i < 100; ++i) c[i][0] = static_cast<char>('0' + i / 10), c[i][1] = static_cast<char>('0' + i % 10);
  }
};
const DecPairs kDecPairs;

inline char* write_hex32(char* p, uint32_t x) {
  std::memcpy(p, kHexPairs.c[x >> 24], 2);
  std::memcpy(p + 2, kHexPairs.c[(x >> 16) & 255], 2);
  std::memcpy(p + 4, kHexPairs.c[(x >> 8) & 255], 2);
  std::memcpy(p + 6, kHexPairs.c[x & 255], 2);
  return p + 8;
}

inline char* write_int(char* p, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  if (v < 0) {
    *p++ = '-';
    u = 0 - u;
  }
  int n = 1;
  for (uint64_t t = u; t >= 10; t /= 10) ++n;
  char* end = p + n;
  char* t = end;
  while (u >= 100) {
    t -= 2;
    std::memcpy(t, kDecPairs.c[u % 100], 2);
    u /= 100;
  }
  if (u >= 10) {
    std::memcpy(t - 2, kDecPairs.c[u], 2);
  } else {
    t[-1] = static_cast<char>('0' + u);
  }
  return end;
}

// ---- the model of the data ------------------------------------------------------------------

struct CatColumn {
  ZipfSampler zipf;
  uint32_t salt;           // mixes the column into its hex ids
  double scale;            // S * a_c
  std::vector<float> head_weight;  // w(c, k) for small ranks
  bool multi_hot;
  uint64_t key;            // hash key of the column for per-category weights
  int fixed_hot;           // values per multi-hot field when fixed (DatagenConfig::hotness), else 0
};

struct DenseColumn {
  std::vector<double> value_nodes;  // exp(mu + sigma * q_i)
  int64_t shift;
  double weight;  // signal weight of the latent normal
};

class Generator {
 public:
  explicit Generator(const DatagenConfig& cfg) : cfg_(cfg), nq_(normal_quantiles()) {
    const double S = cfg.signal_strength * kWeightScale;
    for (int c = 0; c < cfg.num_cat; ++c) {
      const int64_t card = cfg.cardinalities.empty()
                               ? 1
                               : cfg.cardinalities[std::min<size_t>(c, cfg.cardinalities.size() - 1)];
      const uint64_t h = mix64(0xC0FFEEull + static_cast<uint64_t>(c));
      const double a = 0.35 + 0.65 * static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
      CatColumn col{ZipfSampler(card, cfg.zipf_s), static_cast<uint32_t>(mix64(h) >> 32), S * a,
                    {}, cfg.is_multi_hot(c), mix64(h ^ 0x5EEDull), cfg.fixed_hotness(c)};
      col.head_weight.resize(std::min<int64_t>(card, 4096));
      for (size_t k = 0; k < col.head_weight.size(); ++k)
        col.head_weight[k] = static_cast<float>(weight_of(col, static_cast<int64_t>(k)));
      cats_.push_back(std::move(col));
    }
    // Dense columns: count-like values of varied spread; a few carry signal.
    const double dense_w[] = {0.30, 0.0, -0.25, 0.0, 0.0, 0.20, 0.0, 0.0, 0.0, 0.0, -0.15};
    for (int j = 0; j < cfg.num_dense; ++j) {
      const uint64_t h = mix64(0xDE75Eull + static_cast<uint64_t>(j));
      const double mu = 0.3 + 3.5 * static_cast<double>(h >> 40) / 16777216.0;
      const double sigma = 0.7 + 1.3 * static_cast<double>((h >> 16) & 0xFFFFFF) / 16777216.0;
      DenseColumn d;
      for (double q : nq_.nodes()) d.value_nodes.push_back(det_exp(mu + sigma * q));
      d.shift = j == 1 ? -1 : 0;  // like Criteo's I2, one column has small negative values
      d.weight = j < 11 ? dense_w[j] * cfg.signal_strength : 0.0;
      dense_.push_back(std::move(d));
    }
    // Bound on the bytes of one line.
    max_line_ = 4 + static_cast<size_t>(cfg.num_dense) * 22;
    for (const CatColumn& c : cats_)
      max_line_ += !c.multi_hot ? 10 : 1 + 9 * static_cast<size_t>(c.fixed_hot > 0 ? c.fixed_hot
                                                                                 : cfg.max_hotness);
    calibrate();
  }

  size_t max_line() const { return max_line_; }

  // One row: writes its text at p (when kWrite) and returns the end; the row's logit and label
  // are returned through the arguments.
  template <bool kWrite>
  char* row(Rng& rng, char* p, double& logit, int& label) const {
    char* label_pos = p;
    if (kWrite) p += 1;
    const uint64_t dense_miss = threshold(cfg_.dense_missing);
    const uint64_t cat_miss = threshold(cfg_.cat_missing);
    double x = bias_;
    for (const DenseColumn& d : dense_) {
      const uint64_t r = rng.next();
      if (kWrite) *p++ = '\t';
      if ((r >> 40) < dense_miss) continue;
      const uint64_t u = r & ((1ull << kUBits) - 1);
      const uint64_t i = u >> (kUBits - kQuantileBits);
      const double f = static_cast<double>(u & ((1ull << (kUBits - kQuantileBits)) - 1)) *
                       (1.0 / (1ull << (kUBits - kQuantileBits)));
      if (d.weight != 0) x += d.weight * nq_(u);
      if (kWrite) {
        const double v = d.value_nodes[i] + f * (d.value_nodes[i + 1] - d.value_nodes[i]);
        p = write_int(p, static_cast<int64_t>(v) + d.shift);
      }
    }
    for (const CatColumn& c : cats_) {
      const uint64_t r = rng.next();
      if (kWrite) *p++ = '\t';
      if ((r >> 40) < cat_miss) continue;
      if (!c.multi_hot) {
        const int64_t k = c.zipf(r & ((1ull << kUBits) - 1));
        x += weight(c, k);
        if (kWrite) p = write_hex32(p, hex_id(c, k));
        continue;
      }
      const int hot =
          c.fixed_hot > 0
              ? c.fixed_hot
              : 1 + static_cast<int>((r & 0xFFFF) * static_cast<uint64_t>(cfg_.max_hotness) >> 16);
      double sum = 0;
      for (int h = 0; h < hot; ++h) {
        const int64_t k = c.zipf(rng.next() >> (64 - kUBits));
        sum += weight(c, k);
        if (kWrite) {
          if (h > 0) *p++ = ',';
          p = write_hex32(p, hex_id(c, k));
        }
      }
      x += sum / hot;
    }
    const double prob = sigmoid(x);
    label = rng.uniform() < prob ? 1 : 0;
    logit = x;
    if (kWrite) {
      *label_pos = static_cast<char>('0' + label);
      *p++ = '\n';
    }
    return p;
  }

 private:
  static uint64_t threshold(double prob) {  // compared with 24 random bits
    return static_cast<uint64_t>(prob * 16777216.0 + 0.5);
  }

  uint32_t hex_id(const CatColumn& c, int64_t k) const {
    return permute32(static_cast<uint32_t>(k) ^ c.salt);
  }

  double weight_of(const CatColumn& c, int64_t k) const {
    const uint64_t h = mix64(c.key ^ (static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull));
    return c.scale * nq_(h >> (64 - kUBits)) /
           std::sqrt(1.0 + static_cast<double>(k) / kWeightHalfRank);
  }

  double weight(const CatColumn& c, int64_t k) const {
    return k < static_cast<int64_t>(c.head_weight.size()) ? c.head_weight[k] : weight_of(c, k);
  }

  // Solves mean(sigmoid(bias + logit)) = base_ctr over a fixed sample (independent of the seed).
  void calibrate() {
    bias_ = 0;
    std::vector<double> logits(kCalibrationRows);
    Rng rng(0xCA11B4A7Eull);
    int label;
    for (auto& l : logits) row<false>(rng, nullptr, l, label);
    // Newton's method on a monotone function, kept inside a shrinking bracket.
    double lo = -60, hi = 60, b = det_log(cfg_.base_ctr / (1 - cfg_.base_ctr));
    for (int it = 0; it < 50; ++it) {
      double mean = 0, slope = 0;
      for (double l : logits) {
        const double q = sigmoid(b + l);
        mean += q;
        slope += q * (1 - q);
      }
      mean /= static_cast<double>(logits.size());
      slope /= static_cast<double>(logits.size());
      const double f = mean - cfg_.base_ctr;
      (f < 0 ? lo : hi) = b;
      if (std::abs(f) < 1e-9 * cfg_.base_ctr) break;
      double nb = slope > 0 ? b - f / slope : 0.5 * (lo + hi);
      if (!(nb > lo && nb < hi)) nb = 0.5 * (lo + hi);
      b = nb;
    }
    bias_ = b;
  }

  const DatagenConfig& cfg_;
  const NormalQuantiles& nq_;
  std::vector<CatColumn> cats_;
  std::vector<DenseColumn> dense_;
  size_t max_line_ = 0;
  double bias_ = 0;
};

// Order-preserving key of a float score.
inline uint32_t score_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exact AUC of (score key, label) pairs packed as key << 32 | label. Ties count one half.
double exact_auc(std::vector<uint64_t>& v) {
  // LSD radix sort on the 32-bit key, two passes of 16 bits.
  std::vector<uint64_t> tmp(v.size());
  for (int pass = 0; pass < 2; ++pass) {
    const int shift = 32 + 16 * pass;
    std::vector<size_t> count(65537, 0);
    for (uint64_t x : v) ++count[((x >> shift) & 0xFFFF) + 1];
    for (int i = 0; i < 65536; ++i) count[i + 1] += count[i];
    for (uint64_t x : v) tmp[count[(x >> shift) & 0xFFFF]++] = x;
    v.swap(tmp);
  }
  double neg_below = 0, pos = 0, neg = 0, sum = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    double gp = 0, gn = 0;
    while (j < v.size() && (v[j] >> 32) == (v[i] >> 32)) {
      (v[j] & 1 ? gp : gn) += 1;
      ++j;
    }
    sum += gp * (neg_below + 0.5 * gn);
    neg_below += gn;
    pos += gp;
    neg += gn;
    i = j;
  }
  if (pos == 0 || neg == 0) return 0.5;
  return sum / (pos * neg);
}

void validate(const DatagenConfig& c) {
  DLREC_CHECK(c.rows >= 0, "datagen: rows must be >= 0");
  DLREC_CHECK(c.num_dense >= 0 && c.num_cat >= 0, "datagen: negative column count");
  DLREC_CHECK(c.num_cat == 0 || !c.cardinalities.empty(), "datagen: cardinalities is empty");
  for (int64_t v : c.cardinalities)
    DLREC_CHECK(v >= 1 && v <= (int64_t{1} << 32), "datagen: cardinality ", v,
                " is out of range [1, 2^32]");
  DLREC_CHECK(c.zipf_s > 0 && c.zipf_s <= 10, "datagen: zipf_s must be in (0, 10]");
  DLREC_CHECK(c.dense_missing >= 0 && c.dense_missing <= 1, "datagen: dense_missing not in [0,1]");
  DLREC_CHECK(c.cat_missing >= 0 && c.cat_missing <= 1, "datagen: cat_missing not in [0,1]");
  DLREC_CHECK(c.num_multi_hot >= 0 && c.num_multi_hot <= c.num_cat,
              "datagen: num_multi_hot must be in [0, num_cat]");
  DLREC_CHECK(c.max_hotness >= 1 && c.max_hotness <= 64, "datagen: max_hotness not in [1, 64]");
  if (!c.hotness.empty()) {
    DLREC_CHECK(static_cast<int>(c.hotness.size()) == c.num_cat, "datagen: hotness has ",
                c.hotness.size(), " values for ", c.num_cat, " categorical columns");
    DLREC_CHECK(c.num_multi_hot == 0,
                "datagen: hotness and num_multi_hot both given (hotness sets every column's)");
    for (size_t i = 0; i < c.hotness.size(); ++i)
      DLREC_CHECK(c.hotness[i] >= 1 && c.hotness[i] <= kMaxFixedHotness, "datagen: hotness[", i,
                  "] = ", c.hotness[i], " is not in [1, ", kMaxFixedHotness, "]");
  }
  DLREC_CHECK(c.signal_strength >= 0 && c.signal_strength <= 100,
              "datagen: signal_strength not in [0, 100]");
  DLREC_CHECK(c.base_ctr > 0 && c.base_ctr < 1, "datagen: base_ctr must be in (0, 1)");
}

DatagenResult generate_to(const DatagenConfig& cfg,
                          const std::function<void(const char*, size_t)>& sink) {
  validate(cfg);
  Generator gen(cfg);
  DatagenResult res;
  const int64_t blocks = (cfg.rows + kBlockRows - 1) / kBlockRows;
  const int64_t group = std::max(4, 4 * num_threads());
  std::vector<std::vector<char>> bufs(static_cast<size_t>(std::min(group, std::max<int64_t>(blocks, 1))));
  std::vector<size_t> used(bufs.size());
  std::vector<int64_t> positives(bufs.size());
  const int64_t auc_rows = std::min(cfg.rows, kAucMaxRows);
  std::vector<uint64_t> scored(static_cast<size_t>(auc_rows));
  Progress progress("datagen", cfg.rows, "rows");
  int64_t total_pos = 0;
  for (int64_t g0 = 0; g0 < blocks; g0 += group) {
    const int64_t g1 = std::min(blocks, g0 + group);
    parallel_for(g0, g1, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        const int64_t r0 = b * kBlockRows, r1 = std::min(cfg.rows, r0 + kBlockRows);
        std::vector<char>& buf = bufs[b - g0];
        buf.resize(static_cast<size_t>(r1 - r0) * gen.max_line());
        Rng rng(mix64(cfg.seed ^ mix64(static_cast<uint64_t>(b) + 0x1234567ull)));
        char* p = buf.data();
        int64_t pos = 0;
        for (int64_t r = r0; r < r1; ++r) {
          double logit;
          int label;
          p = gen.row<true>(rng, p, logit, label);
          pos += label;
          if (r < auc_rows)
            scored[r] = (static_cast<uint64_t>(score_key(static_cast<float>(logit))) << 32) |
                        static_cast<uint64_t>(label);
        }
        used[b - g0] = static_cast<size_t>(p - buf.data());
        positives[b - g0] = pos;
      }
    });
    for (int64_t b = g0; b < g1; ++b) {
      sink(bufs[b - g0].data(), used[b - g0]);
      res.bytes += static_cast<int64_t>(used[b - g0]);
      total_pos += positives[b - g0];
    }
    progress.update(std::min(cfg.rows, g1 * kBlockRows));
  }
  res.rows = cfg.rows;
  res.positive_rate = cfg.rows > 0 ? static_cast<double>(total_pos) / cfg.rows : 0.0;
  res.signal_auc = exact_auc(scored);
  progress.finish("positive rate " + std::to_string(res.positive_rate) + ", signal AUC " +
                  std::to_string(res.signal_auc));
  return res;
}

}  // namespace

DatagenConfig DatagenConfig::from_json(const json& j) {
  ConfigReader r(j, "datagen");
  DatagenConfig c;
  c.rows = r.get_int_range("rows", c.rows, 0, int64_t{1} << 50);
  if (r.has("seed")) {
    const json& s = r.raw("seed");
    if (!s.is_number_unsigned() && !(s.is_number_integer() && s.get<int64_t>() >= 0))
      fail("config key '", r.key_path("seed"), "' must be a non-negative integer, got ", s.dump());
    c.seed = s.get<uint64_t>();
  }
  c.num_dense = static_cast<int>(r.get_int_range("num_dense", c.num_dense, 0, 1000));
  c.num_cat = static_cast<int>(r.get_int_range("num_cat", c.num_cat, 0, 1000));
  if (r.has("cardinalities")) {
    const json& a = r.raw("cardinalities");
    if (!a.is_array() || a.empty())
      fail("config key '", r.key_path("cardinalities"), "' must be a non-empty array of integers");
    c.cardinalities.clear();
    for (const auto& v : a) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t{1} << 32))
        fail("config key '", r.key_path("cardinalities"), "' holds ", v.dump(),
             "; cardinalities are integers in [1, 2^32]");
      c.cardinalities.push_back(v.get<int64_t>());
    }
  }
  c.zipf_s = r.get_range("zipf_s", c.zipf_s, 1e-3, 10);
  c.dense_missing = r.get_range("dense_missing", c.dense_missing, 0, 1);
  c.cat_missing = r.get_range("cat_missing", c.cat_missing, 0, 1);
  c.num_multi_hot = static_cast<int>(r.get_int_range("num_multi_hot", c.num_multi_hot, 0, c.num_cat));
  c.max_hotness = static_cast<int>(r.get_int_range("max_hotness", c.max_hotness, 1, 64));
  if (r.has("hotness")) {
    const json& a = r.raw("hotness");
    if (!a.is_array())
      fail("config key '", r.key_path("hotness"), "' must be an array of integers");
    for (const auto& v : a) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxFixedHotness)
        fail("config key '", r.key_path("hotness"), "' holds ", v.dump(),
             "; values per field are integers in [1, ", kMaxFixedHotness, "]");
      c.hotness.push_back(static_cast<int>(v.get<int64_t>()));
    }
  }
  c.signal_strength = r.get_range("signal_strength", c.signal_strength, 0, 100);
  c.base_ctr = r.get_range("base_ctr", c.base_ctr, 1e-4, 1 - 1e-4);
  r.finish();
  return c;
}

json DatagenConfig::to_json() const {
  json j;
  j["rows"] = rows;
  j["seed"] = seed;
  j["num_dense"] = num_dense;
  j["num_cat"] = num_cat;
  j["cardinalities"] = cardinalities;
  j["zipf_s"] = zipf_s;
  j["dense_missing"] = dense_missing;
  j["cat_missing"] = cat_missing;
  j["num_multi_hot"] = num_multi_hot;
  j["max_hotness"] = max_hotness;
  if (!hotness.empty()) j["hotness"] = hotness;
  j["signal_strength"] = signal_strength;
  j["base_ctr"] = base_ctr;
  return j;
}

Schema DatagenConfig::schema() const {
  Schema s = Schema::criteo(num_dense, num_cat);
  for (int c = 0; c < num_cat; ++c) s.columns[1 + num_dense + c].multi_hot = is_multi_hot(c);
  s.list_sep = ',';
  return s;
}

int64_t DatagenConfig::cardinality(int c) const {
  DLREC_CHECK(c >= 0 && c < num_cat, "datagen: no categorical column ", c);
  DLREC_CHECK(!cardinalities.empty(), "datagen: cardinalities is empty");
  return cardinalities[std::min<size_t>(static_cast<size_t>(c), cardinalities.size() - 1)];
}

bool DatagenConfig::is_multi_hot(int c) const {
  if (!hotness.empty())
    return c >= 0 && c < static_cast<int>(hotness.size()) && hotness[c] > 1;
  return c >= num_cat - num_multi_hot;
}

int DatagenConfig::fixed_hotness(int c) const {
  return is_multi_hot(c) && !hotness.empty() ? hotness[c] : 0;
}

DatagenConfig DatagenConfig::mlperf_dcnv2() {
  DatagenConfig c;
  c.num_dense = 13;
  c.num_cat = 26;
  c.cardinalities = mlperf_dcnv2_cardinalities();
  c.hotness = mlperf_dcnv2_hotness();
  c.cat_missing = 0;
  return c;
}

DatagenResult generate(const DatagenConfig& config, std::ostream& out) {
  DatagenResult r = generate_to(config, [&](const char* p, size_t n) {
    out.write(p, static_cast<std::streamsize>(n));
    if (!out) fail("datagen: write failed");
  });
  return r;
}

DatagenResult generate_file(const DatagenConfig& config, const std::string& path) {
  AtomicFile f(path);
  DatagenResult r = generate_to(config, [&](const char* p, size_t n) { f.write(p, n); });
  f.commit();
  return r;
}

}  // namespace dlrec::io
