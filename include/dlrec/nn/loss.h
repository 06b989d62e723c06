// Binary cross-entropy on logits.
#pragma once

#include <cstdint>

#include "dlrec/core/tensor.h"

namespace dlrec::nn {

// Mean over n samples of BCE(sigmoid(logits[i]), labels[i]), computed stably as
// max(z, 0) - z y + log1p(exp(-|z|)) and accumulated in double. Labels are in [0, 1]. When
// dlogits is not null it receives dL/dlogits = (sigmoid(z) - y) / n.
double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits);

// Tensor form: logits [n] (any shape with n elements) F32 CPU; labels n values; dlogits is
// resized to logits' shape when `dlogits` is not null.
double bce_with_logits(const Tensor& logits, const float* labels, Tensor* dlogits);

}  // namespace dlrec::nn
