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

// Stores of 4 floats (o aligned to 4 elements) and of one, rounded to the output's type.
__device__ __forceinline__ void store4(float* o, float4 v) { *reinterpret_cast<float4*>(o) = v; }
__device__ __forceinline__ void store4(__nv_bfloat16* o, float4 v) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<uint32_t*>(&a);
  u.y = *reinterpret_cast<uint32_t*>(&b);
  *reinterpret_cast<uint2*>(o) = u;
}
__device__ __forceinline__ void store4(__half* o, float4 v) {
  __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<uint32_t*>(&a);
  u.y = *reinterpret_cast<uint32_t*>(&b);
  *reinterpret_cast<uint2*>(o) = u;
}
__device__ __forceinline__ void store1(__half* o, float v) { *o = __float2half_rn(v); }
__device__ __forceinline__ void store1(float* o, float v) { *o = v; }
__device__ __forceinline__ void store1(__nv_bfloat16* o, float v) { *o = __float2bfloat16(v); }

}  // namespace dlrec::nn::half_cuda
