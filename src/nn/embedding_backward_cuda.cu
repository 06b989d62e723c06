// CUDA embedding bags, the backward (nn/embedding_cuda.h): the batch's ids de-duplicated by a
// radix sort (stable, so each row's contributions are summed in order of occurrence, as on the
// CPU) and the optimizer applied to each distinct row in the same kernel.
//
// Kernels: chunk_kernel2 (two one-id runs updated together) + group_kernel + finalize2_kernel.
// They replaced simpler kernels with the same sums in the same order (bit-identical results;
// removed after the comparison, see git history and bench/RESULTS.md): on DCNv2's tables, one
// H100, 2026-11-22, backward 1.121 -> 0.670 ms (ids 0.128 -> 0.110, reduce + update 0.992 ->
// 0.561).
#include <cub/device/device_radix_sort.cuh>

#include <type_traits>

#include "core/cuda_check.h"
#include "nn/embedding_bags_cuda.cuh"
#include "nn/embedding_cuda.h"
#include "nn/half_cuda.cuh"
#include "nn/optimizer_math_cuda.cuh"

namespace dlrec::nn::cuda_emb {
namespace {

using half_cuda::grid_for;

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
// state at k0): SGD, or Adagrad with the accumulator updated first; MOM: SGD with momentum (a:
// the velocity, b = mu b + g, w -= lr b, Nesterov w -= lr (g + mu b), as nn::Optimizer's sgd).
template <int V, bool MOM = false>
__device__ __forceinline__ void apply_loaded(float* wp, float* ap, Vec<V> w, Vec<V> a, float* g,
                                             Update kind, float lr, float eps, float gs,
                                             float mu = 0.f, bool nesterov = false) {
  if (gs != 1.f) {
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] = __fmul_rn(g[j], gs);
  }
  if constexpr (MOM) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      w.v[j] = opt_math::momentum_value(g[j], w.v[j], a.v[j], mu, nesterov, lr);
    st_row<V>(ap, a);
  } else if (kind == Update::SGD) {
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

// Row-wise Adagrad (one accumulator per row, Update::RowWiseAdagrad) needs the row's whole
// gradient before any of it is applied: each lane keeps its slices of the row (slice s holds
// columns (s * 32 + lane) * V .. + V - 1; up to kRowSlices of them, so dim <= 32 * V *
// kRowSlices), the warp adds their squares in double (as the CPU's reference does, there in
// column order: the float result agrees but for a rounding tie) and the whole warp then applies
//   a += sum(g^2) / dim;  w -= (lr / (sqrt(a) + eps)) * g
// (nn/optimizer.cc, update_row). Every lane of the warp must call it (shuffles). The row's
// weights (wv) and accumulator (a_old) are loaded by the caller before it sums the gradient, so
// that their loads are in flight meanwhile.
constexpr int kRowSlices = 4;
static_assert(32 * 4 * kRowSlices == 512 && 32 * kRowSlices == 128,
              "nn::cuda_rowwise_max_dim (include/dlrec/nn/optimizer.h) states these limits");
template <int V>
__device__ __forceinline__ void load_row_slices(const float* w, int d, int lane,
                                                Vec<V> (&wv)[kRowSlices]) {
#pragma unroll
  for (int s = 0; s < kRowSlices; ++s)
    if ((s * 32 + lane) * V < d) wv[s] = ld_row<V>(w + (s * 32 + lane) * V);
}
template <int V>
__device__ __forceinline__ void apply_rowwise(float* w, float* a_row, float a_old,
                                              Vec<V> (&wv)[kRowSlices], float (&g)[kRowSlices][V],
                                              int d, int lane, float lr, float eps, float gs) {
  double sq = 0;
#pragma unroll
  for (int s = 0; s < kRowSlices; ++s) {
    if ((s * 32 + lane) * V >= d) continue;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (gs != 1.f) g[s][v] = __fmul_rn(g[s][v], gs);
      sq += static_cast<double>(g[s][v]) * g[s][v];
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const float a = __fadd_rn(a_old, static_cast<float>(sq / static_cast<double>(d)));
  __syncwarp();
  if (lane == 0) *a_row = a;
  const float mult = __fdiv_rn(lr, __fadd_rn(sqrtf(a), eps));
#pragma unroll
  for (int s = 0; s < kRowSlices; ++s) {
    const int k0 = (s * 32 + lane) * V;
    if (k0 >= d) continue;
#pragma unroll
    for (int v = 0; v < V; ++v) wv[s].v[v] = __fsub_rn(wv[s].v[v], __fmul_rn(mult, g[s][v]));
    st_row<V>(w + k0, wv[s]);
  }
}

// Adam (Update::Adam; nn::Optimizer's "adam" on sparse rows, each row with its own step count):
// a row's state is 2 * dim + 1 floats, m [dim], v [dim] and t (the CPU's layout; rows 2 * dim + 1
// apart, so m and v are read value by value). A warp updates a row: every lane reads the old t
// and takes the coefficients of the new one (adam_coef), updates its columns (apply_adam), and
// after the warp's last column lane 0 stores the new t (adam_finish: the warp synchronises first,
// so no lane reads the new t); the arithmetic is nn/optimizer_math_cuda.cuh's, the CPU's.
using opt_math::AdamCoef;
__device__ __forceinline__ AdamCoef adam_coef(const float* t_p, float lr, float b1, float b2) {
  return opt_math::adam_coef(*t_p, lr, b1, b2);
}
// Columns k0 .. k0 + V - 1 of a row: m_p, v_p its state there, w, mo, vo their loaded values.
template <int V>
__device__ __forceinline__ void apply_adam(float* wp, float* m_p, float* v_p, Vec<V> w,
                                           const float (&mo)[V], const float (&vo)[V], float* g,
                                           const AdamCoef& c, float b1, float b2, float eps,
                                           float gs) {
#pragma unroll
  for (int u = 0; u < V; ++u) {
    const float x = gs != 1.f ? __fmul_rn(g[u], gs) : g[u];
    float m = mo[u], v = vo[u];
    w.v[u] = opt_math::adam_value(x, w.v[u], m, v, c, b1, b2, eps);
    m_p[u] = m;
    v_p[u] = v;
  }
  st_row<V>(wp, w);
}
template <int V>
__device__ __forceinline__ void load_adam(const float* srow, int d, int k0, float (&mo)[V],
                                          float (&vo)[V]) {
#pragma unroll
  for (int u = 0; u < V; ++u) {
    mo[u] = srow[k0 + u];
    vo[u] = srow[d + k0 + u];
  }
}
__device__ __forceinline__ void adam_finish(float* t_p, const AdamCoef& c, int lane) {
  __syncwarp();
  if (lane == 0) *t_p = c.t;
}

// The update forms, instantiated apart (template parameter F of the kernels) so that the
// registers of one do not cost the others their occupancy: SGD and Adagrad (a runtime `kind`),
// row-wise Adagrad (a whole row a warp), Adam (its state read value by value), SGD with
// momentum (the plain form's code with apply_loaded's MOM step).
constexpr int kFormPlain = 0, kFormRowWise = 1, kFormAdam = 2, kFormMomentum = 3;

// g[v] = 0 + the sum over the run's ids q in [i, j) of scale[q] * x_q[k0 + v], in order (x_q:
// the gradient row of id q's sample, `b[q]` rows of `ld` into `gcol`), four rows in flight.
template <int V, class G>
__device__ __forceinline__ void sum_run(const G* gcol, const int32_t* b, const float* scale,
                                        int i, int j, int64_t ld, int k0, float* g) {
#pragma unroll
  for (int v = 0; v < V; ++v) g[v] = 0.f;
  int q = i;
  for (; q + 4 <= j; q += 4) {
    Vec<V> x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = ld_grad<V>(gcol + b[q + u] * ld + k0);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const float sc = scale[q + u];
#pragma unroll
      for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], __fmul_rn(sc, x[u].v[v]));
    }
  }
  for (; q < j; ++q) {
    const Vec<V> x = ld_grad<V>(gcol + b[q] * ld + k0);
    const float sc = scale[q];
#pragma unroll
    for (int v = 0; v < V; ++v) g[v] = __fadd_rn(g[v], __fmul_rn(sc, x.v[v]));
  }
}

// F: the update form (kFormPlain, kFormRowWise, kFormAdam).
template <int V, class G, int F>
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
    constexpr bool MOM = F == kFormMomentum;
    float* a = MOM || kind == Update::Adagrad ? tab.states[t0] + row : nullptr;
    const G* gcol = dpooled + int64_t(tab.col ? tab.col[t0] : t0) * d;
    if constexpr (F == kFormAdam) {
      float* srow = tab.states[t0] + int64_t(key - tab.row_base[t0]) * (2 * int64_t(d) + 1);
      AdamCoef co{};
      if (apply) co = adam_coef(srow + 2 * d, lr, tab.beta1, tab.beta2);
      for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
        Vec<V> wv{};
        float mo[V] = {}, vo[V] = {};
        if (apply) {  // in flight while the gradient rows load
          wv = ld_row<V>(w + k0);
          load_adam<V>(srow, d, k0, mo, vo);
        }
        float g[V];
        sum_run<V>(gcol, sh_b[warp], sh_scale[warp], i, j, ld, k0, g);
        if (apply) {
          apply_adam<V>(w + k0, srow + k0, srow + d + k0, wv, mo, vo, g, co, tab.beta1, tab.beta2,
                        eps, gs);
        } else {
          Vec<V> p;
#pragma unroll
          for (int u = 0; u < V; ++u) p.v[u] = g[u];
          st_row<V>((first ? head : tail) + c * d + k0, p);
        }
      }
      if (apply) adam_finish(srow + 2 * d, co, lane);
      i = j;
      continue;
    }
    if constexpr (F == kFormRowWise) {  // the run's sum in the same order, then the row
      float* a_row = tab.states[t0] + (key - tab.row_base[t0]);
      float a_old = 0.f;
      Vec<V> wv[kRowSlices];
      if (apply) {  // in flight while the gradient rows load
        a_old = *a_row;
        load_row_slices<V>(w, d, lane, wv);
      }
      float g[kRowSlices][V];
#pragma unroll
      for (int s = 0; s < kRowSlices; ++s) {
        const int k0 = (s * 32 + lane) * V;
#pragma unroll
        for (int v = 0; v < V; ++v) g[s][v] = 0.f;
        if (k0 >= d) continue;
        sum_run<V>(gcol, sh_b[warp], sh_scale[warp], i, j, ld, k0, g[s]);
        if (!apply) {
          Vec<V> p;
#pragma unroll
          for (int v = 0; v < V; ++v) p.v[v] = g[s][v];
          st_row<V>((first ? head : tail) + c * d + k0, p);
        }
      }
      if (apply) apply_rowwise<V>(w, a_row, a_old, wv, g, d, lane, lr, eps, gs);
      i = j;
      continue;
    }
    // Two runs of one id each, both applied here (most rows of the large tables): the loads of
    // both rows issued together (0.561 ms against 0.569 one run at a time, bench/RESULTS.md).
    if (j == i + 1 && apply && i + 2 <= n) {
      const uint32_t key1 = sh_key[warp][i + 1];
      const bool single1 = i + 2 == n || sh_key[warp][i + 2] != key1;
      if (single1 && !(i + 2 == n && continues_after)) {
        const int t1 = sh_t[warp][i + 1];
        const int64_t row1 = int64_t(key1 - tab.row_base[t1]) * d;
        float* w1 = tab.weights[t1] + row1;
        float* a1 = MOM || kind == Update::Adagrad ? tab.states[t1] + row1 : nullptr;
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
          apply_loaded<V, MOM>(w + k0, a ? a + k0 : nullptr, w0v, a0v, g0, kind, lr, eps, gs,
                               tab.momentum, tab.nesterov);
          apply_loaded<V, MOM>(w1 + k0, a1 ? a1 + k0 : nullptr, w1v, a1v, g1, kind, lr, eps, gs,
                               tab.momentum, tab.nesterov);
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
      sum_run<V>(gcol, sh_b[warp], sh_scale[warp], i, j, ld, k0, g);
      if (apply) {
        apply_loaded<V, MOM>(w + k0, a ? a + k0 : nullptr, wv, av, g, kind, lr, eps, gs,
                             tab.momentum, tab.nesterov);
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

template <int V, int F>
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
  constexpr bool MOM = F == kFormMomentum;
  float* a = MOM || kind == Update::Adagrad ? tab.states[t0] + row : nullptr;
  // The run's sum at columns k0 .. k0 + V - 1 into g: its tail piece, then the later chunks'
  // head pieces in chunk order (whole groups inside the run as group_kernel summed them: up to
  // the first group boundary, then whole groups of chunks cc .. cc + G - 1 all before ce, so
  // all full and all the run's, then the rest).
  auto run_sum = [&](int k0, float* g) {
    const Vec<V> t = ld_row<V>(tail + c * d + k0);
#pragma unroll
    for (int v = 0; v < V; ++v) g[v] = t.v[v];
    int64_t cc = c + 1;
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
  };
  if constexpr (F == kFormAdam) {
    float* srow = tab.states[t0] + int64_t(key - tab.row_base[t0]) * (2 * int64_t(d) + 1);
    const AdamCoef co = adam_coef(srow + 2 * d, lr, tab.beta1, tab.beta2);
    for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
      const Vec<V> wv = ld_row<V>(w + k0);
      float mo[V], vo[V];
      load_adam<V>(srow, d, k0, mo, vo);
      float g[V];
      run_sum(k0, g);
      apply_adam<V>(w + k0, srow + k0, srow + d + k0, wv, mo, vo, g, co, tab.beta1, tab.beta2, eps,
                    gs);
    }
    adam_finish(srow + 2 * d, co, lane);
    return;
  }
  if constexpr (F == kFormRowWise) {
    float* a_row = tab.states[t0] + (key - tab.row_base[t0]);
    const float a_old = *a_row;
    Vec<V> wv[kRowSlices];
    load_row_slices<V>(w, d, lane, wv);
    float g[kRowSlices][V];
#pragma unroll
    for (int s = 0; s < kRowSlices; ++s) {
#pragma unroll
      for (int v = 0; v < V; ++v) g[s][v] = 0.f;
      if ((s * 32 + lane) * V < d) run_sum((s * 32 + lane) * V, g[s]);
    }
    apply_rowwise<V>(w, a_row, a_old, wv, g, d, lane, lr, eps, gs);
    return;
  }
  for (int k0 = lane * V; k0 < d; k0 += 32 * V) {
    Vec<V> wv = ld_row<V>(w + k0), av{};
    if (a) av = ld_row<V>(a + k0);
    float g[V];
    run_sum(k0, g);
    apply_loaded<V, MOM>(w + k0, a ? a + k0 : nullptr, wv, av, g, kind, lr, eps, gs,
                         tab.momentum, tab.nesterov);
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
  const bool v4 = vec4_ok(dpooled, tab.dim, ld);
  DLREC_CHECK(kind != Update::RowWiseAdagrad || tab.dim <= 32 * (v4 ? 4 : 1) * kRowSlices,
              "embedding backward: row-wise Adagrad on CUDA takes rows of up to ",
              32 * (v4 ? 4 : 1) * kRowSlices, " values",
              v4 ? "" : " (the gradient cannot be read 4 values at a time here)",
              ", the tables have ", tab.dim);
  const int64_t chunk_blocks = (num_chunks(nnz) + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // A warp per chunk in both kernels; float4 lanes where the widths and the base allow, else
  // scalar lanes.
  const unsigned fin_blocks = static_cast<unsigned>((num_chunks(nnz) * 32 + 255) / 256);
  auto launch = [&](auto lanes, auto form) {
    constexpr int V = decltype(lanes)::value;
    constexpr int F = decltype(form)::value;
    chunk_kernel2<V, G, F><<<static_cast<unsigned>(chunk_blocks), 32 * kWarpsPerBlock, 0, stream>>>(
        tab, offsets, s.keys_sorted, s.pos_sorted, s.pos_bag, B, nnz, mean, dpooled, ld, kind, lr,
        eps, s.head, s.tail, gscale);
    DLREC_CUDA_LAUNCH_CHECK();
    const int64_t groups = num_chunks(nnz) / kGroupChunks;  // whole groups only
    if (groups > 1) {
      group_kernel<V><<<static_cast<unsigned>((groups * 32 + 255) / 256), 256, 0, stream>>>(
          s.keys_sorted, nnz, tab.dim, s.head, s.group);
      DLREC_CUDA_LAUNCH_CHECK();
    }
    finalize2_kernel<V, F><<<fin_blocks, 256, 0, stream>>>(tab, s.keys_sorted, s.pos_sorted,
                                                        s.pos_bag, B, nnz, kind, lr, eps, s.head,
                                                        s.tail, s.group, gscale);
    DLREC_CUDA_LAUNCH_CHECK();
  };
  using Plain = std::integral_constant<int, kFormPlain>;
  using RowWise = std::integral_constant<int, kFormRowWise>;
  using Adam = std::integral_constant<int, kFormAdam>;
  using Momentum = std::integral_constant<int, kFormMomentum>;
  auto with_form = [&](auto lanes) {
    if (kind == Update::RowWiseAdagrad) launch(lanes, RowWise());
    else if (kind == Update::Adam) launch(lanes, Adam());
    else if (kind == Update::Momentum) launch(lanes, Momentum());
    else launch(lanes, Plain());
  };
  if (v4) with_form(std::integral_constant<int, 4>());
  else with_form(std::integral_constant<int, 1>());
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
