// CUDA embedding bags: pooling forward, and a backward that de-duplicates the batch's ids by a
// radix sort (stable, so each row's contributions are summed in order of occurrence, as on the
// CPU) and applies the optimizer to each distinct row in the same kernel.
//
// Kernels: forward_kernel2; backward chunk_kernel2 (two one-id runs updated together) +
// finalize2_kernel. They replaced simpler kernels with the
// same sums in the same order (bit-identical results; removed after the comparison, see git
// history and bench/RESULTS.md): on DCNv2's tables, one H100, 2026-11-22, forward 0.427 -> 0.385
// ms, backward 1.121 -> 0.670 ms (ids 0.128 -> 0.110, reduce + update 0.992 -> 0.561).
#include "nn/embedding_cuda.h"

#include <cub/device/device_radix_sort.cuh>

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

__global__ void bag_of_kernel(const int32_t* __restrict__ offsets, int64_t bags,
                              int32_t* __restrict__ pos_bag) {
  for (int64_t bag = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; bag < bags;
       bag += int64_t(gridDim.x) * blockDim.x)
    for (int32_t p = offsets[bag]; p < offsets[bag + 1]; ++p) pos_bag[p] = static_cast<int32_t>(bag);
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<int32_t>(i);
}

// The sorted occurrences are cut into chunks of 32 (one warp each, one occurrence per lane), so
// a row that occurs thousands of times (small tables, hot ids) is summed by many warps at once
// instead of one warp walking the run at memory latency. Within a chunk, each piece of a run is
// summed in order. A piece that is a whole run is applied to its row at once; a run that crosses
// chunk boundaries leaves its first piece in tail[chunk] and its later pieces in head[chunk],
// and finalize2_kernel adds them in chunk order and applies the update. The summation order is
// fixed by the batch, so results are deterministic.
// A very long run (a zipf-hot id of a 100-id table over a 4-GPU global batch: ~330,000
// occurrences, 10,000 chunks; the zero "outside" row of a row-wise piece: every id of the other
// ranks' ranges) made the one warp of finalize2_kernel the step's tail (14.9 ms of a 30 ms step
// for row-wise emb.20, bench/RESULTS.md). So the chunks are also cut into groups of
// kGroupChunks: group_kernel sums, for each group whose chunks all lie inside one run (the run
// goes on across both of the group's ends), their head rows in chunk order into group[g], one
// warp a group, all groups at once; finalize2_kernel then adds group[g] in place of the group's
// kGroupChunks head rows where a whole group lies inside the run's chunks after its first. A run
// of fewer chunks sums exactly as before; the order stays fixed by the batch.
constexpr int kChunk = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kGroupChunks = 64;

// Gradient loads, widened to float (exact for bf16 and f16).
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load1(const __half* p) { return __half2float(*p); }

// ---- The backward kernels ----
//
// Many memory accesses in flight:
// - chunk_kernel2 loads the row's weights and accumulator before summing its gradient (their
//   latencies overlap instead of following each other), the gradient rows four at a time, and
//   uses float4 loads and stores for the row when V = 4.
// - finalize2_kernel gives the run that crosses chunk boundaries to the warp of the chunk where
//   it begins (found from the sorted ids alone: no run list), finds the run's last chunk by a warp-wide search over the chunks'
//   first ids, and adds its per-chunk partial rows in chunk order, kBatch of them loaded at once.
//   (A finalize walking a run of P chunks one load at a time made that warp the step's tail: a
//   row of a 3-row table occurs ~18,000 times per DCNv2 batch, 576 chunks.)
constexpr int kBatch = 16;

template <int V>
struct Vec {
  float v[V];
};
template <int V>
__device__ __forceinline__ Vec<V> ld_row(const float* p) {
  Vec<V> r;
  if constexpr (V == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    r.v[0] = x.x; r.v[1] = x.y; r.v[2] = x.z; r.v[3] = x.w;
  } else {
    r.v[0] = *p;
  }
  return r;
}
template <int V>
__device__ __forceinline__ void st_row(float* p, const Vec<V>& r) {
  if constexpr (V == 4)
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  else
    *p = r.v[0];
}
template <int V, class G>
__device__ __forceinline__ Vec<V> ld_grad(const G* p) {
  Vec<V> r;
  if constexpr (V == 4) {
    const float4 x = load4(p);
    r.v[0] = x.x; r.v[1] = x.y; r.v[2] = x.z; r.v[3] = x.w;
  } else {
    r.v[0] = load1(p);
  }
  return r;
}

// The optimizer step of one row slice on values already loaded (w, a: the row's weights and
// accumulator at k0): SGD, or Adagrad with the accumulator updated first.
template <int V>
__device__ __forceinline__ void apply_loaded(float* wp, float* ap, Vec<V> w, Vec<V> a, float* g,
                                             Update kind, float lr, float eps, float gs) {
  if (gs != 1.f) {
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] = __fmul_rn(g[j], gs);
  }
  if (kind == Update::SGD) {
#pragma unroll
    for (int j = 0; j < V; ++j) w.v[j] = __fsub_rn(w.v[j], __fmul_rn(lr, g[j]));
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      a.v[j] = __fadd_rn(a.v[j], __fmul_rn(g[j], g[j]));
      w.v[j] = __fsub_rn(w.v[j], __fdiv_rn(__fmul_rn(lr, g[j]), __fadd_rn(sqrtf(a.v[j]), eps)));
    }
    st_row<V>(ap, a);
  }
  st_row<V>(wp, w);
}

template <int V, class G>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    chunk_kernel2(Tables tab, const int32_t* __restrict__ offsets,
                  const uint32_t* __restrict__ keys_sorted, const int32_t* __restrict__ pos_sorted,
                  const int32_t* __restrict__ pos_bag, int64_t B, int64_t nnz, bool mean,
                  const G* __restrict__ dpooled, int64_t ld, Update kind,
                  const float* __restrict__ lr_p, float eps, float* __restrict__ head,
                  float* __restrict__ tail, const float* __restrict__ gscale_p) {
  const float lr = *lr_p;
  const float gs = gscale_p ? *gscale_p : 1.f;
  if (gs == 0.f) return;  // an overflowed step (loss scaling): no update
  __shared__ uint32_t sh_key[kWarpsPerBlock][kChunk];
  __shared__ int32_t sh_b[kWarpsPerBlock][kChunk];  // sample of the id (bag - t * B)
  __shared__ int32_t sh_t[kWarpsPerBlock][kChunk];  // table of the id
  __shared__ float sh_scale[kWarpsPerBlock][kChunk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t c = blockIdx.x * int64_t(kWarpsPerBlock) + warp;
  const int64_t q_lo = c * kChunk;
  if (q_lo >= nnz) return;  // whole warp exits together
  const int n = static_cast<int>(nnz - q_lo < kChunk ? nnz - q_lo : kChunk);
  if (lane < n) {
    const uint32_t key = keys_sorted[q_lo + lane];
    const int32_t bag = pos_bag[pos_sorted[q_lo + lane]];
    const int32_t t = bag / static_cast<int32_t>(B);
    sh_key[warp][lane] = key;
    sh_t[warp][lane] = t;
    sh_b[warp][lane] = static_cast<int32_t>(bag - int64_t(t) * B);
    sh_scale[warp][lane] =
        mean ? 1.f / static_cast<float>(offsets[bag + 1] - offsets[bag]) : 1.f;
  }
  __syncwarp();
  const bool starts_before = q_lo > 0 && keys_sorted[q_lo - 1] == sh_key[warp][0];
  const bool continues_after = q_lo + n < nnz && keys_sorted[q_lo + n] == sh_key[warp][n - 1];
  const int d = tab.dim;
  for (int i = 0; i < n;) {
    const uint32_t key = sh_key[warp][i];
    int j = i + 1;
    while (j < n && sh_key[warp][j] == key) ++j;
    const int t0 = sh_t[warp][i];
    const bool first = i == 0 && starts_before;
    const bool last = j == n && continues_after;
    const bool apply = !(first || last);
    const int64_t row = int64_t(key - tab.row_base[t0]) * d;
    float* w = tab.weights[t0] + row;
    float* a = kind == Update::Adagrad ? tab.states[t0] + row : nullptr;
    const G* gcol = dpooled + int64_t(tab.col ? tab.col[t0] : t0) * d;
    // Two runs of one id each, both applied here (most rows of the large tables): the loads of
    // both rows issued together (0.561 ms against 0.569 one run at a time, bench/RESULTS.md).
    if (j == i + 1 && apply && i + 2 <= n) {
      const uint32_t key1 = sh_key[warp][i + 1];
      const bool single1 = i + 2 == n || sh_key[warp][i + 2] != key1;
      if (single1 && !(i + 2 == n && continues_after)) {
        const int t1 = sh_t[warp][i + 1];
        const int64_t row1 = int64_t(key1 - tab.row_base[t1]) * d;
        float* w1 = tab.weights[t1] + row1;
        float* a1 = kind == Update::Adagrad ? tab.states[t1] + row1 : nullptr;
        const G* g0p = gcol + sh_b[warp][i] * ld;
        const G* g1p =
            dpooled + int64_t(tab.col ? tab.col[t1] : t1) * d + sh_b[warp][i + 1] * ld;
        const float sc0 = sh_scale[warp][i], sc1 = sh_scale[warp][i + 1];
        for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
          const Vec<V> w0v = ld_row<V>(w + k0), w1v = ld_row<V>(w1 + k0);
          Vec<V> a0v{}, a1v{};
          if (a) {
            a0v = ld_row<V>(a + k0);
            a1v = ld_row<V>(a1 + k0);
          }
          const Vec<V> x0 = ld_grad<V>(g0p + k0), x1 = ld_grad<V>(g1p + k0);
          float g0[V], g1[V];
#pragma unroll
          for (int v = 0; v < V; ++v) {  // as the general path: 0 + scale * x
            g0[v] = __fadd_rn(0.f, __fmul_rn(sc0, x0.v[v]));
            g1[v] = __fadd_rn(0.f, __fmul_rn(sc1, x1.v[v]));
          }
          apply_loaded<V>(w + k0, a ? a + k0 : nullptr, w0v, a0v, g0, kind, lr, eps, gs);
          apply_loaded<V>(w1 + k0, a1 ? a1 + k0 : nullptr, w1v, a1v, g1, kind, lr, eps, gs);
        }
        i += 2;
        continue;
      }
    }
    for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
      Vec<V> wv{}, av{};
      if (apply) {  // in flight while the gradient rows load
        wv = ld_row<V>(w + k0);
        if (a) av = ld_row<V>(a + k0);
      }
      float g[V];
#pragma unroll
      for (int v = 0; v < V; ++v) g[v] = 0.f;
      int q = i;
      for (; q + 4 <= j; q += 4) {
        Vec<V> x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) x[u] = ld_grad<V>(gcol + sh_b[warp][q + u] * ld + k0);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float sc = sh_scale[warp][q + u];
#pragma unroll
          for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], __fmul_rn(sc, x[u].v[v]));
        }
      }
      for (; q < j; ++q) {
        const Vec<V> x = ld_grad<V>(gcol + sh_b[warp][q] * ld + k0);
        const float sc = sh_scale[warp][q];
#pragma unroll
        for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], __fmul_rn(sc, x.v[v]));
      }
      if (apply) {
        apply_loaded<V>(w + k0, a ? a + k0 : nullptr, wv, av, g, kind, lr, eps, gs);
      } else {
        Vec<V> p;
#pragma unroll
        for (int v = 0; v < V; ++v) p.v[v] = g[v];
        st_row<V>((first ? head : tail) + c * d + k0, p);
      }
    }
    i = j;
  }
}

// s[v] += rows cc .. cc + kBatch - 1 of `rows` (d floats apart) at columns k0 .. k0 + V - 1,
// in row order (all kBatch rows loaded first, so their loads overlap).
template <int V>
__device__ __forceinline__ void add_rows(const float* __restrict__ rows, int64_t cc, int d,
                                         int k0, float* s) {
  Vec<V> x[kBatch];
#pragma unroll
  for (int u = 0; u < kBatch; ++u) x[u] = ld_row<V>(rows + (cc + u) * d + k0);
#pragma unroll
  for (int u = 0; u < kBatch; ++u)
#pragma unroll
    for (int v = 0; v < V; ++v) s[v] = __fadd_rn(s[v], x[u].v[v]);
}

// group[g] = head[g * G] + ... + head[g * G + G - 1] (G = kGroupChunks, in that order) for every
// group g >= 1 whose chunks lie inside one run: the id before the group's first and the group's
// last id are the same (the ids are sorted), the group's chunks all full. One warp a group.
template <int V>
__global__ void __launch_bounds__(256)
    group_kernel(const uint32_t* __restrict__ keys_sorted, int64_t nnz, int d,
                 const float* __restrict__ head, float* __restrict__ group) {
  const int64_t g = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t c0 = g * kGroupChunks;
  const int64_t q0 = c0 * kChunk, q1 = (c0 + kGroupChunks) * kChunk;  // [q0, q1): its ids
  if (g == 0 || q1 > nnz) return;
  if (keys_sorted[q0 - 1] != keys_sorted[q1 - 1]) return;
  for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
    float s[V];
#pragma unroll
    for (int v = 0; v < V; ++v) s[v] = 0.f;
    for (int64_t cc = c0; cc < c0 + kGroupChunks; cc += kBatch) add_rows<V>(head, cc, d, k0, s);
    Vec<V> r;
#pragma unroll
    for (int v = 0; v < V; ++v) r.v[v] = s[v];
    st_row<V>(group + g * d + k0, r);
  }
}
static_assert(kGroupChunks % kBatch == 0, "group_kernel loads kBatch head rows at a time");

template <int V>
__global__ void __launch_bounds__(256)
    finalize2_kernel(Tables tab, const uint32_t* __restrict__ keys_sorted,
                     const int32_t* __restrict__ pos_sorted, const int32_t* __restrict__ pos_bag,
                     int64_t B, int64_t nnz, Update kind, const float* __restrict__ lr_p,
                     float eps, const float* __restrict__ head, const float* __restrict__ tail,
                     const float* __restrict__ group, const float* __restrict__ gscale_p) {
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t nch = (nnz + kChunk - 1) / kChunk;
  if (c + 1 >= nch) return;  // the last chunk: nothing continues past it
  const int64_t q_lo = c * kChunk, q_last = q_lo + kChunk - 1;  // chunk c is full
  const uint32_t key = keys_sorted[q_last];
  if (keys_sorted[q_last + 1] != key) return;  // no run continues past chunk c
  if (q_lo > 0 && keys_sorted[q_lo] == key && keys_sorted[q_lo - 1] == key)
    return;  // the run began in an earlier chunk, whose warp adds it up
  const float gs = gscale_p ? *gscale_p : 1.f;
  if (gs == 0.f) return;
  // The run's last chunk ce: the last chunk whose first id is `key` (chunk c + 1's is; the ids
  // are sorted, so "first id == key" holds for c + 1 .. ce and for no later chunk). The warp
  // tests 32 chunks at once, `stride` apart; strides grow by 32x, then shrink by 32x.
  int64_t ce = c + 1, stride = 1;
  for (;;) {
    const int64_t jc = ce + (lane + 1) * stride;
    const bool in = jc < nch && keys_sorted[jc * kChunk] == key;
    const int cnt = __popc(__ballot_sync(0xffffffffu, in));  // lanes 0 .. cnt-1 hold
    ce += cnt * stride;
    if (cnt == 32) {
      stride *= 32;
    } else if (stride == 1) {
      break;
    } else {
      stride /= 32;
    }
  }
  const float lr = *lr_p;
  const int d = tab.dim;
  const int t0 = pos_bag[pos_sorted[q_last]] / static_cast<int32_t>(B);
  const int64_t row = int64_t(key - tab.row_base[t0]) * d;
  float* w = tab.weights[t0] + row;
  float* a = kind == Update::Adagrad ? tab.states[t0] + row : nullptr;
  for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
    Vec<V> wv = ld_row<V>(w + k0), av{};
    if (a) av = ld_row<V>(a + k0);
    const Vec<V> t = ld_row<V>(tail + c * d + k0);
    float g[V];
#pragma unroll
    for (int v = 0; v < V; ++v) g[v] = t.v[v];
    int64_t cc = c + 1;
    // Up to the first group boundary, then whole groups inside the run (chunks cc .. cc + G - 1
    // all before ce, so all full and all the run's: group_kernel summed them), then the rest.
    const int64_t gfirst = (cc + kGroupChunks - 1) / kGroupChunks * kGroupChunks;
    if (gfirst + kGroupChunks < ce) {
      for (; cc < gfirst; ++cc) {
        const Vec<V> x = ld_row<V>(head + cc * d + k0);
#pragma unroll
        for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], x.v[v]);
      }
      for (; cc + kGroupChunks < ce; cc += kGroupChunks) {
        const Vec<V> x = ld_row<V>(group + (cc / kGroupChunks) * d + k0);
#pragma unroll
        for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], x.v[v]);
      }
    }
    for (; cc + kBatch <= ce + 1; cc += kBatch) add_rows<V>(head, cc, d, k0, g);
    for (; cc <= ce; ++cc) {
      const Vec<V> x = ld_row<V>(head + cc * d + k0);
#pragma unroll
      for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], x.v[v]);
    }
    apply_loaded<V>(w + k0, a ? a + k0 : nullptr, wv, av, g, kind, lr, eps, gs);
  }
}

size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

size_t cub_bytes_for(int64_t n, int key_bits) {
  size_t sort_b = 0;
  DLREC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_b, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, key_bits));
  return sort_b;
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
template <class P>
bool vec4_ok(const P* p, int d, int64_t ld) {
  return d % 4 == 0 && ld % 4 == 0 && reinterpret_cast<uintptr_t>(p) % (4 * sizeof(P)) == 0;
}

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

int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

size_t scratch_bytes(int64_t n, int key_bits, int dim) {
  n = n < 1 ? 1 : n;
  return align_up(n * 4) * 4 + align_up(cub_bytes_for(n, key_bits)) +
         2 * align_up(sizeof(float) * num_chunks(n) * dim) +
         align_up(sizeof(float) * (num_chunks(n) / kGroupChunks + 1) * dim);
}

Scratch carve(void* base, int64_t n, int key_bits, int dim) {
  n = n < 1 ? 1 : n;
  Scratch s;
  char* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += align_up(bytes);
    return r;
  };
  s.pos_bag = reinterpret_cast<int32_t*>(take(n * 4));
  s.keys_sorted = reinterpret_cast<uint32_t*>(take(n * 4));
  s.iota = reinterpret_cast<int32_t*>(take(n * 4));
  s.pos_sorted = reinterpret_cast<int32_t*>(take(n * 4));
  s.cub_bytes = cub_bytes_for(n, key_bits);
  s.cub_temp = take(s.cub_bytes);
  s.head = reinterpret_cast<float*>(take(sizeof(float) * num_chunks(n) * dim));
  s.tail = reinterpret_cast<float*>(take(sizeof(float) * num_chunks(n) * dim));
  s.group = reinterpret_cast<float*>(take(sizeof(float) * (num_chunks(n) / kGroupChunks + 1) * dim));
  s.dim = dim;
  s.capacity = n;
  return s;
}

void prepare(const Scratch& s, cudaStream_t stream) {
  iota_kernel<<<grid_for(s.capacity, 256), 256, 0, stream>>>(s.iota, s.capacity);
  DLREC_CUDA_LAUNCH_CHECK();
}

void backward_ids(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
                  int64_t nnz, int key_bits, const Scratch& s, cudaStream_t stream) {
  if (nnz == 0) return;
  DLREC_CHECK(nnz <= s.capacity, "embedding backward: ", nnz, " ids exceed the scratch for ",
              s.capacity);
  const int64_t bags = B * tab.num_tables;
  bag_of_kernel<<<grid_for(bags, 256), 256, 0, stream>>>(offsets, bags, s.pos_bag);
  DLREC_CUDA_LAUNCH_CHECK();
  size_t tb = s.cub_bytes;
  DLREC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.cub_temp, tb, keys, s.keys_sorted, s.iota,
                                                   s.pos_sorted, nnz, 0, key_bits, stream));
}

template <class G>
void backward_apply(const Tables& tab, const int32_t* offsets, int64_t B, int64_t nnz, bool mean,
                    const G* dpooled, int64_t ld, Update kind, const float* lr, float eps,
                    const Scratch& s, cudaStream_t stream, const float* gscale) {
  if (nnz == 0) return;
  DLREC_CHECK(nnz <= s.capacity, "embedding backward: ", nnz, " ids exceed the scratch for ",
              s.capacity);
  DLREC_CHECK(tab.dim == s.dim, "embedding backward: scratch carved for dim ", s.dim, ", tables have ",
              tab.dim);
  const int64_t width = int64_t(tab.num_tables) * tab.dim;
  if (ld == 0) ld = width;
  DLREC_CHECK(ld >= width, "embedding backward: row stride ", ld, " is below the ", width,
              " pooled columns");
  const int64_t chunk_blocks = (num_chunks(nnz) + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // A warp per chunk in both kernels; float4 lanes where the widths and the base allow, else
  // scalar lanes.
  const unsigned fin_blocks = static_cast<unsigned>((num_chunks(nnz) * 32 + 255) / 256);
  auto launch = [&](auto lanes) {
    constexpr int V = decltype(lanes)::value;
    chunk_kernel2<V, G><<<static_cast<unsigned>(chunk_blocks), 32 * kWarpsPerBlock, 0, stream>>>(
        tab, offsets, s.keys_sorted, s.pos_sorted, s.pos_bag, B, nnz, mean, dpooled, ld, kind, lr,
        eps, s.head, s.tail, gscale);
    DLREC_CUDA_LAUNCH_CHECK();
    const int64_t groups = num_chunks(nnz) / kGroupChunks;  // whole groups only
    if (groups > 1) {
      group_kernel<V><<<static_cast<unsigned>((groups * 32 + 255) / 256), 256, 0, stream>>>(
          s.keys_sorted, nnz, tab.dim, s.head, s.group);
      DLREC_CUDA_LAUNCH_CHECK();
    }
    finalize2_kernel<V><<<fin_blocks, 256, 0, stream>>>(tab, s.keys_sorted, s.pos_sorted,
                                                        s.pos_bag, B, nnz, kind, lr, eps, s.head,
                                                        s.tail, s.group, gscale);
    DLREC_CUDA_LAUNCH_CHECK();
  };
  if (vec4_ok(dpooled, tab.dim, ld)) launch(std::integral_constant<int, 4>());
  else launch(std::integral_constant<int, 1>());
}
template void backward_apply<float>(const Tables&, const int32_t*, int64_t, int64_t, bool,
                                    const float*, int64_t, Update, const float*, float,
                                    const Scratch&, cudaStream_t, const float*);
template void backward_apply<__nv_bfloat16>(const Tables&, const int32_t*, int64_t, int64_t, bool,
                                            const __nv_bfloat16*, int64_t, Update, const float*,
                                            float, const Scratch&, cudaStream_t, const float*);
template void backward_apply<__half>(const Tables&, const int32_t*, int64_t, int64_t, bool,
                                     const __half*, int64_t, Update, const float*, float,
                                     const Scratch&, cudaStream_t, const float*);

void backward_update(const Tables& tab, const int32_t* offsets, const uint32_t* keys, int64_t B,
                     int64_t nnz, bool mean, const float* dpooled, Update kind, const float* lr,
                     float eps, int key_bits, const Scratch& s, cudaStream_t stream,
                     const float* gscale) {
  backward_ids(tab, offsets, keys, B, nnz, key_bits, s, stream);
  backward_apply(tab, offsets, B, nnz, mean, dpooled, 0, kind, lr, eps, s, stream, gscale);
}

}  // namespace dlrec::nn::cuda_emb
