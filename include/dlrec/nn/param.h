// Param: one trainable tensor with its gradient and optimizer state, and buffer helpers.
#pragma once

#include <memory>

#include "dlrec/core/tensor.h"

namespace dlrec::nn {

class LinearHook;  // linear.h

struct Param {
  Tensor value;  // F32 on the CPU; layers hand out views that share this storage
  Tensor grad;   // dense gradient, same shape (undefined for embedding tables: sparse gradients)
  Tensor state;  // optimizer state, same shape (undefined for SGD; Adagrad accumulator)
  // Pruning mask (docs/COMPRESSION.md): F32 0/1 of the value's shape, or undefined (dense). A
  // dense Optimizer::step zeroes every value whose mask is 0 after its update, so a pruned
  // weight stays zero while training.
  Tensor mask;
  // Quantization record of a Linear's weight (docs/COMPRESSION.md, set by src/compress): when
  // defined, Linear::forward hands its input to it (INT8 inference, calibration observers).
  std::shared_ptr<LinearHook> quant;
};

// Makes `t` an F32 CPU tensor of `shape`, reallocating only when the shape changed: layers keep
// their activation buffers across steps so that a training step allocates nothing.
inline void ensure_buffer(Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() != shape || t.dtype() != DType::F32 || t.device().is_cuda())
    t = Tensor::empty(shape, DType::F32, Device::cpu());
}

// Throws unless `t` is a 2-d F32 CPU tensor with `cols` columns; returns the row count.
int64_t check_matrix(const Tensor& t, int64_t cols, const char* what);

}  // namespace dlrec::nn
