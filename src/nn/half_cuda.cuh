// Helpers shared by the nn kernels: conversions between f32 and bf16/fp16, the unpacking of a
// 16-byte load (8 halves) into 8 floats (device code), and the grid size of a grid-stride loop
// (host). Header-only.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>
#include <cuda_fp16.h>

namespace dlrec::nn::half_cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

// Blocks for a grid-stride loop over n items with `threads` per block: at least 1, at most cap.
inline int grid_for(int64_t n, int threads, int cap = 65536) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }
template <class E> __device__ __forceinline__ E from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ f16 from_f<f16>(float x) { return __float2half_rn(x); }

// The 8 halves of `v` as floats; the last argument picks the type (pass (const H*)nullptr).
__device__ __forceinline__ void unpack8(const uint4& v, float* f, const bf16*) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void unpack8(const uint4& v, float* f, const f16*) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

}  // namespace dlrec::nn::half_cuda
