#include "dlrec/io/synthetic_batch.h"

#include <algorithm>
#include <cmath>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::io {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) from (stream, index): any element can be drawn independently.
double uniform_at(uint64_t stream, uint64_t i) {
  return static_cast<double>(splitmix64(stream ^ splitmix64(i)) >> 11) * 0x1.0p-53;
}
}  // namespace

const std::vector<int64_t>& criteo_kaggle_cardinalities() {
  static const std::vector<int64_t> c = {
      1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
      27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};
  return c;
}

const std::vector<int64_t>& criteo_1tb_cardinalities() {
  static const std::vector<int64_t> c = {
      39884406, 39043,    17289,    7420,     20263,  3,     7120, 1543, 63,
      38532951, 2953546,  403346,   10,       2208,   11938, 155,  4,    976,
      14,       39979771, 25641295, 39664984, 585935, 12972, 108,  36};
  return c;
}

const std::vector<int64_t>& mlperf_dcnv2_cardinalities() {
  static const std::vector<int64_t> c = {
      40000000, 39060,    17295,    7424,     20265,  3,     7122, 1543, 63,
      40000000, 3067956,  405282,   10,       2209,   11938, 155,  4,    976,
      14,       40000000, 40000000, 40000000, 590152, 12973, 108,  36};
  return c;
}

const std::vector<int>& mlperf_dcnv2_hotness() {
  static const std::vector<int> h = {3,  2, 1, 2, 6, 1, 1, 1, 1, 7,  3, 8, 1,
                                     6,  9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
  return h;
}

ShardLayout builtin_layout(const std::string& name, int64_t max_rows, std::vector<int>& hotness) {
  const std::vector<int64_t>* cards = nullptr;
  if (name == "kaggle") cards = &criteo_kaggle_cardinalities();
  else if (name == "criteo_1tb") cards = &criteo_1tb_cardinalities();
  else if (name == "mlperf_dcnv2") cards = &mlperf_dcnv2_cardinalities();
  else fail("unknown built-in tables '", name, "' (kaggle, criteo_1tb or mlperf_dcnv2)");
  hotness.clear();
  if (name == "mlperf_dcnv2") hotness = mlperf_dcnv2_hotness();
  ShardLayout layout;
  layout.num_dense = 13;
  for (size_t t = 0; t < cards->size(); ++t) {
    const int64_t c = (*cards)[t];
    layout.cardinalities.push_back(max_rows > 0 ? std::min(c, max_rows) : c);
    layout.multi_hot.push_back(!hotness.empty() && hotness[t] > 1);
  }
  return layout;
}

Batch random_batch(const ShardLayout& l, int64_t rows, bool zipf, uint64_t seed,
                   const std::vector<int>& hotness) {
  const int64_t T = static_cast<int64_t>(l.cardinalities.size());
  DLREC_CHECK(hotness.empty() || static_cast<int64_t>(hotness.size()) == T, "random_batch: ",
              hotness.size(), " hotness values for ", T, " categorical features");
  for (int64_t t = 0; t < static_cast<int64_t>(hotness.size()); ++t) {
    const bool multi_hot = t < static_cast<int64_t>(l.multi_hot.size()) && l.multi_hot[t];
    DLREC_CHECK(hotness[t] >= 1 && (hotness[t] == 1 || multi_hot), "random_batch: feature ", t,
                " has hotness ", hotness[t],
                " (must be >= 1, and above 1 only for a multi-hot feature)");
  }
  Batch b;
  b.reset(l.num_dense, static_cast<int>(l.cardinalities.size()));
  b.rows = rows;
  b.labels.resize(rows);
  b.dense.resize(rows * l.num_dense);
  const uint64_t s_label = splitmix64(seed * 3 + 1), s_dense = splitmix64(seed * 3 + 2);
  for (int64_t r = 0; r < rows; ++r) b.labels[r] = uniform_at(s_label, r) < 0.25 ? 1.f : 0.f;
  for (int64_t i = 0; i < rows * l.num_dense; ++i)
    b.dense[i] = static_cast<float>(std::log1p(std::exp(3.0 * uniform_at(s_dense, i))));
  parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const uint64_t st = splitmix64(seed * 1000003 + 17 + t);
      const int64_t card = l.cardinalities[t];
      auto& off = b.cat_offsets[t];
      auto& ids = b.cat_indices[t];
      const int64_t hot = hotness.empty() ? 1 : hotness[t];
      off.resize(rows + 1);
      ids.resize(rows * hot);
      for (int64_t r = 0; r <= rows; ++r) off[r] = r * hot;
      for (int64_t r = 0; r < rows * hot; ++r) {
        const double u = uniform_at(st, r);
        const int64_t id = zipf ? static_cast<int64_t>(std::exp(u * std::log(card + 1.0))) - 1
                                : static_cast<int64_t>(u * static_cast<double>(card));
        ids[r] = std::clamp<int64_t>(id, 0, card - 1);
      }
    }
  });
  return b;
}

}  // namespace dlrec::io
