// DCNv2 cross network (Wang et al., "DCN V2", 2020) on the CPU (F32).
//
// With x0 the input [B, F], layer l maps x_l to
//   x_{l+1} = x0 * (W_l x_l + b_l) + x_l                  (full rank: W_l [F, F])
//   x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l            (low rank r: V_l [r, F], U_l [F, r])
// where * is the element-wise product. The output is x_L [B, F].
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dlrec/nn/linear.h"

namespace dlrec::nn {

class CrossNet {
 public:
  // low_rank = 0: full-rank layers; otherwise the rank r of the projection (1 .. F).
  CrossNet(int64_t features, int64_t num_layers, int64_t low_rank);

  // Layer l draws from derive_seed(seed, l): W (or U and V) normal with std
  // sqrt(2 / (fan_in + fan_out)) (Xavier normal, as nn::Linear), biases zero.
  void init(uint64_t seed);
  // x0 [B, F] -> x_L [B, F] (a layer-owned buffer, valid until the next forward).
  const Tensor& forward(const Tensor& x0);
  // dL/dx_L [B, F] -> dL/dx0 [B, F]; writes the parameters' grads (overwritten).
  const Tensor& backward(const Tensor& dy);

  // Trainable parameters with names relative to the layer: "<l>.w.weight", "<l>.w.bias" and,
  // low rank, "<l>.v.weight" (V has no bias).
  std::vector<std::pair<std::string, Param*>> params();
  int64_t features() const { return f_; }
  int64_t num_layers() const { return static_cast<int64_t>(w_.size()); }
  int64_t low_rank() const { return r_; }

 private:
  int64_t f_, r_;
  // w_[l]: F -> F (full rank) or r -> F (U_l and b_l). v_[l]: F -> r, its bias held at zero and
  // never trained (nn::Linear always has one); empty when full rank.
  std::vector<Linear> w_, v_;
  Tensor x0_;
  std::vector<Tensor> xs_;  // x_1 .. x_L
  std::vector<Tensor> us_;  // u_l = W_l x_l + b_l (the Linear's output buffer)
  Tensor du_, g_, dx0_;
};

}  // namespace dlrec::nn
