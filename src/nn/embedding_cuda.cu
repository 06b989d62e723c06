// CUDA embedding bags: the pooling forward (forward_kernel2, tables in the order of their ids in
// the batch when multi-hot: order_kernel), table initialisation and fill. The backward (ids
// sorted by row, the optimizer applied to each distinct row) is in embedding_backward_cuda.cu.
#include "nn/embedding_cuda.h"

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/cuda_check.h"
#include "nn/embedding_bags_cuda.cuh"
#include "nn/half_cuda.cuh"
#include "nn/row_quant_cuda.cuh"

namespace dlrec::nn::cuda_emb {
namespace {

using half_cuda::grid_for;
using half_cuda::store1;
using half_cuda::store4;

__device__ __forceinline__ uint64_t splitmix64_d(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

__global__ void init_uniform_kernel(float* w, int64_t n, uint64_t seed, double a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double u =
        static_cast<double>(splitmix64_d(seed ^ splitmix64_d(static_cast<uint64_t>(i))) >> 11) *
        0x1.0p-53;
    // Explicit rounding: no fused multiply-add, so the value is the CPU's bit for bit.
    w[i] = static_cast<float>(__dadd_rn(-a, __dmul_rn(__dmul_rn(2.0, a), u)));
  }
}

__global__ void fill_kernel(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

// Forward: kFwdBags consecutive bags of one table per warp, their rows loaded together (with one
// bag per warp, DCNv2's one id per bag left one row load in flight), the tables' warps in the
// order of forward()'s `order` when given; V = 4: float4 lanes (dim % 4 == 0), V = 1:
// scalar lanes. Each bag is summed in order and scaled once. QB: 0, fp32 tables; 8 or 4, every
// table row-wise quantized with codes of that width (Tables::quant_bits); -1, a mix (per table:
// Tables::codes[t] or fp32). Rows of codes are dequantized on load. The uniform forms have no
// branch on the table's kind, so a warp's row loads are all in flight at once; at widths that
// are multiples of 16 they run as forward_quant16 instead (embedding_quant_cuda.cu: more rows
// in flight per warp; bench/RESULTS.md has the lookup times of both).
constexpr int kFwdBags = 4;

// forward()'s `order`: the tables by their ids in the batch, most first (ties by index), so that the
// warps of long bags (MLPerf DCNv2's 100-id table) start first instead of wherever the table
// falls in the grid (at 2,048 rows they set the lookup's time: bench/RESULTS.md, "Multi-hot
// serving"). One block; the counts in shared memory.
constexpr int kMaxOrderedTables = 4096;  // their counts in 32 KB of shared memory

__global__ void order_kernel(const int32_t* __restrict__ offsets, int64_t B, int T,
                             int32_t* __restrict__ order) {
  extern __shared__ int64_t ids[];
  for (int t = threadIdx.x; t < T; t += blockDim.x)
    ids[t] = int64_t(offsets[int64_t(t + 1) * B]) - offsets[int64_t(t) * B];
  __syncthreads();
  for (int t = threadIdx.x; t < T; t += blockDim.x) {
    int rank = 0;
    for (int u = 0; u < T; ++u) rank += ids[u] > ids[t] || (ids[u] == ids[t] && u < t);
    order[rank] = t;
  }
}

template <int V, class O, int QB>
__global__ void __launch_bounds__(256, 3)
    forward_kernel2(Tables tab, const int32_t* __restrict__ offsets,
                    const uint32_t* __restrict__ keys, int64_t B, bool mean, O* __restrict__ out,
                    int64_t ld, const int32_t* __restrict__ order) {
  // The warps of a table's bags in a group of ceil(B / kFwdBags), the k-th group the table
  // order[k] (heaviest first, when given).
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t per_table = (B + kFwdBags - 1) / kFwdBags;
  const int64_t k = warp / per_table;
  if (k >= tab.num_tables) return;
  const int t0 = order ? order[k] : static_cast<int>(k);
  const int64_t b0 = (warp - k * per_table) * kFwdBags;  // the warp's first sample
  const int lane = threadIdx.x & 31;
  const int d = tab.dim;
  int32_t beg[kFwdBags], len[kFwdBags];
  const int32_t maxlen =
      bag_spans<kFwdBags>(offsets, int64_t(t0) * B + b0, int64_t(t0) * B + B, beg, len);
  // Table and sample of bag u of the warp (all of one table).
  auto table_of = [&](int u, int64_t& b) {
    b = b0 + u;
    return t0;
  };
  // Elements 4v .. 4v + 3 (V = 4) or k (V = 1) of id p of bag u.
  auto load4 = [&](int u, int32_t p, int v) {  // QB <= 0 (QB > 0: qrow below)
    int64_t b;
    const int t = table_of(u, b);
    const int64_t r = int64_t(keys[beg[u] + p] - tab.row_base[t]);
    if constexpr (QB < 0)
      if (tab.codes[t]) {
        const int bits = tab.qbits[t];
        return rq_load4(rq_row(tab.codes[t], d, bits, r), bits, d, 4 * v);
      }
    return reinterpret_cast<const float4*>(tab.weights[t] + r * d)[v];
  };
  auto qrow = [&](int u, int32_t p) {  // QB > 0: the row of id p of bag u
    int64_t b;
    const int t = table_of(u, b);
    return rq_row(tab.codes[t], d, QB, int64_t(keys[beg[u] + p] - tab.row_base[t]));
  };
  auto load1 = [&](int u, int32_t p, int k) {
    int64_t b;
    const int t = table_of(u, b);
    const int64_t r = int64_t(keys[beg[u] + p] - tab.row_base[t]);
    if constexpr (QB > 0) return rq_load1(rq_row(tab.codes[t], d, QB, r), QB, d, k);
    if constexpr (QB < 0)
      if (tab.codes[t]) {
        const int bits = tab.qbits[t];
        return rq_load1(rq_row(tab.codes[t], d, bits, r), bits, d, k);
      }
    return tab.weights[t][r * d + k];
  };
  auto dest = [&](int u, float& scale) {
    int64_t b;
    const int t = table_of(u, b);
    scale = (mean && len[u] > 1) ? 1.f / static_cast<float>(len[u]) : 1.f;
    return out + b * ld + int64_t(tab.col ? tab.col[t] : t) * d;
  };
  if constexpr (V == 4) {
    const int nv = d / 4;
    for (int v = lane; v < nv; v += 32) {
      float4 acc[kFwdBags];
#pragma unroll
      for (int u = 0; u < kFwdBags; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int32_t p = 0; p < maxlen; ++p) {
        float4 x[kFwdBags];
        if constexpr (QB > 0) {  // every bag's loads in flight first, then the decoding
          uint32_t raw[kFwdBags];
          float2 sb[kFwdBags];
#pragma unroll
          for (int u = 0; u < kFwdBags; ++u)
            if (p < len[u]) {
              const uint8_t* row = qrow(u, p);
              raw[u] = rq_raw4<QB>(row, 4 * v);
              sb[u] = rq_sb(row, d, QB);
            }
#pragma unroll
          for (int u = 0; u < kFwdBags; ++u)
            if (p < len[u]) x[u] = rq_decode4<QB>(raw[u], sb[u]);
        } else {
#pragma unroll
          for (int u = 0; u < kFwdBags; ++u)
            if (p < len[u]) x[u] = load4(u, p, v);
        }
#pragma unroll
        for (int u = 0; u < kFwdBags; ++u)
          if (p < len[u]) {
            if (p == 0) {
              acc[u] = x[u];
            } else {
              acc[u].x += x[u].x; acc[u].y += x[u].y; acc[u].z += x[u].z; acc[u].w += x[u].w;
            }
          }
      }
#pragma unroll
      for (int u = 0; u < kFwdBags; ++u)
        if (b0 + u < B) {
          float sc;
          O* o = dest(u, sc);
          if (sc != 1.f) {
            acc[u].x *= sc; acc[u].y *= sc; acc[u].z *= sc; acc[u].w *= sc;
          }
          store4(o + 4 * v, acc[u]);
        }
    }
  } else {
    for (int k = lane; k < d; k += 32) {
      float acc[kFwdBags];
#pragma unroll
      for (int u = 0; u < kFwdBags; ++u) acc[u] = 0.f;
      for (int32_t p = 0; p < maxlen; ++p) {
        float x[kFwdBags];
#pragma unroll
        for (int u = 0; u < kFwdBags; ++u)
          if (p < len[u]) x[u] = load1(u, p, k);
#pragma unroll
        for (int u = 0; u < kFwdBags; ++u)
          if (p < len[u]) acc[u] = p == 0 ? x[u] : acc[u] + x[u];
      }
#pragma unroll
      for (int u = 0; u < kFwdBags; ++u)
        if (b0 + u < B) {
          float sc;
          O* o = dest(u, sc);
          store1(o + k, sc != 1.f ? acc[u] * sc : acc[u]);
        }
    }
  }
}

}  // namespace

void init_uniform(float* w, int64_t n, uint64_t seed, double a, cudaStream_t stream) {
  if (n <= 0) return;
  init_uniform_kernel<<<grid_for(n, 256), 256, 0, stream>>>(w, n, seed, a);
  DLREC_CUDA_LAUNCH_CHECK();
}

void fill(float* p, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, 256), 256, 0, stream>>>(p, n, value);
  DLREC_CUDA_LAUNCH_CHECK();
}

// float4 lanes need dim and ld multiples of 4 and a base aligned to 4 elements.
template <class O>
void forward(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B, bool mean,
             O* out, cudaStream_t stream, int64_t ld, int32_t* order) {
  const int64_t bags = B * tab.num_tables;
  if (bags == 0) return;
  const int64_t width = int64_t(tab.num_tables) * tab.dim;
  if (ld == 0) ld = width;
  DLREC_CHECK(ld >= width, "embedding forward: row stride ", ld, " is below the ", width,
              " pooled columns");
  const int threads = 256;
  const int64_t blocks =
      (int64_t(tab.num_tables) * ((B + kFwdBags - 1) / kFwdBags) * 32 + threads - 1) / threads;
  const int qb = !tab.codes ? 0 : tab.quant_bits == 8 || tab.quant_bits == 4 ? tab.quant_bits : -1;
  if (qb > 0 && vec4_ok(out, tab.dim, ld) &&
      forward_quant16(tab, offsets, keys, B, mean, out, ld, stream))
    return;  // (its own warp layout, in table order)
  if (order && tab.num_tables <= kMaxOrderedTables) {
    order_kernel<<<1, 256, sizeof(int64_t) * tab.num_tables, stream>>>(offsets, B,
                                                                       tab.num_tables, order);
    DLREC_CUDA_LAUNCH_CHECK();
  } else {
    order = nullptr;
  }
  const unsigned g = static_cast<unsigned>(blocks);
  auto run = [&](auto v, auto q) {
    forward_kernel2<decltype(v)::value, O, decltype(q)::value>
        <<<g, threads, 0, stream>>>(tab, offsets, keys, B, mean, out, ld, order);
  };
  auto with_q = [&](auto v) {
    if (qb == 8) run(v, std::integral_constant<int, 8>{});
    else if (qb == 4) run(v, std::integral_constant<int, 4>{});
    else if (qb < 0) run(v, std::integral_constant<int, -1>{});
    else run(v, std::integral_constant<int, 0>{});
  };
  if (vec4_ok(out, tab.dim, ld))
    with_q(std::integral_constant<int, 4>{});
  else
    with_q(std::integral_constant<int, 1>{});
  DLREC_CUDA_LAUNCH_CHECK();
}
template void forward<float>(const Tables&, const int32_t*, const uint32_t*, int64_t, bool, float*,
                             cudaStream_t, int64_t, int32_t*);
template void forward<__nv_bfloat16>(const Tables&, const int32_t*, const uint32_t*, int64_t, bool,
                                     __nv_bfloat16*, cudaStream_t, int64_t, int32_t*);
template void forward<__half>(const Tables&, const int32_t*, const uint32_t*, int64_t, bool,
                              __half*, cudaStream_t, int64_t, int32_t*);

}  // namespace dlrec::nn::cuda_emb
