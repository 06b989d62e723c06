// Element-wise ReLU (F32, CPU). Linear fuses its own activation; this layer is for other uses.
#pragma once

#include "dlrec/nn/param.h"

namespace dlrec::nn {

class ReLU {
 public:
  // y = max(x, 0), any shape; the returned buffer is valid until the next forward().
  const Tensor& forward(const Tensor& x);
  // dx = dy where y > 0, else 0.
  const Tensor& backward(const Tensor& dy);

 private:
  Tensor y_, dx_;
};

}  // namespace dlrec::nn
