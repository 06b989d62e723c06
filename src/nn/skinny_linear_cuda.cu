// The warp-per-output linear layer of small-batch 16-bit inference (cd::skinny_linear,
// declared in dense_cuda.h).
#include <algorithm>

#include "core/cuda_check.h"
#include "nn/dense_cuda.h"
#include "nn/half_cuda.cuh"

namespace dlrec::nn::cuda_dense {
namespace {
using half_cuda::from_f;
using half_cuda::to_f;
using half_cuda::unpack8;

constexpr int kSkinnyWarps = 8;  // outputs per block of 256 threads

// One warp per output o: lanes stride over k in 8-element (16-byte) pieces of W's row and of
// each x row, f32 partial sums per row, a warp reduction, lane r writes row r.
template <class H, int R>
__global__ void skinny_linear_kernel(const H* __restrict__ w, const H* __restrict__ x,
                                     int64_t out, int64_t k, const void* __restrict__ b,
                                     bool relu, void* __restrict__ y, bool f32_out) {
  const int lane = threadIdx.x & 31;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kSkinnyWarps + (threadIdx.x >> 5);
  if (o >= out) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + o * k);
  const int64_t pieces = k / 8;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t i = lane; i < pieces; i += 32) {
    float wf[8];
    unpack8(__ldg(wr + i), wf, static_cast<const H*>(nullptr));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float xf[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(x + r * k) + i), xf,
              static_cast<const H*>(nullptr));
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], s);
  if (lane >= R) return;
  float v = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r == lane) v = acc[r];
  v += f32_out ? static_cast<const float*>(b)[o] : to_f(static_cast<const H*>(b)[o]);
  if (relu) v = fmaxf(v, 0.f);
  if (f32_out) static_cast<float*>(y)[lane * out + o] = v;
  else static_cast<H*>(y)[lane * out + o] = from_f<H>(v);
}

template <class H>
bool skinny_linear_impl(const H* w, const H* x, int64_t R, int64_t out, int64_t k, const void* b,
                        bool relu, void* y, bool f32_out, cudaStream_t stream) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (R < 1 || R > kSkinnyRows || out < 1 || k < 8 || k % 8 != 0 || !aligned(w) || !aligned(x))
    return false;
  const int grid = static_cast<int>((out + kSkinnyWarps - 1) / kSkinnyWarps);
  const int threads = 32 * kSkinnyWarps;
#define DLREC_SKINNY(NR)                                                                  \
  case NR:                                                                                \
    skinny_linear_kernel<H, NR><<<grid, threads, 0, stream>>>(w, x, out, k, b, relu, y,   \
                                                              f32_out);                   \
    break;
  switch (R) {
    DLREC_SKINNY(1) DLREC_SKINNY(2) DLREC_SKINNY(3) DLREC_SKINNY(4)
    DLREC_SKINNY(5) DLREC_SKINNY(6) DLREC_SKINNY(7) DLREC_SKINNY(8)
  }
#undef DLREC_SKINNY
  DLREC_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace

bool skinny_linear(const bf16* w, const bf16* x, int64_t R, int64_t out, int64_t k,
                   const void* b, bool relu, void* y, bool f32_out, cudaStream_t stream) {
  return skinny_linear_impl(w, x, R, out, k, b, relu, y, f32_out, stream);
}
bool skinny_linear(const f16* w, const f16* x, int64_t R, int64_t out, int64_t k,
                   const void* b, bool relu, void* y, bool f32_out, cudaStream_t stream) {
  return skinny_linear_impl(w, x, R, out, k, b, relu, y, f32_out, stream);
}

}  // namespace dlrec::nn::cuda_dense
