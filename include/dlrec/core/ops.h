// Element-wise tensor ops with a CPU reference and a CUDA implementation. The device of the
// operands selects the implementation; mixing devices is an error.
#pragma once

#include "dlrec/core/tensor.h"

namespace dlrec::ops {

// y += alpha * x (F32, same shape, same device).
void axpy(float alpha, const Tensor& x, Tensor& y);
// Sum of all elements of an F32 tensor, accumulated in double.
double sum(const Tensor& x);

}  // namespace dlrec::ops
