// Internal: the warp-per-output dot products of the fused small-batch forward's Linear layers
// (infer_small_cuda.cu): the 16-bit form (fused multiply-adds in a fixed order, as
// cd::skinny_linear) and the INT8 form (infer_small_cuda.h, Int8Form: the block stages its
// group of input rows quantized to int8 in shared memory once, each warp forms an output's
// int32 sums with dp4a, exact, and dequantizes them as the CPU reference does).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "model/infer_small_cuda.h"
#include "nn/half_cuda.cuh"

namespace dlrec::model::fused_infer::ops {

// The int8 value of x as compress::quantize_value gives it: clamp(rint(x * inv), -127, 127).
__device__ __forceinline__ int quantize(float x, float inv) {
  return static_cast<int>(fminf(127.f, fmaxf(-127.f, rintf(__fmul_rn(x, inv)))));
}

// Rows [0, gn) of the group into xs8 (rows qk bytes apart): value (r, c) = get(r, c) for
// c < k, 0 beyond. The whole block; 4 values a word.
template <class Get>
__device__ __forceinline__ void stage_int8(int gn, int k, int qk, float inv, Get&& get,
                                           uint32_t* xs8) {
  const int words = qk / 4;
  for (int i = threadIdx.x; i < gn * words; i += blockDim.x) {
    const int r = i / words, c = (i - r * words) * 4;
    uint32_t packed = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int v = c + t < k ? quantize(get(r, c + t), inv) : 0;
      packed |= (static_cast<uint32_t>(v) & 0xffu) << (8 * t);
    }
    xs8[i] = packed;
  }
}

// stage_int8() for rows of 16-bit values on the device (rows x_ld values apart, 16-byte aligned,
// x_ld and k multiples of 8): 8 values a thread, one 16-byte load.
template <class H>
__device__ __forceinline__ void stage_int8_16(const H* x, int64_t x_ld, int gn, int k, int qk,
                                        float inv, uint32_t* xs8) {
  const int per_row = qk / 8;  // 8-value pieces of a staged row (those past k are 0)
  for (int i = threadIdx.x; i < gn * per_row; i += blockDim.x) {
    const int r = i / per_row, c = (i - r * per_row) * 8;
    uint32_t lo = 0, hi = 0;
    if (c < k) {
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(x + r * x_ld + c));
      float f[8];
      nn::half_cuda::unpack8(v, f, static_cast<const H*>(nullptr));
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        lo |= (static_cast<uint32_t>(quantize(f[t], inv)) & 0xffu) << (8 * t);
        hi |= (static_cast<uint32_t>(quantize(f[t + 4], inv)) & 0xffu) << (8 * t);
      }
    }
    xs8[2 * i] = lo;
    xs8[2 * i + 1] = hi;
  }
}

// Sums each of the G per-lane values over the warp (butterfly: every lane gets every sum) and
// returns row `lane`'s (0 for lane >= G). Shared by the 16-bit and the int8 layers.
template <int G, class T>
__device__ __forceinline__ T warp_sum_pick(T (&acc)[G], int lane) {
#pragma unroll
  for (int r = 0; r < G; ++r)
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], s);
  T v = 0;
#pragma unroll
  for (int r = 0; r < G; ++r)
    if (r == lane) v = acc[r];
  return v;
}

// The 16-bit layers' counterpart of dot_int8(): acc[r] += the lane's part of row r's dot product of
// the weight pieces (8 values each) with the staged 16-bit rows, fused multiply-adds in order.
template <class H, int G, int P>
__device__ __forceinline__ void dot16(const uint4 (&w)[P], const uint4* xs, int pieces, int c0,
                                      int lane, int gn, float (&acc)[G]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int pc = c0 + lane + 32 * i;
    if (pc >= pieces) continue;
    float wf[8];
    nn::half_cuda::unpack8(w[i], wf, static_cast<const H*>(nullptr));
#pragma unroll
    for (int r = 0; r < G; ++r) {
      const int row = min(r, gn - 1);  // rows past the end: computed, not written
      float xf[8];
      nn::half_cuda::unpack8(xs[row * pieces + pc], xf, static_cast<const H*>(nullptr));
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
    }
  }
}

// The weight row of output o: this lane's 16-byte pieces c0 + lane + 32 i of the row's
// `pieces` (16 int8 values each).
template <int P>
__device__ __forceinline__ void load_int8_row(const Int8Form& q, int o, int c0, int pieces,
                                              int lane, uint4 (&w)[P]) {
  const uint4* row = reinterpret_cast<const uint4*>(q.q + static_cast<int64_t>(o) * q.qk);
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int pc = c0 + lane + 32 * i;
    w[i] = pc < pieces ? __ldg(row + pc) : make_uint4(0, 0, 0, 0);
  }
}

// acc[r] += the lane's part of row r's dot product with the weight pieces in w (those of
// c0 + lane + 32 i); staged rows `pieces` 16-byte pieces apart; rows past gn repeat the last.
template <int G, int P>
__device__ __forceinline__ void dot_int8(const uint4 (&w)[P], const uint4* xs, int pieces, int c0,
                                        int lane, int gn, int (&acc)[G]) {
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int pc = c0 + lane + 32 * i;
    if (pc >= pieces) continue;
#pragma unroll
    for (int r = 0; r < G; ++r) {
      const uint4 x = xs[min(r, gn - 1) * pieces + pc];
      acc[r] = __dp4a(static_cast<int>(w[i].x), static_cast<int>(x.x), acc[r]);
      acc[r] = __dp4a(static_cast<int>(w[i].y), static_cast<int>(x.y), acc[r]);
      acc[r] = __dp4a(static_cast<int>(w[i].z), static_cast<int>(x.z), acc[r]);
      acc[r] = __dp4a(static_cast<int>(w[i].w), static_cast<int>(x.w), acc[r]);
    }
  }
}

// The warp's sums (exact) and, for lane < G, row `lane`'s value before the activation:
// float(acc) * deq[o] + bias[o], each step IEEE-rounded as the CPU reference's.
template <int G>
__device__ __forceinline__ float finish_int8(int (&acc)[G], const Int8Form& q, int o, int lane) {
  const int a = warp_sum_pick<G>(acc, lane);
  float v = __fmul_rn(static_cast<float>(a), q.deq[o]);
  if (q.bias) v = __fadd_rn(v, q.bias[o]);
  return v;
}

}  // namespace dlrec::model::fused_infer::ops
