// Factorization machine second-order term (Rendle 2010) over n fields of width d (F32, CPU):
//   y = 1/2 * sum_k [ (sum_i v_ik)^2 - sum_i v_ik^2 ] = sum_{i<j} <v_i, v_j>
// in O(n d) per sample. No parameters: the field vectors are the (embedding) inputs.
#pragma once

#include <cstdint>

#include "dlrec/nn/param.h"

namespace dlrec::nn {

class FactorizationMachine {
 public:
  FactorizationMachine(int64_t num_fields, int64_t dim);
  // v [B, n * d] (field i in columns i*d .. i*d + d) -> y [B, 1]. Keeps a reference to v.
  const Tensor& forward(const Tensor& v);
  // dy [B, 1] -> dv [B, n * d]: dv_ik = dy * (sum_j v_jk - v_ik).
  const Tensor& backward(const Tensor& dy);
  int64_t num_fields() const { return n_; }
  int64_t dim() const { return d_; }

 private:
  int64_t n_, d_;
  Tensor v_, y_, dv_;
};

}  // namespace dlrec::nn
