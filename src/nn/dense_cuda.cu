// CUDA kernels for the dense layers of the DLRM; see dense_cuda.h. Element-wise passes (16-bit
// copies, bias + activation, ReLU masks with bias gradients), BCE, sigmoid, loss scaling and
// the dense optimizer step; the interaction layer is in interaction_cuda.cu, the small-batch
// inference layer in skinny_linear_cuda.cu.
#include "nn/dense_cuda.h"

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "core/cuda_check.h"
#include "nn/half_cuda.cuh"
#include "nn/optimizer_math_cuda.cuh"

namespace dlrec::nn::cuda_dense {
namespace {

using half_cuda::grid_for;

using half_cuda::from_f;
using half_cuda::to_f;
using half_cuda::unpack8;

template <class H>
__global__ void to_half_kernel(const float* __restrict__ x, int64_t B, int64_t cols,
                               H* __restrict__ y, int64_t ld) {
  const int64_t n = B * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ld, c = i - r * ld;
    y[i] = from_f<H>(c < cols ? x[r * cols + c] : 0.f);
  }
}

template <class E>
__global__ void bias_act_kernel(E* __restrict__ y, const E* __restrict__ b, int64_t n,
                                int64_t out, bool relu) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f(y[i]) + to_f(b[i % out]);
    y[i] = from_f<E>(relu ? fmaxf(v, 0.f) : v);
  }
}

// float4 version for out % 4 == 0 and fewer than 2^31 vectors (32-bit index arithmetic).
__global__ void bias_act4_kernel(float4* __restrict__ y, const float4* __restrict__ b, int n4,
                                 int out4, bool relu) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    float4 v = y[i];
    const float4 c = b[i % out4];
    v.x += c.x; v.y += c.y; v.z += c.z; v.w += c.w;
    if (relu) {
      v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    }
    y[i] = v;
  }
}

// dz = dy masked (Mask::Y: y > 0; Mask::Bits: the ReLU bit of a cuBLASLt RELU_AUX epilogue, see
// relu_bit) and, per chunk of kBgradRows rows, the column sums of dz (Mask::None: of dy, no dz).
// block (32, 8) covers 32 columns of one chunk; thread (x, k) sums rows r0 + k, r0 + k + 8, ... in
// that order, then the 8 sums are added in k order: the order that mask_bgrad8_kernel keeps too.
constexpr int kBgradRows = 256;
enum class Mask { None, Y, Bits };

// The bit of row r, column c of a column-major bit matrix (cuBLASLt's ReLU mask of a [out, B]
// column-major output: one sample per column), `ld_bytes` = its leading dimension in bits / 8:
// bit c % 8 (least significant first) of byte r * ld_bytes + c / 8.
__device__ __forceinline__ bool relu_bit(const uint8_t* __restrict__ bits, int64_t ld_bytes,
                                         int64_t r, int c) {
  return (bits[r * ld_bytes + (c >> 3)] >> (c & 7)) & 1;
}

template <class E, Mask M>
__global__ void mask_bgrad_kernel(const E* __restrict__ dy, const E* __restrict__ y,
                                  const uint8_t* __restrict__ bits, int64_t bits_ld,
                                  E* __restrict__ dz, float* __restrict__ partial, int64_t B,
                                  int out) {
  __shared__ float red[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kBgradRows;
  const int64_t r1 = min(B, r0 + kBgradRows);
  float acc = 0.f;
  if (col < out) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * out + col;
      float v = to_f(dy[i]);
      if constexpr (M != Mask::None) {
        const bool on = M == Mask::Y ? to_f(y[i]) > 0.f : relu_bit(bits, bits_ld, r, col);
        v = on ? v : 0.f;
        dz[i] = from_f<E>(v);
      }
      acc += v;
    }
  }
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    float s = red[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) s += red[k][threadIdx.x];
    partial[int64_t(blockIdx.y) * out + col] = s;
  }
}

// 16-bit E, out % 8 == 0, 16-byte aligned rows: the same pass with 8 adjacent columns per thread
// (16-byte loads and stores of dy, y and dz; one mask byte). Block (GX, 8) covers 8 * GX columns
// of one chunk; thread (x, k) sums the same rows in the same order as mask_bgrad_kernel, and the
// 8 row sums of a column are added in k order, so the partials are bit-identical to it. Rows are
// loaded 4 at a time (4 loads in flight per thread).
template <class E, Mask M>
__global__ void __launch_bounds__(256)
    mask_bgrad8_kernel(const E* __restrict__ dy, const E* __restrict__ y,
                       const uint8_t* __restrict__ bits, int64_t bits_ld,
                       E* __restrict__ dz, float* __restrict__ partial, int64_t B, int out) {
  __shared__ float red[8][8][33];  // [k][column within the group][x]
  const int g = blockIdx.x * blockDim.x + threadIdx.x;  // group of 8 columns
  const int col = g * 8;
  const int64_t r0 = int64_t(blockIdx.y) * kBgradRows;
  const int64_t r1 = min(B, r0 + kBgradRows);
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  if (col < out) {
    const int64_t ld8 = out / 8;  // row stride in 16-byte vectors
    const uint4* dy8 = reinterpret_cast<const uint4*>(dy) + g;
    const uint4* y8 = reinterpret_cast<const uint4*>(y) + g;
    uint4* dz8 = reinterpret_cast<uint4*>(dz) + g;
    auto one = [&](int64_t r, const uint4& d, const uint4& yv, uint8_t m) {
      float v[8];
      unpack8(d, v, static_cast<const E*>(nullptr));
      if constexpr (M != Mask::None) {
        float yf[8];
        if constexpr (M == Mask::Y) unpack8(yv, yf, static_cast<const E*>(nullptr));
        union {
          uint4 u;
          E e[8];
        } o;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const bool on = M == Mask::Y ? yf[j] > 0.f : ((m >> j) & 1);
          v[j] = on ? v[j] : 0.f;
          o.e[j] = from_f<E>(v[j]);
        }
        dz8[r * ld8] = o.u;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += v[j];
    };
    int64_t r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {  // 4 rows r, r + 8, r + 16, r + 24
      uint4 d[4], yv[4];
      uint8_t m[4] = {0, 0, 0, 0};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t rq = r + 8 * q;
        d[q] = dy8[rq * ld8];
        if constexpr (M == Mask::Y) yv[q] = y8[rq * ld8];
        if constexpr (M == Mask::Bits) m[q] = bits[rq * bits_ld + g];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) one(r + 8 * q, d[q], yv[q], m[q]);
    }
    for (; r < r1; r += 8) {
      const uint4 d = dy8[r * ld8];
      uint4 yv{};
      uint8_t m = 0;
      if constexpr (M == Mask::Y) yv = y8[r * ld8];
      if constexpr (M == Mask::Bits) m = bits[r * bits_ld + g];
      one(r, d, yv, m);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[threadIdx.y][j][threadIdx.x] = acc[j];
  __syncthreads();
  // Thread (x, k) finishes column 8 * g + k of its group.
  if (col < out) {
    const int j = threadIdx.y;
    float s = red[0][j][threadIdx.x];
    for (int k = 1; k < 8; ++k) s += red[k][j][threadIdx.x];
    partial[int64_t(blockIdx.y) * out + col + j] = s;
  }
}

__global__ void sum_partials_kernel(const float* __restrict__ partial, int chunks, int out,
                                    float* __restrict__ db) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= out) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partial[int64_t(c) * out + col];
  db[col] = s;
}

template <class E>
__global__ void relu_mask_kernel(const E* __restrict__ dy, const E* __restrict__ y,
                                 E* __restrict__ dz, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dz[i] = to_f(y[i]) > 0.f ? dy[i] : from_f<E>(0.f);
}

__global__ void sigmoid_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = 1.f / (1.f + expf(-x[i]));
}

constexpr int kBceThreads = 1024;

// One block: deterministic (fixed tree) reduction of the loss in double. BCE on logits, or with
// `mse` the mean squared error of the outputs (train.loss "mse"; nn::mse is the reference).
template <class H>
__global__ void bce_kernel(const float* __restrict__ logits, const float* __restrict__ labels,
                           int64_t n, float* __restrict__ dlogits, double* loss,
                           H* __restrict__ dlogits_h, const float* __restrict__ scale_p, bool mse,
                           int64_t denom) {
  __shared__ double part[kBceThreads];
  const double inv_n = 1.0 / static_cast<double>(denom);
  const float scale = scale_p ? *scale_p : 1.f;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double z = logits[i], y = labels[i];
    float g;
    if (mse) {
      s += (z - y) * (z - y);
      g = static_cast<float>(2.0 * (z - y) * inv_n);
    } else {
      s += fmax(z, 0.0) - z * y + log1p(exp(-fabs(z)));
      const double p = z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
      g = static_cast<float>((p - y) * inv_n);
    }
    dlogits[i] = g;
    if (dlogits_h) dlogits_h[i] = from_f<H>(scale_p ? g * scale : g);
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] * inv_n;
}

// The dense optimizer steps: one thread per value of a [rows, cols] parameter, gradient rows
// ldg apart, optional 16-bit copy wh with rows ldh apart. x = the gradient (times *gscale_p
// with loss scaling; nothing is done when it is 0), the new value op(i, r, c, x, w, lr) (which
// updates the value's optimizer state), 0 where the mask is 0 (a pruned weight stays zero).
template <class H, class Op>
__global__ void dense_step_kernel(float* __restrict__ w, const float* __restrict__ g,
                                  int64_t rows, int64_t cols, int64_t ldg, H* __restrict__ wh,
                                  int64_t ldh, const float* __restrict__ lr_p,
                                  const float* __restrict__ gscale_p,
                                  const float* __restrict__ mask, Op op) {
  const float lr = *lr_p;
  const float gs = gscale_p ? *gscale_p : 1.f;
  if (gs == 0.f) return;
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float x = gscale_p ? __fmul_rn(g[r * ldg + c], gs) : g[r * ldg + c];
    float wi = op(i, r, c, x, w[i], lr);
    if (mask && mask[i] == 0.f) wi = 0.f;
    w[i] = wi;
    if (wh) wh[r * ldh + c] = from_f<H>(wi);
  }
}

// SGD without state (a null), Adagrad with its accumulator a.
struct SgdAdagradOp {
  float* __restrict__ a;
  float eps;
  __device__ float operator()(int64_t i, int64_t, int64_t, float x, float w, float lr) const {
    if (!a) return __fsub_rn(w, __fmul_rn(lr, x));
    const float acc = __fadd_rn(a[i], __fmul_rn(x, x));
    a[i] = acc;
    return __fsub_rn(w, __fdiv_rn(__fmul_rn(lr, x), __fadd_rn(sqrtf(acc), eps)));
  }
};

// SGD with momentum: velocity b.
struct MomentumOp {
  float* __restrict__ b;
  float mu;
  bool nesterov;
  __device__ float operator()(int64_t i, int64_t, int64_t, float x, float w, float lr) const {
    float v = b[i];
    w = opt_math::momentum_value(x, w, v, mu, nesterov, lr);
    b[i] = v;
    return w;
  }
};

// Adam: every thread of a row computes the row's new t and its coefficients from the old t,
// which adam_count_kernel stores after (a kernel boundary: no thread reads the new t).
struct AdamOp {
  float* __restrict__ s;  // [rows, 2 * cols + 1]
  int64_t cols;
  AdamParams p;
  __device__ float operator()(int64_t, int64_t r, int64_t c, float x, float w, float lr) const {
    float* srow = s + r * (2 * cols + 1);
    const opt_math::AdamCoef co = opt_math::adam_coef(srow[2 * cols], lr, p.beta1, p.beta2);
    if (p.weight_decay > 0.f) w = __fsub_rn(w, __fmul_rn(__fmul_rn(lr, p.weight_decay), w));
    float m = srow[c], v = srow[cols + c];
    w = opt_math::adam_value(x, w, m, v, co, p.beta1, p.beta2, p.eps);
    srow[c] = m;
    srow[cols + c] = v;
    return w;
  }
};

__global__ void adam_count_kernel(float* __restrict__ s, int64_t rows, int64_t cols,
                                  const float* __restrict__ gscale_p) {
  if (gscale_p && *gscale_p == 0.f) return;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    float& t = s[r * (2 * cols + 1) + 2 * cols];
    t = opt_math::next_count(t);
  }
}

__global__ void scale_to_f16_kernel(const float* __restrict__ x, int64_t n,
                                    const float* __restrict__ scale, f16* __restrict__ y) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2half_rn(x[i] * s);
}

// blockIdx.y: the tensor; grid-stride over its elements.
__global__ void check_finite_kernel(const float* const* __restrict__ ptrs,
                                    const int64_t* __restrict__ counts, int* overflow) {
  const float* p = ptrs[blockIdx.y];
  const int64_t n = counts[blockIdx.y];
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(p[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *overflow = 1;
}

__global__ void check_finite1_kernel(const float* __restrict__ p, int64_t n, int* overflow) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(p[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *overflow = 1;
}

__global__ void check_finite_f16_kernel(const f16* __restrict__ p, int64_t n, int* overflow) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(__half2float(p[i]));
  if (__syncthreads_or(bad) && threadIdx.x == 0) *overflow = 1;
}

__global__ void scale_inplace_kernel(float* __restrict__ x, int64_t n,
                                     const float* __restrict__ scale) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void loss_scale_update_kernel(LossScale ls, int growth_interval) {
  const float s = *ls.scale;
  if (*ls.overflow) {
    *ls.gscale = 0.f;
    *ls.scale = fmaxf(s * 0.5f, 1.f);
    *ls.good_steps = 0;
    *ls.skipped += 1;
  } else {
    *ls.gscale = 1.f / s;
    if (++*ls.good_steps >= growth_interval) {
      *ls.scale = fminf(s * 2.f, 16777216.f);
      *ls.good_steps = 0;
    }
  }
  *ls.overflow = 0;
}

}  // namespace

template <class H>
void launch_to_half(const float* x, int64_t B, int64_t cols, H* y, int64_t ld,
                    cudaStream_t stream) {
  const int64_t n = B * ld;
  if (n == 0) return;
  to_half_kernel<H><<<grid_for(n, 256), 256, 0, stream>>>(x, B, cols, y, ld);
  DLREC_CUDA_LAUNCH_CHECK();
}
void to_half_padded(const float* x, int64_t B, int64_t cols, bf16* y, int64_t ld,
                    cudaStream_t stream) {
  launch_to_half(x, B, cols, y, ld, stream);
}
void to_half_padded(const float* x, int64_t B, int64_t cols, f16* y, int64_t ld,
                    cudaStream_t stream) {
  launch_to_half(x, B, cols, y, ld, stream);
}

template <class H>
void bias_act_half(H* y, const H* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  const int64_t n = B * out;
  if (n == 0) return;
  bias_act_kernel<H><<<grid_for(n, 256), 256, 0, stream>>>(y, b, n, out, relu);
  DLREC_CUDA_LAUNCH_CHECK();
}
void bias_act(bf16* y, const bf16* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  bias_act_half(y, b, B, out, relu, stream);
}
void bias_act(f16* y, const f16* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  bias_act_half(y, b, B, out, relu, stream);
}

void bias_act(float* y, const float* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  const int64_t n = B * out;
  if (n == 0) return;
  if (out % 4 == 0 && n / 4 < (int64_t{1} << 31)) {
    const int n4 = static_cast<int>(n / 4);
    bias_act4_kernel<<<grid_for(n4, 256), 256, 0, stream>>>(
        reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(b), n4,
        static_cast<int>(out / 4), relu);
  } else {
    bias_act_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(y, b, n, out, relu);
  }
  DLREC_CUDA_LAUNCH_CHECK();
}

int64_t bias_grad_chunks(int64_t B) { return (B + kBgradRows - 1) / kBgradRows; }

template <class E, Mask M>
void launch_mask_bgrad(const E* dy, const E* y, const uint8_t* bits, int64_t bits_ld, E* dz,
                       float* partial, int64_t B, int64_t out, int64_t chunks,
                       cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = sizeof(E) == 2 && out % 8 == 0 && aligned(dy) &&
                   (M != Mask::Y || aligned(y)) && (M == Mask::None || aligned(dz));
  if constexpr (sizeof(E) == 2) {
    if (vec) {
      const int64_t groups = out / 8;
      const int gx = static_cast<int>(std::min<int64_t>(32, groups));
      dim3 grid(static_cast<unsigned>((groups + gx - 1) / gx), static_cast<unsigned>(chunks));
      mask_bgrad8_kernel<E, M><<<grid, dim3(gx, 8), 0, stream>>>(dy, y, bits, bits_ld, dz,
                                                                   partial, B,
                                                                   static_cast<int>(out));
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  dim3 grid(static_cast<unsigned>((out + 31) / 32), static_cast<unsigned>(chunks));
  mask_bgrad_kernel<E, M><<<grid, dim3(32, 8), 0, stream>>>(dy, y, bits, bits_ld, dz, partial,
                                                            B, static_cast<int>(out));
  DLREC_CUDA_LAUNCH_CHECK();
}

// y given: Mask::Y; else bits given: Mask::Bits (bits_ld in bits); else no mask.
template <class E>
void mask_bias_grad_impl(const E* dy, const E* y, const uint8_t* bits, int64_t bits_ld, E* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream) {
  if (out == 0) return;
  const int64_t chunks = bias_grad_chunks(B);
  if (chunks == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * out, stream));
    return;
  }
  DLREC_CHECK(chunks < 65536, "mask_bias_grad: batch of ", B, " rows is too large");
  if (y)
    launch_mask_bgrad<E, Mask::Y>(dy, y, nullptr, 0, dz, partial, B, out, chunks, stream);
  else if (bits)
    launch_mask_bgrad<E, Mask::Bits>(dy, nullptr, bits, bits_ld / 8, dz, partial, B, out, chunks,
                                     stream);
  else
    launch_mask_bgrad<E, Mask::None>(dy, nullptr, nullptr, 0, dz, partial, B, out, chunks,
                                     stream);
  sum_partials_kernel<<<static_cast<unsigned>((out + 127) / 128), 128, 0, stream>>>(
      partial, static_cast<int>(chunks), static_cast<int>(out), db);
  DLREC_CUDA_LAUNCH_CHECK();
}

void mask_bias_grad(const float* dy, const float* y, float* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_impl(dy, y, nullptr, 0, dz, partial, db, B, out, stream);
}
void mask_bias_grad(const bf16* dy, const bf16* y, bf16* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_impl(dy, y, nullptr, 0, dz, partial, db, B, out, stream);
}
void mask_bias_grad(const f16* dy, const f16* y, f16* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_impl(dy, y, nullptr, 0, dz, partial, db, B, out, stream);
}

static std::atomic<int64_t> g_mask_bits_launches{0};

template <class E>
void mask_bias_grad_bits_impl(const E* dy, const uint8_t* bits, int64_t bits_ld, E* dz,
                              float* partial, float* db, int64_t B, int64_t out,
                              cudaStream_t stream) {
  DLREC_CHECK(bits != nullptr && bits_ld >= out && bits_ld % 128 == 0,
              "mask_bias_grad_bits: the mask's leading dimension (", bits_ld,
              " bits) must be a multiple of 128 and at least the width ", out);
  mask_bias_grad_impl(dy, static_cast<const E*>(nullptr), bits, bits_ld, dz, partial, db, B, out,
                      stream);
  ++g_mask_bits_launches;
}
void mask_bias_grad_bits(const bf16* dy, const uint8_t* bits, int64_t bits_ld, bf16* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_bits_impl(dy, bits, bits_ld, dz, partial, db, B, out, stream);
}
void mask_bias_grad_bits(const f16* dy, const uint8_t* bits, int64_t bits_ld, f16* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_bits_impl(dy, bits, bits_ld, dz, partial, db, B, out, stream);
}
int64_t mask_bits_launches() { return g_mask_bits_launches.load(); }

void relu_mask(const float* dy, const float* y, float* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}
void relu_mask(const bf16* dy, const bf16* y, bf16* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<bf16><<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}
void relu_mask(const f16* dy, const f16* y, f16* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<f16><<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}

void sigmoid(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, y, n);
  DLREC_CUDA_LAUNCH_CHECK();
}

void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream, bf16* dlogits_h, bool mse,
                     int64_t denom) {
  if (n == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), stream));
    return;
  }
  bce_kernel<bf16><<<1, kBceThreads, 0, stream>>>(logits, labels, n, dlogits, loss, dlogits_h,
                                                  nullptr, mse, denom > 0 ? denom : n);
  DLREC_CUDA_LAUNCH_CHECK();
}

void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream, f16* dlogits_h, const float* loss_scale,
                     bool mse) {
  if (n == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), stream));
    return;
  }
  bce_kernel<f16><<<1, kBceThreads, 0, stream>>>(logits, labels, n, dlogits, loss, dlogits_h,
                                                 loss_scale, mse, n);
  DLREC_CUDA_LAUNCH_CHECK();
}

void scale_to_f16(const float* x, int64_t n, const float* scale, f16* y, cudaStream_t stream) {
  if (n == 0) return;
  scale_to_f16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, scale, y);
  DLREC_CUDA_LAUNCH_CHECK();
}

void check_finite(const float* const* ptrs, const int64_t* counts, int n_tensors, int* overflow,
                  cudaStream_t stream) {
  if (n_tensors == 0) return;
  check_finite_kernel<<<dim3(64, static_cast<unsigned>(n_tensors)), 256, 0, stream>>>(
      ptrs, counts, overflow);
  DLREC_CUDA_LAUNCH_CHECK();
}

void check_finite(const float* p, int64_t n, int* overflow, cudaStream_t stream) {
  if (n == 0) return;
  check_finite1_kernel<<<grid_for(n, 256, 1024), 256, 0, stream>>>(p, n, overflow);
  DLREC_CUDA_LAUNCH_CHECK();
}

void check_finite(const f16* p, int64_t n, int* overflow, cudaStream_t stream) {
  if (n == 0) return;
  check_finite_f16_kernel<<<grid_for(n, 256, 1024), 256, 0, stream>>>(p, n, overflow);
  DLREC_CUDA_LAUNCH_CHECK();
}

void scale_inplace(float* x, int64_t n, const float* scale, cudaStream_t stream) {
  if (n == 0) return;
  scale_inplace_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, scale);
  DLREC_CUDA_LAUNCH_CHECK();
}

void loss_scale_update(const LossScale& ls, int growth_interval, cudaStream_t stream) {
  loss_scale_update_kernel<<<1, 1, 0, stream>>>(ls, growth_interval);
  DLREC_CUDA_LAUNCH_CHECK();
}

template <class H>
void optimizer_step_impl(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                         int64_t ldg, H* wh, int64_t ldh, const float* lr, float eps,
                         cudaStream_t stream, const float* gscale, const float* mask) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dense_step_kernel<<<grid_for(n, 256), 256, 0, stream>>>(w, g, rows, cols, ldg, wh, ldh, lr,
                                                          gscale, mask, SgdAdagradOp{state, eps});
  DLREC_CUDA_LAUNCH_CHECK();
}
template <class H>
void momentum_step_impl(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                        int64_t ldg, H* wh, int64_t ldh, const float* lr, float mu, bool nesterov,
                        cudaStream_t stream, const float* gscale, const float* mask) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dense_step_kernel<<<grid_for(n, 256), 256, 0, stream>>>(
      w, g, rows, cols, ldg, wh, ldh, lr, gscale, mask, MomentumOp{state, mu, nesterov});
  DLREC_CUDA_LAUNCH_CHECK();
}
void momentum_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                   int64_t ldg, bf16* wh, int64_t ldh, const float* lr, float mu, bool nesterov,
                   cudaStream_t stream, const float* gscale, const float* mask) {
  momentum_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, mu, nesterov, stream, gscale,
                     mask);
}
void momentum_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                   int64_t ldg, f16* wh, int64_t ldh, const float* lr, float mu, bool nesterov,
                   cudaStream_t stream, const float* gscale, const float* mask) {
  momentum_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, mu, nesterov, stream, gscale,
                     mask);
}

template <class H>
void adam_step_impl(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, H* wh, int64_t ldh, const float* lr, const AdamParams& p,
                    cudaStream_t stream, const float* gscale, const float* mask) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dense_step_kernel<<<grid_for(n, 256), 256, 0, stream>>>(w, g, rows, cols, ldg, wh, ldh, lr,
                                                          gscale, mask, AdamOp{state, cols, p});
  DLREC_CUDA_LAUNCH_CHECK();
  adam_count_kernel<<<grid_for(rows, 256), 256, 0, stream>>>(state, rows, cols, gscale);
  DLREC_CUDA_LAUNCH_CHECK();
}
void adam_step(float* w, const float* g, float* state, int64_t rows, int64_t cols, int64_t ldg,
               bf16* wh, int64_t ldh, const float* lr, const AdamParams& p, cudaStream_t stream,
               const float* gscale, const float* mask) {
  adam_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, p, stream, gscale, mask);
}
void adam_step(float* w, const float* g, float* state, int64_t rows, int64_t cols, int64_t ldg,
               f16* wh, int64_t ldh, const float* lr, const AdamParams& p, cudaStream_t stream,
               const float* gscale, const float* mask) {
  adam_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, p, stream, gscale, mask);
}
void optimizer_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, bf16* wh, int64_t ldh, const float* lr, float eps,
                    cudaStream_t stream, const float* gscale, const float* mask) {
  optimizer_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, eps, stream, gscale, mask);
}
void optimizer_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, f16* wh, int64_t ldh, const float* lr, float eps,
                    cudaStream_t stream, const float* gscale, const float* mask) {
  optimizer_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, eps, stream, gscale, mask);
}


}  // namespace dlrec::nn::cuda_dense
