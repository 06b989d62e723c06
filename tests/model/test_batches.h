// Helpers shared by the model tests: layouts and random batches with duplicate ids and
// multi-hot bags.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/io/batch.h"
#include "dlrec/io/shard.h"
#include "dlrec/nn/rng.h"

namespace dlrec::model::testing {

// |a - b| relative to |b| (1e-12 floor): the parity tests' measure.
inline double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

// max |a - ref| / max |ref| over two tensors' elements (1e-12 floor), read as f32 on the host; the
// parity tests' measure of how far two parameter tensors are apart. Sizes must match.
inline double tensor_rel_diff(const Tensor& a, const Tensor& ref) {
  const auto x = a.to_vector<float>(), y = ref.to_vector<float>();
  double scale = 1e-12, d = 0;
  for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
    scale = std::max(scale, std::fabs(double(y[k])));
    d = std::max(d, std::fabs(double(x[k]) - double(y[k])));
  }
  return d / scale;
}

inline io::ShardLayout make_layout(int num_dense, std::vector<int64_t> cards) {
  io::ShardLayout l;
  l.num_dense = num_dense;
  l.multi_hot.assign(cards.size(), false);
  l.cardinalities = std::move(cards);
  return l;
}

// Random batch; with multi_hot, bags of 0..3 ids (duplicates allowed) for every other feature.
// Small tables make duplicate ids within a batch the rule.
inline io::Batch make_batch(const io::ShardLayout& l, int64_t rows, uint64_t seed, bool multi_hot,
                            double positive_rate = 0.5) {
  nn::Rng rng(seed);
  io::Batch b;
  b.rows = rows;
  b.num_dense = l.num_dense;
  const int T = static_cast<int>(l.cardinalities.size());
  b.cat_offsets.assign(T, {});
  b.cat_indices.assign(T, {});
  for (int64_t r = 0; r < rows; ++r) {
    b.labels.push_back(rng.uniform() < positive_rate ? 1.f : 0.f);
    for (int i = 0; i < l.num_dense; ++i) b.dense.push_back(static_cast<float>(rng.uniform(-1, 1)));
  }
  for (int t = 0; t < T; ++t) {
    auto& off = b.cat_offsets[t];
    auto& idx = b.cat_indices[t];
    for (int64_t r = 0; r < rows; ++r) {
      off.push_back(static_cast<int64_t>(idx.size()));
      const int64_t len = (multi_hot && t % 2 == 1) ? rng.below(4) : 1;
      for (int64_t j = 0; j < len; ++j) idx.push_back(rng.below(l.cardinalities[t]));
    }
    off.push_back(static_cast<int64_t>(idx.size()));
  }
  return b;
}

}  // namespace dlrec::model::testing
