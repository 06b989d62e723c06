// MLP: a stack of Linear layers with ReLU between them.
#pragma once

#include <cstdint>
#include <vector>

#include "dlrec/nn/linear.h"

namespace dlrec::nn {

class MLP {
 public:
  // Layers in -> sizes[0] -> ... -> sizes.back(); ReLU after every layer but the last, and after
  // the last too when relu_last (DLRM's bottom MLP; the top MLP ends in logits). `sizes` may be
  // empty: the MLP is then the identity.
  MLP(int64_t in_features, const std::vector<int64_t>& sizes, bool relu_last);

  // Layer k gets the stream derive_seed(seed, k).
  void init(uint64_t seed);
  const Tensor& forward(const Tensor& x);                          // [B, in] -> [B, out]
  const Tensor& backward(const Tensor& dy, bool need_dx = true);   // [B, out] -> [B, in]

  std::vector<Linear>& layers() { return layers_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return layers_.empty() ? in_ : layers_.back().out_features(); }

 private:
  int64_t in_;
  std::vector<Linear> layers_;
};

}  // namespace dlrec::nn
