#include "dlrec/nn/relu.h"

#include <algorithm>

#include "dlrec/core/thread_pool.h"

namespace dlrec::nn {

const Tensor& ReLU::forward(const Tensor& x) {
  DLREC_CHECK(x.dtype() == DType::F32 && !x.device().is_cuda(), "ReLU: expected an f32 CPU tensor");
  ensure_buffer(y_, x.shape());
  const float* xs = x.data<float>();
  float* y = y_.data<float>();
  parallel_for(0, x.numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = std::max(xs[i], 0.f);
  });
  return y_;
}

const Tensor& ReLU::backward(const Tensor& dy) {
  DLREC_CHECK(y_.defined() && dy.shape() == y_.shape() && dy.dtype() == DType::F32,
              "ReLU::backward: dy ", shape_str(dy.shape()), " does not match the forward");
  ensure_buffer(dx_, dy.shape());
  const float* g = dy.data<float>();
  const float* y = y_.data<float>();
  float* dx = dx_.data<float>();
  parallel_for(0, dy.numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dx[i] = y[i] > 0.f ? g[i] : 0.f;
  });
  return dx_;
}

}  // namespace dlrec::nn
