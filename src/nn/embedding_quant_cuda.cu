// Row-wise quantized embedding tables on the GPU (serving; nn/embedding_cuda.h, Tables::codes):
// their device layout (pack_quant_rows) and the pooling forward of tables all quantized with one
// width at widths that are multiples of 16 (forward_quant16). Other quantized cases pool in
// embedding_cuda.cu's forward_kernel2 (a row per warp, 4 codes per lane).
#include <cstring>
#include <type_traits>

#include "core/cuda_check.h"
#include "nn/embedding_cuda.h"
#include "nn/embedding_bags_cuda.cuh"
#include "nn/half_cuda.cuh"
#include "nn/row_quant_cuda.cuh"

namespace dlrec::nn::cuda_emb {
namespace {

using half_cuda::store4;

// A group of L = dim / 16 lanes pools kQBags consecutive bags, each lane 16 values of a row (one
// 8-byte load of 16 int4 codes or two of 16 int8 codes: rows are 8-byte aligned); a warp has
// 32 / L groups, so with dim 128 it has 8 rows in flight per step where forward_kernel2 has 4
// (an int8 row is 128 bytes: one lane per 4 codes left most of a warp's load width unused).
// Sums in the same order and arithmetic as forward_kernel2: bit-identical output.
constexpr int kQBags = 2;

template <int BITS>
__device__ __forceinline__ void decode16(uint2 w0, uint2 w1, float2 sb, float* x) {
  float4 f[4];
  if constexpr (BITS == 8) {
    f[0] = rq_decode4<8>(w0.x, sb);
    f[1] = rq_decode4<8>(w0.y, sb);
    f[2] = rq_decode4<8>(w1.x, sb);
    f[3] = rq_decode4<8>(w1.y, sb);
  } else {
    f[0] = rq_decode4<4>(w0.x & 0xffffu, sb);
    f[1] = rq_decode4<4>(w0.x >> 16, sb);
    f[2] = rq_decode4<4>(w0.y & 0xffffu, sb);
    f[3] = rq_decode4<4>(w0.y >> 16, sb);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x[4 * j] = f[j].x;
    x[4 * j + 1] = f[j].y;
    x[4 * j + 2] = f[j].z;
    x[4 * j + 3] = f[j].w;
  }
}

template <int BITS, class O>
__global__ void __launch_bounds__(256, 3)
    forward_quant16_kernel(Tables tab, const int32_t* __restrict__ offsets,
                           const uint32_t* __restrict__ keys, int64_t B, bool mean,
                           O* __restrict__ out, int64_t ld) {
  const int d = tab.dim, L = d / 16, groups = 32 / L;
  const int lane = threadIdx.x & 31, g = lane / L, s = lane - g * L;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t bag0 = (warp * groups + g) * kQBags;
  const int64_t bags = B * tab.num_tables;
  if (bag0 >= bags) return;
  int32_t beg[kQBags], len[kQBags];
  const int32_t maxlen = bag_spans<kQBags>(offsets, bag0, bags, beg, len);
  auto table_of = [&](int u, int64_t& b) {
    const int64_t bag = bag0 + u;
    const int t = static_cast<int>(bag / B);
    b = bag - int64_t(t) * B;
    return t;
  };
  const int64_t byte0 = int64_t(s) * 16 * BITS / 8;  // this lane's first code byte in a row
  float acc[kQBags][16];
  for (int32_t p = 0; p < maxlen; ++p) {
    uint2 w0[kQBags], w1[kQBags];
    float2 sb[kQBags];
#pragma unroll
    for (int u = 0; u < kQBags; ++u)
      if (p < len[u]) {  // every row's loads in flight first, then the decoding
        int64_t b;
        const int t = table_of(u, b);
        const uint8_t* row =
            rq_row(tab.codes[t], d, BITS, int64_t(keys[beg[u] + p] - tab.row_base[t]));
        w0[u] = __ldg(reinterpret_cast<const uint2*>(row + byte0));
        if constexpr (BITS == 8) w1[u] = __ldg(reinterpret_cast<const uint2*>(row + byte0 + 8));
        sb[u] = rq_sb(row, d, BITS);
      }
#pragma unroll
    for (int u = 0; u < kQBags; ++u)
      if (p < len[u]) {
        float x[16];
        decode16<BITS>(w0[u], w1[u], sb[u], x);
#pragma unroll
        for (int k = 0; k < 16; ++k) acc[u][k] = p == 0 ? x[k] : acc[u][k] + x[k];
      }
  }
#pragma unroll
  for (int u = 0; u < kQBags; ++u)
    if (bag0 + u < bags) {
      int64_t b;
      const int t = table_of(u, b);
      const float sc = (mean && len[u] > 1) ? 1.f / static_cast<float>(len[u]) : 1.f;
      O* o = out + b * ld + int64_t(tab.col ? tab.col[t] : t) * d + 16 * s;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float4 v = len[u] == 0 ? make_float4(0.f, 0.f, 0.f, 0.f)
                               : make_float4(acc[u][4 * j], acc[u][4 * j + 1], acc[u][4 * j + 2],
                                             acc[u][4 * j + 3]);
        if (sc != 1.f) {
          v.x *= sc; v.y *= sc; v.z *= sc; v.w *= sc;
        }
        store4(o + 4 * j, v);
      }
    }
}

}  // namespace

int64_t quant_row_stride(int64_t dim, int bits) {
  return rq_sb_offset(dim, bits) + 8;
}

void pack_quant_rows(const RowQuantRows& q, int64_t r0, int64_t n, uint8_t* out) {
  const int64_t rb = q.row_bytes(), stride = quant_row_stride(q.dim, q.bits);
  const int64_t off = stride - 8;
  std::memset(out, 0, static_cast<size_t>(n * stride));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* row = out + i * stride;
    const size_t r = static_cast<size_t>(r0 + i);
    std::memcpy(row, q.codes.data() + r * rb, static_cast<size_t>(rb));
    std::memcpy(row + off, &q.scale[r], sizeof(float));
    std::memcpy(row + off + 4, &q.bias[r], sizeof(float));
  }
}
template <class O>
bool forward_quant16(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
                     bool mean, O* out, int64_t ld, cudaStream_t stream) {
  const int d = tab.dim, bits = tab.quant_bits;
  if (!tab.codes || (bits != 8 && bits != 4) || d < 16 || d % 16 != 0 || 32 % (d / 16) != 0 ||
      ld % 4 != 0 || reinterpret_cast<uintptr_t>(out) % (4 * sizeof(O)) != 0)
    return false;
  const int64_t bags = B * tab.num_tables;
  if (bags == 0) return true;
  const int threads = 256;
  const int64_t per_warp = int64_t(32 / (d / 16)) * kQBags;
  const int64_t warps = (bags + per_warp - 1) / per_warp;
  const unsigned blocks = static_cast<unsigned>((warps * 32 + threads - 1) / threads);
  if (bits == 8)
    forward_quant16_kernel<8, O><<<blocks, threads, 0, stream>>>(tab, offsets, keys, B, mean, out, ld);
  else
    forward_quant16_kernel<4, O><<<blocks, threads, 0, stream>>>(tab, offsets, keys, B, mean, out, ld);
  DLREC_CUDA_LAUNCH_CHECK();
  return true;
}
template bool forward_quant16<float>(const Tables&, const int32_t*, const uint32_t*, int64_t,
                                     bool, float*, int64_t, cudaStream_t);
template bool forward_quant16<__nv_bfloat16>(const Tables&, const int32_t*, const uint32_t*,
                                             int64_t, bool, __nv_bfloat16*, int64_t,
                                             cudaStream_t);
template bool forward_quant16<__half>(const Tables&, const int32_t*, const uint32_t*, int64_t,
                                      bool, __half*, int64_t, cudaStream_t);

}  // namespace dlrec::nn::cuda_emb
