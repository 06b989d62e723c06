// Internal: the per-value arithmetic of nn::Optimizer's Adam and SGD-with-momentum steps
// (nn/optimizer.cc, update_row), each operation rounded on its own as the CPU rounds it (no
// fused multiply-add), shared by the dense steps (dense_cuda.cu) and the fused table updates
// (embedding_backward_cuda.cu).
#pragma once

#include <cuda_runtime.h>

namespace dlrec::nn::opt_math {

// A row's step count after one more step (it stops growing at 2^24, as on the CPU).
__device__ __forceinline__ float next_count(float t) {
  return t < 16777216.f ? __fadd_rn(t, 1.f) : t;
}

// The coefficients of Adam's step number t: step = lr / (1 - b1^t), rc2 = 1 / sqrt(1 - b2^t),
// the powers in double, rounded to float.
struct AdamCoef {
  float t, step, rc2;
};
__device__ __forceinline__ AdamCoef adam_coef(float t_old, float lr, float b1, float b2) {
  AdamCoef c;
  c.t = next_count(t_old);
  const double t = static_cast<double>(c.t);
  const float c1 = __fsub_rn(1.f, static_cast<float>(pow(static_cast<double>(b1), t)));
  const float c2 = __fsub_rn(1.f, static_cast<float>(pow(static_cast<double>(b2), t)));
  c.step = __fdiv_rn(lr, c1);
  c.rc2 = __fdiv_rn(1.f, sqrtf(c2));
  return c;
}

// One value of Adam: m = b1 m + (1 - b1) x, v = b2 v + (1 - b2) x x (in place), and the new
// weight w - step m / (sqrt(v) rc2 + eps).
__device__ __forceinline__ float adam_value(float x, float w, float& m, float& v,
                                            const AdamCoef& c, float b1, float b2, float eps) {
  m = __fadd_rn(__fmul_rn(b1, m), __fmul_rn(__fsub_rn(1.f, b1), x));
  v = __fadd_rn(__fmul_rn(b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.f, b2), x), x));
  return __fsub_rn(w, __fdiv_rn(__fmul_rn(c.step, m), __fadd_rn(__fmul_rn(sqrtf(v), c.rc2), eps)));
}

// One value of SGD with momentum: b = mu b + x (in place), the new weight w - lr b, or with
// Nesterov w - lr (x + mu b).
__device__ __forceinline__ float momentum_value(float x, float w, float& b, float mu,
                                                bool nesterov, float lr) {
  b = __fadd_rn(__fmul_rn(mu, b), x);
  const float u = nesterov ? __fadd_rn(x, __fmul_rn(mu, b)) : b;
  return __fsub_rn(w, __fmul_rn(lr, u));
}

}  // namespace dlrec::nn::opt_math
