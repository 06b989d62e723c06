#include "dlrec/io/synthetic_batch.h"

#include <algorithm>
#include <cmath>

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

Batch random_batch(const ShardLayout& l, int64_t rows, bool zipf, uint64_t seed) {
  Batch b;
  b.reset(l.num_dense, static_cast<int>(l.cardinalities.size()));
  b.rows = rows;
  b.labels.resize(rows);
  b.dense.resize(rows * l.num_dense);
  const uint64_t s_label = splitmix64(seed * 3 + 1), s_dense = splitmix64(seed * 3 + 2);
  for (int64_t r = 0; r < rows; ++r) b.labels[r] = uniform_at(s_label, r) < 0.25 ? 1.f : 0.f;
  for (int64_t i = 0; i < rows * l.num_dense; ++i)
    b.dense[i] = static_cast<float>(std::log1p(std::exp(3.0 * uniform_at(s_dense, i))));
  const int64_t T = static_cast<int64_t>(l.cardinalities.size());
  parallel_for(0, T, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const uint64_t st = splitmix64(seed * 1000003 + 17 + t);
      const int64_t card = l.cardinalities[t];
      auto& off = b.cat_offsets[t];
      auto& ids = b.cat_indices[t];
      off.resize(rows + 1);
      ids.resize(rows);
      for (int64_t r = 0; r <= rows; ++r) off[r] = r;
      for (int64_t r = 0; r < rows; ++r) {
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
