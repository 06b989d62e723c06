// CUDA kernels of the graph model's fm and wide layers. See graph_layers_cuda.h.
#include "nn/graph_layers_cuda.h"

#include <cstdint>

#include "core/cuda_check.h"

namespace dlrec::nn::cuda_graph {
namespace {

__device__ __forceinline__ float ldf(const float* p) { return *p; }
__device__ __forceinline__ float ldf(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void stf(float* p, float v) { *p = v; }
__device__ __forceinline__ void stf(__nv_bfloat16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ float ldf(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void stf(__half* p, float v) { *p = __float2half_rn(v); }

constexpr int kWarps = 8;  // warps (samples) per block of the FM kernels

unsigned blocks_for(int64_t n, int per_block) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// Component k of sample row xb: the sum over the n fields (s) and of the squares (q), in the
// fields' order, as nn::FactorizationMachine sums them.
template <class E>
__device__ __forceinline__ float field_sum(const E* xb, int n, int d, int k, float* q) {
  float s = 0.f, sq = 0.f;
  for (int i = 0; i < n; ++i) {
    const float v = ldf(xb + static_cast<int64_t>(i) * d + k);
    s = __fadd_rn(s, v);
    sq = __fadd_rn(sq, __fmul_rn(v, v));
  }
  if (q) *q = sq;
  return s;
}

// One warp per sample, lanes over the d components.
template <class E>
__global__ void fm_forward_kernel(const E* __restrict__ x, int64_t ld, int64_t B, int n, int d,
                                  float* __restrict__ y) {
  const int64_t b = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (b >= B) return;  // whole warps leave together
  const E* xb = x + b * ld;
  double acc = 0;
  for (int k = lane; k < d; k += 32) {
    float q;
    const float s = field_sum(xb, n, d, k, &q);
    acc += static_cast<double>(s) * s - q;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[b] = static_cast<float>(0.5 * acc);
}

template <class E, class D>
__global__ void fm_backward_kernel(const E* __restrict__ x, int64_t ld,
                                   const float* __restrict__ dy, int64_t B, int n, int d,
                                   D* __restrict__ dx, int64_t dx_ld, bool accumulate) {
  const int64_t b = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (b >= B) return;
  const E* xb = x + b * ld;
  D* db = dx + b * dx_ld;
  const float g = dy[b];
  for (int k = lane; k < d; k += 32) {
    const float s = field_sum(xb, n, d, k, static_cast<float*>(nullptr));
    for (int i = 0; i < n; ++i) {
      const int64_t j = static_cast<int64_t>(i) * d + k;
      float v = __fmul_rn(g, __fsub_rn(s, ldf(xb + j)));
      if (accumulate) v = __fadd_rn(ldf(db + j), v);
      stf(db + j, v);
    }
  }
}

__global__ void wide_sum_kernel(const float* __restrict__ parts, const float* __restrict__ bias,
                                int64_t B, int T, float* __restrict__ y) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= B) return;
  float acc = bias[0];
  const float* p = parts + b * T;
  for (int t = 0; t < T; ++t) acc = __fadd_rn(acc, p[t]);
  y[b] = acc;
}

__global__ void wide_broadcast_kernel(const float* __restrict__ dy, int64_t B, int T,
                                      float* __restrict__ dparts) {
  const int64_t n = B * T;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dparts[i] = dy[i / T];
}

}  // namespace

template <class E>
void fm_forward(const E* x, int64_t ld, int64_t B, int n, int d, float* y, cudaStream_t stream) {
  if (B <= 0) return;
  fm_forward_kernel<E><<<blocks_for(B, kWarps), 32 * kWarps, 0, stream>>>(x, ld, B, n, d, y);
  DLREC_CUDA_LAUNCH_CHECK();
}

template <class E, class D>
void fm_backward(const E* x, int64_t ld, const float* dy, int64_t B, int n, int d, D* dx,
                 int64_t dx_ld, bool accumulate, cudaStream_t stream) {
  if (B <= 0) return;
  fm_backward_kernel<E, D><<<blocks_for(B, kWarps), 32 * kWarps, 0, stream>>>(
      x, ld, dy, B, n, d, dx, dx_ld, accumulate);
  DLREC_CUDA_LAUNCH_CHECK();
}

void wide_sum(const float* parts, const float* bias, int64_t B, int T, float* y,
              cudaStream_t stream) {
  if (B <= 0) return;
  wide_sum_kernel<<<blocks_for(B, 256), 256, 0, stream>>>(parts, bias, B, T, y);
  DLREC_CUDA_LAUNCH_CHECK();
}

void wide_broadcast(const float* dy, int64_t B, int T, float* dparts, cudaStream_t stream) {
  const int64_t n = B * T;
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  wide_broadcast_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0,
                          stream>>>(dy, B, T, dparts);
  DLREC_CUDA_LAUNCH_CHECK();
}

template void fm_forward<float>(const float*, int64_t, int64_t, int, int, float*, cudaStream_t);
template void fm_forward<__nv_bfloat16>(const __nv_bfloat16*, int64_t, int64_t, int, int, float*,
                                        cudaStream_t);
template void fm_backward<float, float>(const float*, int64_t, const float*, int64_t, int, int,
                                        float*, int64_t, bool, cudaStream_t);
template void fm_backward<__nv_bfloat16, float>(const __nv_bfloat16*, int64_t, const float*,
                                                int64_t, int, int, float*, int64_t, bool,
                                                cudaStream_t);
template void fm_backward<float, __nv_bfloat16>(const float*, int64_t, const float*, int64_t, int,
                                                int, __nv_bfloat16*, int64_t, bool, cudaStream_t);
template void fm_backward<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                        const float*, int64_t, int, int,
                                                        __nv_bfloat16*, int64_t, bool,
                                                        cudaStream_t);
template void fm_forward<__half>(const __half*, int64_t, int64_t, int, int, float*, cudaStream_t);
template void fm_backward<__half, float>(const __half*, int64_t, const float*, int64_t, int, int,
                                         float*, int64_t, bool, cudaStream_t);
template void fm_backward<float, __half>(const float*, int64_t, const float*, int64_t, int, int,
                                         __half*, int64_t, bool, cudaStream_t);
template void fm_backward<__half, __half>(const __half*, int64_t, const float*, int64_t, int, int,
                                          __half*, int64_t, bool, cudaStream_t);

}  // namespace dlrec::nn::cuda_graph
