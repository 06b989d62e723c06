// The data-parallel embedding exchange's kernels (embedding_dp_cuda.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cub/device/device_scan.cuh>
#include <type_traits>

#include "core/cuda_check.h"
#include "dlrec/core/error.h"
#include "model/layers/embedding_dp_cuda.h"

namespace dlrec::model::gpu_graph::dp {
namespace {

// Global bag gb = k * G + row of table t = tables[k] (tables null: t = k): its length and where
// its keys start in the gathered keys.
__global__ void bag_lengths(RankGeometry g, const int32_t* __restrict__ tables, int64_t K,
                            const int32_t* __restrict__ off_in, int32_t* __restrict__ lens,
                            int64_t* __restrict__ src) {
  const int64_t bags = K * g.global_rows;
  for (int64_t gb = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gb < bags;
       gb += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = gb / g.global_rows, row = gb - k * g.global_rows;
    const int64_t t = tables ? tables[k] : k;
    int r = 0;
    while (r + 1 < g.ranks && row >= g.row_begin[r + 1]) ++r;
    const int64_t b = row - g.row_begin[r];
    const int32_t* o = off_in + g.off_begin[r] + t * g.rows[r] + b;
    lens[gb] = o[1] - o[0];
    src[gb] = g.key_begin[r] + (o[0] - off_in[g.off_begin[r]]);
  }
}

// The bags' keys; with a cap, table k's keys above cap[k] become cap[k].
__global__ void copy_keys(int64_t bags, int64_t rows, const int32_t* __restrict__ off_g,
                          const int64_t* __restrict__ src, const uint32_t* __restrict__ keys_in,
                          const uint32_t* __restrict__ cap, uint32_t* __restrict__ keys_g) {
  for (int64_t gb = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gb < bags;
       gb += int64_t(gridDim.x) * blockDim.x) {
    const int32_t begin = off_g[gb], n = off_g[gb + 1] - begin;
    const uint32_t* from = keys_in + src[gb];
    const uint32_t c = cap ? cap[gb / rows] : 0xFFFFFFFFu;
    for (int32_t i = 0; i < n; ++i) keys_g[begin + i] = min(from[i], c);
  }
}

// out[j * B + b] = off[t * B + b] - off[t * B] + (ids of sel[0..j)), t = sel[j]; out[S * B] =
// the ids of all S tables.
__global__ void compact_offsets(const int32_t* __restrict__ off, int64_t B,
                                const int32_t* __restrict__ sel, int64_t S,
                                int32_t* __restrict__ out) {
  const int64_t n = S * B + 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = B > 0 && i / B < S ? i / B : S;
    int32_t base = 0;
    for (int64_t k = 0; k < j; ++k) base += off[(sel[k] + 1) * B] - off[sel[k] * B];
    if (j == S) {
      out[i] = base;
      continue;
    }
    const int64_t t = sel[j], b = i - j * B;
    out[i] = off[t * B + b] - off[t * B] + base;
  }
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535)); }

}  // namespace

size_t scan_bytes(int64_t bags) {
  size_t bytes = 0;
  DLREC_CUDA_CHECK(cub::DeviceScan::InclusiveSum(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int>(std::max<int64_t>(bags, 1))));
  return bytes;
}

RankGeometry gathered_geometry(const std::vector<int64_t>& rows, const std::vector<int64_t>& keys,
                               int64_t S, std::vector<int64_t>* off_counts,
                               std::vector<int64_t>* key_counts) {
  const int n = static_cast<int>(rows.size());
  DLREC_CHECK(n >= 1 && n <= kMaxRanks && keys.size() == rows.size(), "data-parallel exchange: ", n,
              " ranks (1 to ", kMaxRanks, ")");
  RankGeometry g;
  g.ranks = n;
  g.tables = S;
  off_counts->assign(n, 0);
  key_counts->assign(n, 0);
  int64_t row = 0, offs = 0, key = 0;
  for (int r = 0; r < n; ++r) {
    g.rows[r] = rows[r];
    g.row_begin[r] = row;
    g.off_begin[r] = offs;
    g.key_begin[r] = key;
    (*off_counts)[r] = S * rows[r] + 1;
    (*key_counts)[r] = keys[r];
    row += rows[r];
    offs += (*off_counts)[r];
    key += keys[r];
  }
  g.global_rows = row;
  return g;
}

void compact_ids(const int32_t* off, const uint32_t* keys, int64_t B,
                 const std::vector<int64_t>& sel, const int32_t* sel_dev, const int64_t* nnz,
                 int32_t* off_out, uint32_t* keys_out, cudaStream_t stream) {
  const int64_t S = static_cast<int64_t>(sel.size());
  compact_offsets<<<blocks_for(S * B + 1), 256, 0, stream>>>(off, B, sel_dev, S, off_out);
  DLREC_CUDA_LAUNCH_CHECK();
  // The keys: one copy per run of consecutive selected tables.
  int64_t at = 0, start = 0, t = 0;  // start: where table t's keys begin
  for (size_t j = 0; j < sel.size();) {
    for (; t < sel[j]; ++t) start += nnz[t];
    int64_t n = 0;
    for (; j < sel.size() && sel[j] == t; ++j, ++t) n += nnz[t];
    if (n > 0)
      DLREC_CUDA_CHECK(cudaMemcpyAsync(keys_out + at, keys + start, n * sizeof(uint32_t),
                                       cudaMemcpyDeviceToDevice, stream));
    at += n;
    start += n;
  }
}

void build_global_bags(const RankGeometry& g, const int32_t* off_in, const uint32_t* keys_in,
                       int32_t* off_g, uint32_t* keys_g, int32_t* lens, int64_t* src, void* temp,
                       size_t temp_bytes, cudaStream_t stream) {
  build_table_bags(g, nullptr, g.tables, off_in, keys_in, off_g, keys_g, lens, src, temp,
                   temp_bytes, stream);
}

void build_table_bags(const RankGeometry& g, const int32_t* tables, int64_t K,
                      const int32_t* off_in, const uint32_t* keys_in, int32_t* off_g,
                      uint32_t* keys_g, int32_t* lens, int64_t* src, void* temp, size_t temp_bytes,
                      cudaStream_t stream, const uint32_t* cap) {
  const int64_t bags = K * g.global_rows;
  DLREC_CHECK(bags < (int64_t{1} << 31), "data-parallel embedding: ", bags,
              " bags in the global batch (int32 offsets)");
  DLREC_CUDA_CHECK(cudaMemsetAsync(off_g, 0, sizeof(int32_t), stream));
  if (bags == 0) return;
  bag_lengths<<<blocks_for(bags), 256, 0, stream>>>(g, tables, K, off_in, lens, src);
  DLREC_CUDA_LAUNCH_CHECK();
  size_t bytes = temp_bytes;
  DLREC_CUDA_CHECK(
      cub::DeviceScan::InclusiveSum(temp, bytes, lens, off_g + 1, static_cast<int>(bags), stream));
  copy_keys<<<blocks_for(bags), 256, 0, stream>>>(bags, g.global_rows, off_g, src, keys_in, cap,
                                                  keys_g);
  DLREC_CUDA_LAUNCH_CHECK();
}

namespace {

// One exchange position p per blockIdx.y, its B rows of width[p] values in vectors V (per =
// sizeof(V) / sizeof(T) values each) over x: the element (p, b, c) lies at B * first[p] +
// b * count[p] + index[p] + c in the exchange blocks and at b * ld + col[p] + c in the activation.
template <class T, class V, bool kToOut>
__global__ void tw_copy(TwLayout l, int64_t B, const T* __restrict__ from, T* __restrict__ to,
                        int64_t ld) {
  constexpr int per = sizeof(V) / sizeof(T);
  const int p = blockIdx.y;
  const int64_t vd = l.width[p] / per, n = B * vd;
  const int64_t first = l.first[p], count = l.count[p], index = l.index[p], col = l.col[p];
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = j / vd, c = (j - b * vd) * per;
    const int64_t blk = B * first + b * count + index + c;
    const int64_t act = b * ld + col + c;
    if (kToOut)
      *reinterpret_cast<V*>(to + act) = *reinterpret_cast<const V*>(from + blk);
    else
      *reinterpret_cast<V*>(to + blk) = *reinterpret_cast<const V*>(from + act);
  }
}

// 16-byte vectors where every field, row and pointer allows them, else one value at a time.
template <class T, bool kToOut>
void launch_tw_copy(const TwLayout& l, int64_t B, const T* from, T* to, int64_t ld,
                    cudaStream_t stream) {
  if (l.positions == 0 || B == 0) return;
  DLREC_CHECK(l.positions <= 65535, "embedding exchange: ", l.positions,
              " positions (at most 65535)");
  constexpr int64_t kPer = 16 / sizeof(T);
  const bool vec = l.unit % kPer == 0 && ld % kPer == 0 &&
                   reinterpret_cast<uintptr_t>(from) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(to) % 16 == 0;
  const int64_t per = vec ? kPer : 1;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((B * (l.max_width / per) + 255) / 256, 4096)),
      static_cast<unsigned>(l.positions));
  if (vec)
    tw_copy<T, int4, kToOut><<<grid, 256, 0, stream>>>(l, B, from, to, ld);
  else
    tw_copy<T, T, kToOut><<<grid, 256, 0, stream>>>(l, B, from, to, ld);
  DLREC_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void scatter_pooled(const TwLayout& l, int64_t B, const T* recv, T* out, int64_t ld,
                    cudaStream_t stream) {
  launch_tw_copy<T, true>(l, B, recv, out, ld, stream);
}

template <class T>
void gather_grads(const TwLayout& l, int64_t B, const T* grad, int64_t ld, T* send,
                  cudaStream_t stream) {
  launch_tw_copy<T, false>(l, B, grad, send, ld, stream);
}

namespace {

__device__ inline void store_rounded(float x, __nv_bfloat16* y) { *y = __float2bfloat16_rn(x); }
__device__ inline void store_rounded(float x, __half* y) { *y = __float2half_rn(x); }

// gather_grads with an f32 source and a 16-bit destination, V values per thread: V = 1 (the
// reads of a warp are 128 contiguous bytes of one row's table columns), or V = 8 (two 16-byte
// reads, one 16-byte write, an eighth of the index arithmetic) where every field, the row and
// both pointers allow it. The same values and rounding either way.
template <int V, class To>
__global__ void tw_gather_rounded(TwLayout l, int64_t B, const float* __restrict__ from,
                                  To* __restrict__ to, int64_t ld) {
  const int p = blockIdx.y;
  const int64_t vd = l.width[p] / V, n = B * vd;
  const int64_t first = l.first[p], count = l.count[p], index = l.index[p], col = l.col[p];
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n;
       j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = j / vd, c = (j - b * vd) * V;
    const float* src = from + b * ld + col + c;
    To* dst = to + B * first + b * count + index + c;
    if constexpr (V == 1) {
      store_rounded(*src, dst);
    } else {
      const float4 u = reinterpret_cast<const float4*>(src)[0];
      const float4 v = reinterpret_cast<const float4*>(src)[1];
      const float x[8] = {u.x, u.y, u.z, u.w, v.x, v.y, v.z, v.w};
      alignas(16) To y[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) store_rounded(x[k], y + k);
      *reinterpret_cast<int4*>(dst) = *reinterpret_cast<const int4*>(y);
    }
  }
}

}  // namespace

template <class To>
void gather_grads_rounded(const TwLayout& l, int64_t B, const float* grad, int64_t ld, To* send,
                          cudaStream_t stream) {
  if (l.positions == 0 || B == 0) return;
  DLREC_CHECK(l.positions <= 65535, "embedding exchange: ", l.positions,
              " positions (at most 65535)");
  const bool vec = l.unit % 8 == 0 && ld % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(grad) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(send) % 16 == 0;
  const int64_t per = vec ? 8 : 1;
  const dim3 grid(
      static_cast<unsigned>(std::min<int64_t>((B * (l.max_width / per) + 255) / 256, 4096)),
      static_cast<unsigned>(l.positions));
  if (vec)
    tw_gather_rounded<8, To><<<grid, 256, 0, stream>>>(l, B, grad, send, ld);
  else
    tw_gather_rounded<1, To><<<grid, 256, 0, stream>>>(l, B, grad, send, ld);
  DLREC_CUDA_LAUNCH_CHECK();
}
template void gather_grads_rounded<__nv_bfloat16>(const TwLayout&, int64_t, const float*, int64_t,
                                                  __nv_bfloat16*, cudaStream_t);
template void gather_grads_rounded<__half>(const TwLayout&, int64_t, const float*, int64_t, __half*,
                                           cudaStream_t);

namespace {

__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float widen(__half x) { return __half2float(x); }

// G = float: g is the summed gradient itself, zeroed as it is read. G 16-bit: g is the rounded
// copy (round_dense zeroed the f32 gradient already) and stays as it is.
template <class G>
__global__ void dense_update_kernel(float* __restrict__ w, float* __restrict__ a, G* __restrict__ g,
                                    int64_t n, const float* __restrict__ lr_p, float eps) {
  const float lr = *lr_p;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float x = widen(g[i]);
    if (x == 0.f) continue;
    if constexpr (std::is_same_v<G, float>) g[i] = 0.f;
    if (!a) {
      w[i] = __fsub_rn(w[i], __fmul_rn(lr, x));
    } else {
      const float acc = __fadd_rn(a[i], __fmul_rn(x, x));
      a[i] = acc;
      w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr, x), __fadd_rn(sqrtf(acc), eps)));
    }
  }
}

template <class To>
__global__ void round_dense_kernel(float* __restrict__ g, To* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float x = g[i];
    store_rounded(x, out + i);
    if (x != 0.f) g[i] = 0.f;
  }
}

unsigned dense_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 8192));
}

}  // namespace

template <class G>
void dense_update(float* w, float* a, G* g, int64_t n, const float* lr, float eps,
                  cudaStream_t stream) {
  if (n == 0) return;
  dense_update_kernel<G><<<dense_blocks(n), 256, 0, stream>>>(w, a, g, n, lr, eps);
  DLREC_CUDA_LAUNCH_CHECK();
}
template void dense_update<float>(float*, float*, float*, int64_t, const float*, float,
                                  cudaStream_t);
template void dense_update<__nv_bfloat16>(float*, float*, __nv_bfloat16*, int64_t, const float*,
                                          float, cudaStream_t);
template void dense_update<__half>(float*, float*, __half*, int64_t, const float*, float,
                                   cudaStream_t);

template <class To>
void round_dense(float* g, To* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_dense_kernel<To><<<dense_blocks(n), 256, 0, stream>>>(g, out, n);
  DLREC_CUDA_LAUNCH_CHECK();
}
template void round_dense<__nv_bfloat16>(float*, __nv_bfloat16*, int64_t, cudaStream_t);
template void round_dense<__half>(float*, __half*, int64_t, cudaStream_t);

#define DLREC_TW_INSTANTIATE(T)                                                                   \
  template void scatter_pooled<T>(const TwLayout&, int64_t, const T*, T*, int64_t, cudaStream_t); \
  template void gather_grads<T>(const TwLayout&, int64_t, const T*, int64_t, T*, cudaStream_t);
DLREC_TW_INSTANTIATE(float)
DLREC_TW_INSTANTIATE(__nv_bfloat16)
DLREC_TW_INSTANTIATE(__half)
#undef DLREC_TW_INSTANTIATE

namespace {

// Padded global bag gp = k * n * bmax + r * bmax + b (rank r's row b) of table info[5k].
__global__ void row_bag_lengths(RankGeometry g, int64_t bmax, RwLayout l,
                                const int32_t* __restrict__ off_in, int32_t* __restrict__ lens,
                                int64_t* __restrict__ src) {
  const int64_t gp_rows = g.ranks * bmax, bags = l.K * gp_rows;
  for (int64_t gp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gp < bags;
       gp += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = gp / gp_rows, prow = gp - k * gp_rows;
    const int r = static_cast<int>(prow / bmax);
    const int64_t b = prow - r * bmax;
    if (b >= g.rows[r]) {
      lens[gp] = 0;
      src[gp] = 0;
      continue;
    }
    const int64_t t = l.info[5 * k];
    const int32_t* o = off_in + g.off_begin[r] + t * g.rows[r] + b;
    lens[gp] = o[1] - o[0];
    src[gp] = g.key_begin[r] + (o[0] - off_in[g.off_begin[r]]);
  }
}

__global__ void copy_row_keys(int64_t gp_rows, RwLayout l, const int32_t* __restrict__ off_g,
                              const int64_t* __restrict__ src, const uint32_t* __restrict__ keys_in,
                              uint32_t* __restrict__ keys_g) {
  const int64_t bags = l.K * gp_rows;
  for (int64_t gp = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gp < bags;
       gp += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = gp / gp_rows;
    const int64_t base = l.info[5 * k + 1], lo = l.info[5 * k + 2], hi = l.info[5 * k + 3],
                  local = l.info[5 * k + 4];
    const int32_t begin = off_g[gp], n = off_g[gp + 1] - begin;
    const uint32_t* from = keys_in + src[gp];
    for (int32_t i = 0; i < n; ++i) {
      const int64_t id = static_cast<int64_t>(from[i]) - base;
      keys_g[begin + i] =
          static_cast<uint32_t>(id >= lo && id < hi ? local + id - lo : local + hi - lo);
    }
  }
}

__device__ __forceinline__ uint64_t splitmix64_range(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// w[i] for i < n: element first + i of the whole table, or with width > 0 element
// (i / width) * dim + c0 + i % width (columns [c0, c0 + width) of rows dim wide).
__global__ void init_uniform_range_kernel(float* w, int64_t n, int64_t first, uint64_t seed,
                                          double a, int64_t dim, int64_t c0, int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = width > 0 ? i / width : 0;
    const uint64_t at =
        static_cast<uint64_t>(width > 0 ? r * dim + c0 + (i - r * width) : first + i);
    const double u =
        static_cast<double>(splitmix64_range(seed ^ splitmix64_range(at)) >> 11) * 0x1.0p-53;
    // As nn::cuda_emb::init_uniform: explicit rounding, no fused multiply-add.
    w[i] = static_cast<float>(__dadd_rn(-a, __dmul_rn(__dmul_rn(2.0, a), u)));
  }
}

}  // namespace

void build_row_bags(const RankGeometry& g, int64_t bmax, const RwLayout& l, const int32_t* off_in,
                    const uint32_t* keys_in, int32_t* off_g, uint32_t* keys_g, int32_t* lens,
                    int64_t* src, void* temp, size_t temp_bytes, cudaStream_t stream) {
  const int64_t gp_rows = g.ranks * bmax, bags = l.K * gp_rows;
  DLREC_CHECK(bags < (int64_t{1} << 31), "row-wise sharding: ", bags,
              " bags in the padded global batch (int32 offsets)");
  DLREC_CUDA_CHECK(cudaMemsetAsync(off_g, 0, sizeof(int32_t), stream));
  if (bags == 0) return;
  row_bag_lengths<<<blocks_for(bags), 256, 0, stream>>>(g, bmax, l, off_in, lens, src);
  DLREC_CUDA_LAUNCH_CHECK();
  size_t bytes = temp_bytes;
  DLREC_CUDA_CHECK(
      cub::DeviceScan::InclusiveSum(temp, bytes, lens, off_g + 1, static_cast<int>(bags), stream));
  copy_row_keys<<<blocks_for(bags), 256, 0, stream>>>(gp_rows, l, off_g, src, keys_in, keys_g);
  DLREC_CUDA_LAUNCH_CHECK();
}

void init_uniform_range(float* w, int64_t n, int64_t first, uint64_t seed, double a,
                        cudaStream_t stream) {
  if (n <= 0) return;
  init_uniform_range_kernel<<<blocks_for(n), 256, 0, stream>>>(w, n, first, seed, a, 0, 0, 0);
  DLREC_CUDA_LAUNCH_CHECK();
}

void init_uniform_cols(float* w, int64_t rows, int64_t dim, int64_t c0, int64_t width,
                       uint64_t seed, double a, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return;
  init_uniform_range_kernel<<<blocks_for(n), 256, 0, stream>>>(w, n, 0, seed, a, dim, c0, width);
  DLREC_CUDA_LAUNCH_CHECK();
}

}  // namespace dlrec::model::gpu_graph::dp
