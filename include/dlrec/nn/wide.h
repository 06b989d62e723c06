// The wide (linear) part of Wide & Deep over categorical features (F32, CPU):
//   y = b + sum_t pool_t(w_t[ids of feature t])
// one 1-wide embedding table w_t per feature (a weight per id) and one bias b. Crossed features
// are categorical columns made by ETL (HashedCross), so they enter like any other feature.
#pragma once

#include <cstdint>
#include <vector>

#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/param.h"

namespace dlrec::nn {

// One feature's bags for a batch: sample r's ids are indices[offsets[r] .. offsets[r + 1]).
struct Bags {
  const int64_t* offsets;
  const int64_t* indices;
};

class WideLinear {
 public:
  // One table per feature with cardinalities[t] rows. Weights and bias start at zero (a linear
  // model needs no symmetry breaking).
  WideLinear(const std::vector<int64_t>& cardinalities, Pooling pooling);

  // bags[t] for every feature -> y [B, 1] (a layer-owned buffer). With training = true the ids
  // are kept for backward().
  const Tensor& forward(const std::vector<Bags>& bags, int64_t batch_rows, bool training);
  // dy [B, 1] -> bias().grad and each table's sparse gradient (grad(t), valid until the next
  // backward()).
  void backward(const Tensor& dy);
  const SparseGrad& grad(int64_t t) const { return *grads_[t]; }

  std::vector<EmbeddingBag>& tables() { return tables_; }
  Param& bias() { return b_; }

 private:
  std::vector<EmbeddingBag> tables_;
  Param b_;
  Tensor parts_, y_;  // parts_ [B, T]: pooled weight of each feature
  std::vector<const SparseGrad*> grads_;
};

}  // namespace dlrec::nn
