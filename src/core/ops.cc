#include "dlrec/core/ops.h"

namespace dlrec::ops {

#ifdef DLREC_WITH_CUDA
namespace cuda_impl {
void axpy(float alpha, const float* x, float* y, int64_t n);
double sum(const float* x, int64_t n);
}  // namespace cuda_impl
#endif

namespace {
void check_same(const Tensor& a, const Tensor& b, const char* op) {
  DLREC_CHECK(a.device() == b.device(), op, ": operands on ", a.device().str(), " and ",
              b.device().str());
  DLREC_CHECK(a.shape() == b.shape(), op, ": shapes ", shape_str(a.shape()), " and ",
              shape_str(b.shape()));
}
#ifndef DLREC_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) {
  fail(op, ": CUDA tensor but this dlrec was built without CUDA");
}
#endif
}  // namespace

void axpy(float alpha, const Tensor& x, Tensor& y) {
  check_same(x, y, "axpy");
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  if (x.device().is_cuda()) {
#ifdef DLREC_WITH_CUDA
    cuda_impl::axpy(alpha, xp, yp, x.numel());
    return;
#else
    no_cuda("axpy");
#endif
  }
  for (int64_t i = 0, n = x.numel(); i < n; ++i) yp[i] += alpha * xp[i];
}

double sum(const Tensor& x) {
  const float* xp = x.data<float>();
  if (x.device().is_cuda()) {
#ifdef DLREC_WITH_CUDA
    return cuda_impl::sum(xp, x.numel());
#else
    no_cuda("sum");
#endif
  }
  double s = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += xp[i];
  return s;
}

}  // namespace dlrec::ops
