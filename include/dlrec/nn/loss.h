// Training losses on the model's output: binary cross-entropy on logits (click labels) and mean
// squared error (regression targets). The config key "train.loss" picks one (docs/CONFIG.md).
#pragma once

#include <cstdint>
#include <string>

#include "dlrec/core/tensor.h"

namespace dlrec::nn {

// Mean over n samples of BCE(sigmoid(logits[i]), labels[i]), computed stably as
// max(z, 0) - z y + log1p(exp(-|z|)) and accumulated in double. Labels are in [0, 1]. When
// dlogits is not null it receives dL/dlogits = (sigmoid(z) - y) / n.
double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits);

// Tensor form: logits [n] (any shape with n elements) F32 CPU; labels n values; dlogits is
// resized to logits' shape when `dlogits` is not null.
double bce_with_logits(const Tensor& logits, const float* labels, Tensor* dlogits);

// Mean over n samples of (outputs[i] - labels[i])^2, accumulated in double; dout (when not null)
// receives dL/doutputs = 2 (outputs[i] - labels[i]) / n. The model's output is the prediction
// itself (no sigmoid).
double mse(const float* outputs, const float* labels, int64_t n, float* dout);

// "bce": the output is a logit, predictions are sigmoid(output), labels in [0, 1].
// "mse": the output is the prediction of a real-valued target.
enum class LossKind { Bce, Mse };
LossKind parse_loss(const std::string& name);  // "bce" | "mse"; anything else throws
const char* loss_name(LossKind k);
// The loss `k` of a batch and its gradient (the functions above).
double loss_and_grad(LossKind k, const float* outputs, const float* labels, int64_t n,
                     float* dout);

}  // namespace dlrec::nn
