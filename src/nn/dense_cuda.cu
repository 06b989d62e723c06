// CUDA kernels for the dense layers of the DLRM; see dense_cuda.h.
#include "nn/dense_cuda.h"

#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>

#include "core/cuda_check.h"
#include "nn/half_cuda.cuh"

namespace dlrec::nn::cuda_dense {
namespace {

int grid_for(int64_t n, int threads, int cap = 65536) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

using half_cuda::from_f;
using half_cuda::to_f;
using half_cuda::unpack8;

template <class H>
__global__ void to_half_kernel(const float* __restrict__ x, int64_t B, int64_t cols,
                               H* __restrict__ y, int64_t ld) {
  const int64_t n = B * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / ld, c = i - r * ld;
    y[i] = from_f<H>(c < cols ? x[r * cols + c] : 0.f);
  }
}

template <class E>
__global__ void bias_act_kernel(E* __restrict__ y, const E* __restrict__ b, int64_t n,
                                int64_t out, bool relu) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f(y[i]) + to_f(b[i % out]);
    y[i] = from_f<E>(relu ? fmaxf(v, 0.f) : v);
  }
}

// float4 version for out % 4 == 0 and fewer than 2^31 vectors (32-bit index arithmetic).
__global__ void bias_act4_kernel(float4* __restrict__ y, const float4* __restrict__ b, int n4,
                                 int out4, bool relu) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += gridDim.x * blockDim.x) {
    float4 v = y[i];
    const float4 c = b[i % out4];
    v.x += c.x; v.y += c.y; v.z += c.z; v.w += c.w;
    if (relu) {
      v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    }
    y[i] = v;
  }
}

// dz = dy masked (Mask::Y: y > 0; Mask::Bits: the ReLU bit of a cuBLASLt RELU_AUX epilogue, see
// relu_bit) and, per chunk of kBgradRows rows, the column sums of dz (Mask::None: of dy, no dz).
// block (32, 8) covers 32 columns of one chunk; thread (x, k) sums rows r0 + k, r0 + k + 8, ... in
// that order, then the 8 sums are added in k order: the order that mask_bgrad8_kernel keeps too.
constexpr int kBgradRows = 256;
enum class Mask { None, Y, Bits };

// The bit of row r, column c of a column-major bit matrix (cuBLASLt's ReLU mask of a [out, B]
// column-major output: one sample per column), `ld_bytes` = its leading dimension in bits / 8:
// bit c % 8 (least significant first) of byte r * ld_bytes + c / 8.
__device__ __forceinline__ bool relu_bit(const uint8_t* __restrict__ bits, int64_t ld_bytes,
                                         int64_t r, int c) {
  return (bits[r * ld_bytes + (c >> 3)] >> (c & 7)) & 1;
}

template <class E, Mask M>
__global__ void mask_bgrad_kernel(const E* __restrict__ dy, const E* __restrict__ y,
                                  const uint8_t* __restrict__ bits, int64_t bits_ld,
                                  E* __restrict__ dz, float* __restrict__ partial, int64_t B,
                                  int out) {
  __shared__ float red[8][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * kBgradRows;
  const int64_t r1 = min(B, r0 + kBgradRows);
  float acc = 0.f;
  if (col < out) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * out + col;
      float v = to_f(dy[i]);
      if constexpr (M != Mask::None) {
        const bool on = M == Mask::Y ? to_f(y[i]) > 0.f : relu_bit(bits, bits_ld, r, col);
        v = on ? v : 0.f;
        dz[i] = from_f<E>(v);
      }
      acc += v;
    }
  }
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < out) {
    float s = red[0][threadIdx.x];
    for (int k = 1; k < 8; ++k) s += red[k][threadIdx.x];
    partial[int64_t(blockIdx.y) * out + col] = s;
  }
}

// 16-bit E, out % 8 == 0, 16-byte aligned rows: the same pass with 8 adjacent columns per thread
// (16-byte loads and stores of dy, y and dz; one mask byte). Block (GX, 8) covers 8 * GX columns
// of one chunk; thread (x, k) sums the same rows in the same order as mask_bgrad_kernel, and the
// 8 row sums of a column are added in k order, so the partials are bit-identical to it. Rows are
// loaded 4 at a time (4 loads in flight per thread).
template <class E, Mask M>
__global__ void __launch_bounds__(256)
    mask_bgrad8_kernel(const E* __restrict__ dy, const E* __restrict__ y,
                       const uint8_t* __restrict__ bits, int64_t bits_ld,
                       E* __restrict__ dz, float* __restrict__ partial, int64_t B, int out) {
  __shared__ float red[8][8][33];  // [k][column within the group][x]
  const int g = blockIdx.x * blockDim.x + threadIdx.x;  // group of 8 columns
  const int col = g * 8;
  const int64_t r0 = int64_t(blockIdx.y) * kBgradRows;
  const int64_t r1 = min(B, r0 + kBgradRows);
  float acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  if (col < out) {
    const int64_t ld8 = out / 8;  // row stride in 16-byte vectors
    const uint4* dy8 = reinterpret_cast<const uint4*>(dy) + g;
    const uint4* y8 = reinterpret_cast<const uint4*>(y) + g;
    uint4* dz8 = reinterpret_cast<uint4*>(dz) + g;
    auto one = [&](int64_t r, const uint4& d, const uint4& yv, uint8_t m) {
      float v[8];
      unpack8(d, v, static_cast<const E*>(nullptr));
      if constexpr (M != Mask::None) {
        float yf[8];
        if constexpr (M == Mask::Y) unpack8(yv, yf, static_cast<const E*>(nullptr));
        union {
          uint4 u;
          E e[8];
        } o;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const bool on = M == Mask::Y ? yf[j] > 0.f : ((m >> j) & 1);
          v[j] = on ? v[j] : 0.f;
          o.e[j] = from_f<E>(v[j]);
        }
        dz8[r * ld8] = o.u;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += v[j];
    };
    int64_t r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {  // 4 rows r, r + 8, r + 16, r + 24
      uint4 d[4], yv[4];
      uint8_t m[4] = {0, 0, 0, 0};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int64_t rq = r + 8 * q;
        d[q] = dy8[rq * ld8];
        if constexpr (M == Mask::Y) yv[q] = y8[rq * ld8];
        if constexpr (M == Mask::Bits) m[q] = bits[rq * bits_ld + g];
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) one(r + 8 * q, d[q], yv[q], m[q]);
    }
    for (; r < r1; r += 8) {
      const uint4 d = dy8[r * ld8];
      uint4 yv{};
      uint8_t m = 0;
      if constexpr (M == Mask::Y) yv = y8[r * ld8];
      if constexpr (M == Mask::Bits) m = bits[r * bits_ld + g];
      one(r, d, yv, m);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) red[threadIdx.y][j][threadIdx.x] = acc[j];
  __syncthreads();
  // Thread (x, k) finishes column 8 * g + k of its group.
  if (col < out) {
    const int j = threadIdx.y;
    float s = red[0][j][threadIdx.x];
    for (int k = 1; k < 8; ++k) s += red[k][j][threadIdx.x];
    partial[int64_t(blockIdx.y) * out + col + j] = s;
  }
}

__global__ void sum_partials_kernel(const float* __restrict__ partial, int chunks, int out,
                                    float* __restrict__ db) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= out) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partial[int64_t(c) * out + col];
  db[col] = s;
}

template <class E>
__global__ void relu_mask_kernel(const E* __restrict__ dy, const E* __restrict__ y,
                                 E* __restrict__ dz, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dz[i] = to_f(y[i]) > 0.f ? dy[i] : from_f<E>(0.f);
}

// Row i, column j (j < i) of pair q of the strict lower triangle in row-major order.
__device__ __forceinline__ void pair_of(int q, int& i, int& j) {
  i = static_cast<int>((1.f + sqrtf(8.f * q + 1.f)) * 0.5f);
  while (i * (i - 1) / 2 > q) --i;
  while ((i + 1) * i / 2 <= q) ++i;
  j = q - i * (i - 1) / 2;
}

// Loads Z_b = [dense_b; emb_b] (n rows of d elements E) into shared memory as float, rows ld
// floats apart, with 16-byte loads issued back to back (the kernels are bound by memory
// latency otherwise). Requires d % (16 / sizeof(E)) == 0.
constexpr int kDotThreads = 128;
template <class E>
__device__ __forceinline__ void load_z(const E* __restrict__ zd, const E* __restrict__ ze, int n,
                                       int d, int ld, float* z) {
  constexpr int VW = 16 / sizeof(E);
  if (d % VW != 0) {  // unaligned rows: scalar loads
    for (int e = threadIdx.x; e < n * d; e += kDotThreads) {
      const int r = e / d, k = e - r * d;
      z[r * ld + k] = to_f(r == 0 ? zd[k] : ze[(r - 1) * d + k]);
    }
    return;
  }
  const int per_row = d / VW, nvec = n * per_row;
  constexpr int kUnroll = 4;
  for (int v0 = threadIdx.x; v0 < nvec; v0 += kDotThreads * kUnroll) {
    uint4 buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kDotThreads;
      if (v < nvec) {
        const int r = v / per_row, k = (v - r * per_row) * VW;
        const E* src = r == 0 ? zd + k : ze + (r - 1) * d + k;
        buf[u] = *reinterpret_cast<const uint4*>(src);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kDotThreads;
      if (v < nvec) {
        const int r = v / per_row, k = (v - r * per_row) * VW;
        const E* e = reinterpret_cast<const E*>(&buf[u]);
#pragma unroll
        for (int w = 0; w < VW; ++w) z[r * ld + k + w] = to_f(e[w]);
      }
    }
  }
}

// One block per sample; Z in shared memory with rows padded by one float (no bank conflicts
// between threads reading different rows at the same k).
template <class E>
__global__ void dot_forward_kernel(const E* __restrict__ dense, const E* __restrict__ emb, int T,
                                   int d, E* __restrict__ out, int64_t ld_out) {
  extern __shared__ float z[];
  const int64_t b = blockIdx.x;
  const int n = T + 1, ld = d + 1;
  const int64_t F = d + int64_t(n) * (n - 1) / 2;
  E* o = out + b * ld_out;
  load_z(dense + b * d, emb + b * int64_t(T) * d, n, d, ld, z);
  __syncthreads();
  for (int k = threadIdx.x; k < d; k += blockDim.x) o[k] = from_f<E>(z[k]);
  for (int64_t k = F + threadIdx.x; k < ld_out; k += blockDim.x) o[k] = from_f<E>(0.f);
  const int pairs = n * (n - 1) / 2;
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    int i, j;
    pair_of(q, i, j);
    const float* zi = z + i * ld;
    const float* zj = z + j * ld;
    float acc = 0.f;
    for (int k = 0; k < d; ++k) acc = __fadd_rn(acc, __fmul_rn(zi[k], zj[k]));
    o[d + q] = from_f<E>(acc);
  }
}

template <class E, class G>
__global__ void dot_backward_kernel(const E* __restrict__ dense, const E* __restrict__ emb,
                                    const E* __restrict__ dout, int64_t ld_out, int T, int d,
                                    bool relu_dense, E* __restrict__ d_dense,
                                    G* __restrict__ d_emb) {
  extern __shared__ float sm[];
  const int64_t b = blockIdx.x;
  const int n = T + 1, ld = d + 1;
  float* z = sm;
  float* g = sm + n * ld;  // [n, n] symmetric, zero diagonal
  const E* gb = dout + b * ld_out;
  load_z(dense + b * d, emb + b * int64_t(T) * d, n, d, ld, z);
  for (int e = threadIdx.x; e < n * n; e += blockDim.x) {
    const int i = e / n, j = e - i * n;
    float v = 0.f;
    if (j < i) v = to_f(gb[d + i * (i - 1) / 2 + j]);
    else if (i < j) v = to_f(gb[d + j * (j - 1) / 2 + i]);
    g[e] = v;
  }
  __syncthreads();
  // dZ_m = sum_{j != m} G_mj Z_j, j ascending (the CPU's order of accumulation).
  for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
    const int m = e / d, k = e - m * d;
    float acc = 0.f;
    for (int j = 0; j < n; ++j)
      if (j != m) acc = __fadd_rn(acc, __fmul_rn(g[m * n + j], z[j * ld + k]));
    if (m == 0) {
      float v = to_f(gb[k]) + acc;
      if (relu_dense && !(z[k] > 0.f)) v = 0.f;
      d_dense[b * d + k] = from_f<E>(v);
    } else {
      d_emb[(b * T + (m - 1)) * int64_t(d) + k] = from_f<G>(acc);
    }
  }
}

// 16-bit (bf16 or f16) dot interaction on tensor cores (WMMA 16x16x16, f32 accumulation), one
// warp per sample: Z (n <= 32 rows of d, d % 16 == 0) is staged in shared memory padded to 32 rows;
// forward S = Z Z^T on the tiles of the lower triangle; backward dZ = G Z with G the symmetric
// matrix of the pair gradients (zero diagonal), 16 rows at a time. The products of 16-bit values
// are exact and the sums are in f32, as in the CUDA-core kernels (only the order differs).
namespace wm = nvcuda::wmma;
constexpr int kWmmaWarps = 2;
constexpr int kSLd = 36;  // forward S tile row stride (floats)
constexpr int kGLd = 40;  // G row stride (16-bit elements)
__host__ __device__ inline int wmma_z_ld(int d) { return d + 8; }
// Shared memory per warp: Z, then the forward's S tile or the backward's G and dZ rows (the
// backward also stages the sample's output gradient in the dZ rows before building G).
__host__ __device__ inline size_t wmma_fwd_warp_bytes(int d) {
  return (size_t(32) * wmma_z_ld(d) * 2 + size_t(32) * kSLd * 4 + 31) / 32 * 32;
}
__host__ __device__ inline size_t wmma_bwd_warp_bytes(int d) {
  return (size_t(32) * wmma_z_ld(d) * 2 + size_t(32) * kGLd * 2 + size_t(16) * (d + 4) * 4 +
          31) / 32 * 32;
}

// Z (rows 0..n-1 from dense and emb, zero rows up to 32) into shared memory. The 16-byte loads
// go out 8 at a time before their stores: one at a time, each warp would wait a full memory
// latency per load and the kernel would be bound by it.
template <class H>
__device__ __forceinline__ void wmma_load_z(const H* __restrict__ zd, const H* __restrict__ ze,
                                            int n, int d, H* z, int lane) {
  const int per_row = d / 8, zld = wmma_z_ld(d), total = 32 * per_row;
  constexpr int U = 8;
  for (int v0 = lane; v0 < total; v0 += 32 * U) {
    uint4 buf[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * 32;
      const int r = v / per_row, c = (v - r * per_row) * 8;
      buf[u] = make_uint4(0, 0, 0, 0);
      if (v < total && r < n)
        buf[u] = *reinterpret_cast<const uint4*>(r == 0 ? zd + c : ze + (r - 1) * d + c);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * 32;
      const int r = v / per_row, c = (v - r * per_row) * 8;
      if (v < total) *reinterpret_cast<uint4*>(z + r * zld + c) = buf[u];
    }
  }
}

template <class H>
__global__ void dot_forward_wmma_kernel(const H* __restrict__ dense, const H* __restrict__ emb,
                                        int64_t B, int T, int d, H* __restrict__ out,
                                        int64_t ld_out) {
  extern __shared__ __align__(128) unsigned char wsm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t b = int64_t(blockIdx.x) * kWmmaWarps + warp;
  if (b >= B) return;
  unsigned char* base = wsm + warp * wmma_fwd_warp_bytes(d);
  H* z = reinterpret_cast<H*>(base);
  float* sm = reinterpret_cast<float*>(base + size_t(32) * wmma_z_ld(d) * 2);
  const int n = T + 1, zld = wmma_z_ld(d);
  wmma_load_z(dense + b * d, emb + b * int64_t(T) * d, n, d, z, lane);
  __syncwarp();
  const int tiles = n > 16 ? 2 : 1;
  for (int ti = 0; ti < tiles; ++ti)
    for (int tj = 0; tj <= ti; ++tj) {
      wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
      wm::fill_fragment(acc, 0.f);
      for (int k0 = 0; k0 < d; k0 += 16) {
        wm::fragment<wm::matrix_a, 16, 16, 16, H, wm::row_major> fa;
        wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::col_major> fb;
        wm::load_matrix_sync(fa, z + ti * 16 * zld + k0, zld);
        wm::load_matrix_sync(fb, z + tj * 16 * zld + k0, zld);
        wm::mma_sync(acc, fa, fb, acc);
      }
      wm::store_matrix_sync(sm + ti * 16 * kSLd + tj * 16, acc, kSLd, wm::mem_row_major);
    }
  __syncwarp();
  H* o = out + b * ld_out;
  for (int k = lane; k < d; k += 32) o[k] = z[k];
  const int pairs = n * (n - 1) / 2;
  for (int q = lane; q < pairs; q += 32) {
    int i, j;
    pair_of(q, i, j);
    o[d + q] = from_f<H>(sm[i * kSLd + j]);
  }
  for (int64_t k = d + pairs + lane; k < ld_out; k += 32) o[k] = from_f<H>(0.f);
}

template <class H>
__global__ void dot_backward_wmma_kernel(const H* __restrict__ dense,
                                         const H* __restrict__ emb,
                                         const H* __restrict__ dout, int64_t ld_out, int64_t B,
                                         int T, int d, bool relu_dense, H* __restrict__ d_dense,
                                         float* __restrict__ d_emb) {
  extern __shared__ __align__(128) unsigned char wsm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t b = int64_t(blockIdx.x) * kWmmaWarps + warp;
  if (b >= B) return;
  unsigned char* base = wsm + warp * wmma_bwd_warp_bytes(d);
  H* z = reinterpret_cast<H*>(base);
  H* g = reinterpret_cast<H*>(base + size_t(32) * wmma_z_ld(d) * 2);
  float* dz = reinterpret_cast<float*>(base + size_t(32) * wmma_z_ld(d) * 2 +
                                       size_t(32) * kGLd * 2);
  const int n = T + 1, zld = wmma_z_ld(d), dzld = d + 4;
  wmma_load_z(dense + b * d, emb + b * int64_t(T) * d, n, d, z, lane);
  const H* gb = dout + b * ld_out;
  // The sample's pair gradients into the dZ rows first (loads in flight together), then G
  // from there.
  H* gs = reinterpret_cast<H*>(dz);
  const int F = d + n * (n - 1) / 2;
  if ((ld_out & 7) == 0 && (reinterpret_cast<uintptr_t>(dout) & 15) == 0) {
    const int nv = (F + 7) / 8;  // whole 16-byte vectors, within ld_out
    for (int v0 = lane; v0 < nv; v0 += 32 * 4) {
      uint4 buf[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (v0 + u * 32 < nv) buf[u] = reinterpret_cast<const uint4*>(gb)[v0 + u * 32];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (v0 + u * 32 < nv) reinterpret_cast<uint4*>(gs)[v0 + u * 32] = buf[u];
    }
  } else {
    for (int e0 = lane; e0 < F; e0 += 32 * 8) {
      H buf[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (e0 + u * 32 < F) buf[u] = gb[e0 + u * 32];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (e0 + u * 32 < F) gs[e0 + u * 32] = buf[u];
    }
  }
  __syncwarp();
  for (int e = lane; e < 32 * 32; e += 32) {
    const int i = e / 32, j = e - i * 32;
    H v = from_f<H>(0.f);
    if (i < n && j < n) {
      if (j < i) v = gs[d + i * (i - 1) / 2 + j];
      else if (i < j) v = gs[d + j * (j - 1) / 2 + i];
    }
    g[i * kGLd + j] = v;
  }
  __syncwarp();
  const int ktiles = n > 16 ? 2 : 1;
  for (int mt = 0; mt * 16 < n; ++mt) {
    for (int nt = 0; nt < d / 16; ++nt) {
      wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
      wm::fill_fragment(acc, 0.f);
      for (int kt = 0; kt < ktiles; ++kt) {
        wm::fragment<wm::matrix_a, 16, 16, 16, H, wm::row_major> fa;
        wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::row_major> fb;
        wm::load_matrix_sync(fa, g + mt * 16 * kGLd + kt * 16, kGLd);
        wm::load_matrix_sync(fb, z + kt * 16 * zld + nt * 16, zld);
        wm::mma_sync(acc, fa, fb, acc);
      }
      wm::store_matrix_sync(dz + nt * 16, acc, dzld, wm::mem_row_major);
    }
    __syncwarp();
    const int rows = min(16, n - mt * 16);
    const int per_row = d / 4;
    for (int v = lane; v < rows * per_row; v += 32) {
      const int r = v / per_row, k = (v - r * per_row) * 4;
      const int m = mt * 16 + r;
      const float4 x = *reinterpret_cast<const float4*>(dz + r * dzld + k);
      if (m == 0) {
        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          float val = to_f(gb[k + w]) + xs[w];
          if (relu_dense && !(to_f(z[k + w]) > 0.f)) val = 0.f;
          d_dense[b * d + k + w] = from_f<H>(val);
        }
      } else {
        *reinterpret_cast<float4*>(d_emb + (b * T + (m - 1)) * int64_t(d) + k) = x;
      }
    }
    __syncwarp();
  }
}

__global__ void cat_forward_kernel(const float* __restrict__ dense, const float* __restrict__ emb,
                                   int64_t B, int dd, int64_t E, float* __restrict__ out) {
  const int64_t F = dd + E, n = B * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / F, c = i - b * F;
    out[i] = c < dd ? dense[b * dd + c] : emb[b * E + (c - dd)];
  }
}

__global__ void cat_backward_kernel(const float* __restrict__ dout, int64_t B, int dd, int64_t E,
                                    float* __restrict__ d_dense, float* __restrict__ d_emb) {
  const int64_t F = dd + E, n = B * F;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / F, c = i - b * F;
    if (c < dd) d_dense[b * dd + c] = dout[i];
    else d_emb[b * E + (c - dd)] = dout[i];
  }
}

__global__ void sigmoid_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = 1.f / (1.f + expf(-x[i]));
}

constexpr int kBceThreads = 1024;

// One block: deterministic (fixed tree) reduction of the loss in double.
template <class H>
__global__ void bce_kernel(const float* __restrict__ logits, const float* __restrict__ labels,
                           int64_t n, float* __restrict__ dlogits, double* loss,
                           H* __restrict__ dlogits_h, const float* __restrict__ scale_p) {
  __shared__ double part[kBceThreads];
  const double inv_n = 1.0 / static_cast<double>(n);
  const float scale = scale_p ? *scale_p : 1.f;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double z = logits[i], y = labels[i];
    s += fmax(z, 0.0) - z * y + log1p(exp(-fabs(z)));
    const double p = z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
    const float g = static_cast<float>((p - y) * inv_n);
    dlogits[i] = g;
    if (dlogits_h) dlogits_h[i] = from_f<H>(scale_p ? g * scale : g);
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] * inv_n;
}

// One thread per element of a [rows, cols] parameter; gradient rows ldg apart; optional 16-bit
// copy wh with rows ldh apart. SGD without state, Adagrad with it. With gscale_p: gradients
// times *gscale_p, nothing done when it is 0 (loss scaling).
template <class H>
__global__ void optimizer_kernel(float* __restrict__ w, const float* __restrict__ g,
                                 float* __restrict__ a, int64_t rows, int64_t cols, int64_t ldg,
                                 H* __restrict__ wh, int64_t ldh, const float* __restrict__ lr_p,
                                 float eps, const float* __restrict__ gscale_p) {
  const float lr = *lr_p;
  const float gs = gscale_p ? *gscale_p : 1.f;
  if (gs == 0.f) return;
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float gi = gscale_p ? __fmul_rn(g[r * ldg + c], gs) : g[r * ldg + c];
    float wi;
    if (a) {
      const float acc = __fadd_rn(a[i], __fmul_rn(gi, gi));
      a[i] = acc;
      wi = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr, gi), __fadd_rn(sqrtf(acc), eps)));
    } else {
      wi = __fsub_rn(w[i], __fmul_rn(lr, gi));
    }
    w[i] = wi;
    if (wh) wh[r * ldh + c] = from_f<H>(wi);
  }
}

__global__ void scale_to_f16_kernel(const float* __restrict__ x, int64_t n,
                                    const float* __restrict__ scale, f16* __restrict__ y) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2half_rn(x[i] * s);
}

// blockIdx.y: the tensor; grid-stride over its elements.
__global__ void check_finite_kernel(const float* const* __restrict__ ptrs,
                                    const int64_t* __restrict__ counts, int* overflow) {
  const float* p = ptrs[blockIdx.y];
  const int64_t n = counts[blockIdx.y];
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(p[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *overflow = 1;
}

__global__ void check_finite1_kernel(const float* __restrict__ p, int64_t n, int* overflow) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(p[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *overflow = 1;
}

__global__ void loss_scale_update_kernel(LossScale ls, int growth_interval) {
  const float s = *ls.scale;
  if (*ls.overflow) {
    *ls.gscale = 0.f;
    *ls.scale = fmaxf(s * 0.5f, 1.f);
    *ls.good_steps = 0;
    *ls.skipped += 1;
  } else {
    *ls.gscale = 1.f / s;
    if (++*ls.good_steps >= growth_interval) {
      *ls.scale = fminf(s * 2.f, 16777216.f);
      *ls.good_steps = 0;
    }
  }
  *ls.overflow = 0;
}

}  // namespace

template <class H>
void launch_to_half(const float* x, int64_t B, int64_t cols, H* y, int64_t ld,
                    cudaStream_t stream) {
  const int64_t n = B * ld;
  if (n == 0) return;
  to_half_kernel<H><<<grid_for(n, 256), 256, 0, stream>>>(x, B, cols, y, ld);
  DLREC_CUDA_LAUNCH_CHECK();
}
void to_half_padded(const float* x, int64_t B, int64_t cols, bf16* y, int64_t ld,
                    cudaStream_t stream) {
  launch_to_half(x, B, cols, y, ld, stream);
}
void to_half_padded(const float* x, int64_t B, int64_t cols, f16* y, int64_t ld,
                    cudaStream_t stream) {
  launch_to_half(x, B, cols, y, ld, stream);
}

template <class H>
void bias_act_half(H* y, const H* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  const int64_t n = B * out;
  if (n == 0) return;
  bias_act_kernel<H><<<grid_for(n, 256), 256, 0, stream>>>(y, b, n, out, relu);
  DLREC_CUDA_LAUNCH_CHECK();
}
void bias_act(bf16* y, const bf16* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  bias_act_half(y, b, B, out, relu, stream);
}
void bias_act(f16* y, const f16* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  bias_act_half(y, b, B, out, relu, stream);
}

void bias_act(float* y, const float* b, int64_t B, int64_t out, bool relu, cudaStream_t stream) {
  const int64_t n = B * out;
  if (n == 0) return;
  if (out % 4 == 0 && n / 4 < (int64_t{1} << 31)) {
    const int n4 = static_cast<int>(n / 4);
    bias_act4_kernel<<<grid_for(n4, 256), 256, 0, stream>>>(
        reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(b), n4,
        static_cast<int>(out / 4), relu);
  } else {
    bias_act_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(y, b, n, out, relu);
  }
  DLREC_CUDA_LAUNCH_CHECK();
}

int64_t bias_grad_chunks(int64_t B) { return (B + kBgradRows - 1) / kBgradRows; }

// DLREC_BGRAD_VEC=0: the one-column-per-thread kernel for 16-bit types too (the same sums).
static bool bgrad_vec_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("DLREC_BGRAD_VEC");
    return !(v && v[0] == '0');
  }();
  return on;
}

template <class E, Mask M>
void launch_mask_bgrad(const E* dy, const E* y, const uint8_t* bits, int64_t bits_ld, E* dz,
                       float* partial, int64_t B, int64_t out, int64_t chunks,
                       cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = sizeof(E) == 2 && out % 8 == 0 && aligned(dy) &&
                   (M != Mask::Y || aligned(y)) && (M == Mask::None || aligned(dz)) &&
                   bgrad_vec_enabled();
  if constexpr (sizeof(E) == 2) {
    if (vec) {
      const int64_t groups = out / 8;
      const int gx = static_cast<int>(std::min<int64_t>(32, groups));
      dim3 grid(static_cast<unsigned>((groups + gx - 1) / gx), static_cast<unsigned>(chunks));
      mask_bgrad8_kernel<E, M><<<grid, dim3(gx, 8), 0, stream>>>(dy, y, bits, bits_ld, dz,
                                                                   partial, B,
                                                                   static_cast<int>(out));
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  dim3 grid(static_cast<unsigned>((out + 31) / 32), static_cast<unsigned>(chunks));
  mask_bgrad_kernel<E, M><<<grid, dim3(32, 8), 0, stream>>>(dy, y, bits, bits_ld, dz, partial,
                                                            B, static_cast<int>(out));
  DLREC_CUDA_LAUNCH_CHECK();
}

// y given: Mask::Y; else bits given: Mask::Bits (bits_ld in bits); else no mask.
template <class E>
void mask_bias_grad_impl(const E* dy, const E* y, const uint8_t* bits, int64_t bits_ld, E* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream) {
  if (out == 0) return;
  const int64_t chunks = bias_grad_chunks(B);
  if (chunks == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * out, stream));
    return;
  }
  DLREC_CHECK(chunks < 65536, "mask_bias_grad: batch of ", B, " rows is too large");
  if (y)
    launch_mask_bgrad<E, Mask::Y>(dy, y, nullptr, 0, dz, partial, B, out, chunks, stream);
  else if (bits)
    launch_mask_bgrad<E, Mask::Bits>(dy, nullptr, bits, bits_ld / 8, dz, partial, B, out, chunks,
                                     stream);
  else
    launch_mask_bgrad<E, Mask::None>(dy, nullptr, nullptr, 0, dz, partial, B, out, chunks,
                                     stream);
  sum_partials_kernel<<<static_cast<unsigned>((out + 127) / 128), 128, 0, stream>>>(
      partial, static_cast<int>(chunks), static_cast<int>(out), db);
  DLREC_CUDA_LAUNCH_CHECK();
}

void mask_bias_grad(const float* dy, const float* y, float* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_impl(dy, y, nullptr, 0, dz, partial, db, B, out, stream);
}
void mask_bias_grad(const bf16* dy, const bf16* y, bf16* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_impl(dy, y, nullptr, 0, dz, partial, db, B, out, stream);
}
void mask_bias_grad(const f16* dy, const f16* y, f16* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_impl(dy, y, nullptr, 0, dz, partial, db, B, out, stream);
}

static std::atomic<int64_t> g_mask_bits_launches{0};

template <class E>
void mask_bias_grad_bits_impl(const E* dy, const uint8_t* bits, int64_t bits_ld, E* dz,
                              float* partial, float* db, int64_t B, int64_t out,
                              cudaStream_t stream) {
  DLREC_CHECK(bits != nullptr && bits_ld >= out && bits_ld % 128 == 0,
              "mask_bias_grad_bits: the mask's leading dimension (", bits_ld,
              " bits) must be a multiple of 128 and at least the width ", out);
  mask_bias_grad_impl(dy, static_cast<const E*>(nullptr), bits, bits_ld, dz, partial, db, B, out,
                      stream);
  ++g_mask_bits_launches;
}
void mask_bias_grad_bits(const bf16* dy, const uint8_t* bits, int64_t bits_ld, bf16* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_bits_impl(dy, bits, bits_ld, dz, partial, db, B, out, stream);
}
void mask_bias_grad_bits(const f16* dy, const uint8_t* bits, int64_t bits_ld, f16* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream) {
  mask_bias_grad_bits_impl(dy, bits, bits_ld, dz, partial, db, B, out, stream);
}
int64_t mask_bits_launches() { return g_mask_bits_launches.load(); }

void relu_mask(const float* dy, const float* y, float* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<float><<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}
void relu_mask(const bf16* dy, const bf16* y, bf16* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<bf16><<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}
void relu_mask(const f16* dy, const f16* y, f16* dz, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<f16><<<grid_for(n, 256), 256, 0, stream>>>(dy, y, dz, n);
  DLREC_CUDA_LAUNCH_CHECK();
}

namespace {
// Kernels needing more than 48 KB of dynamic shared memory must opt in.
// Raises a kernel's limit once per size (not again while a CUDA graph is being captured).
int smem_limit_checked(size_t bytes, const void* fn) {
  static std::mutex mu;
  static std::map<const void*, size_t> raised;
  if (bytes > 48 * 1024) {
    std::lock_guard<std::mutex> lock(mu);
    size_t& r = raised[fn];
    if (r < bytes) {
      DLREC_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)));
      r = bytes;
    }
  }
  return static_cast<int>(bytes);
}
}  // namespace

template <class E>
void dot_forward(const E* dense, const E* emb, int64_t B, int T, int d, E* out, int64_t ld_out,
                 cudaStream_t stream) {
  if (B == 0) return;
  if constexpr (std::is_same_v<E, bf16> || std::is_same_v<E, f16>) {
    if (T + 1 <= 32 && d % 16 == 0) {
      const size_t smem = kWmmaWarps * wmma_fwd_warp_bytes(d);
      smem_limit_checked(smem, reinterpret_cast<const void*>(dot_forward_wmma_kernel<E>));
      const int64_t blocks = (B + kWmmaWarps - 1) / kWmmaWarps;
      dot_forward_wmma_kernel<E><<<static_cast<unsigned>(blocks), 32 * kWmmaWarps, smem, stream>>>(
          dense, emb, B, T, d, out, ld_out);
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  const size_t smem = sizeof(float) * size_t(T + 1) * (d + 1);
  smem_limit_checked(smem, reinterpret_cast<const void*>(dot_forward_kernel<E>));
  dot_forward_kernel<E><<<static_cast<unsigned>(B), kDotThreads, smem, stream>>>(dense, emb, T, d,
                                                                               out, ld_out);
  DLREC_CUDA_LAUNCH_CHECK();
}

template <class E, class G>
void dot_backward(const E* dense, const E* emb, const E* dout, int64_t ld_out, int64_t B, int T,
                  int d, bool relu_dense, E* d_dense, G* d_emb, cudaStream_t stream) {
  if (B == 0) return;
  if constexpr ((std::is_same_v<E, bf16> || std::is_same_v<E, f16>) &&
                std::is_same_v<G, float>) {
    if (T + 1 <= 32 && d % 16 == 0) {
      const size_t smem = kWmmaWarps * wmma_bwd_warp_bytes(d);
      smem_limit_checked(smem, reinterpret_cast<const void*>(dot_backward_wmma_kernel<E>));
      const int64_t blocks = (B + kWmmaWarps - 1) / kWmmaWarps;
      dot_backward_wmma_kernel<E><<<static_cast<unsigned>(blocks), 32 * kWmmaWarps, smem,
                                 stream>>>(dense, emb, dout, ld_out, B, T, d, relu_dense, d_dense,
                                           d_emb);
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  const size_t n = T + 1;
  const size_t smem = sizeof(float) * (n * (d + 1) + n * n);
  smem_limit_checked(smem, reinterpret_cast<const void*>(dot_backward_kernel<E, G>));
  dot_backward_kernel<E, G><<<static_cast<unsigned>(B), kDotThreads, smem, stream>>>(
      dense, emb, dout, ld_out, T, d, relu_dense, d_dense, d_emb);
  DLREC_CUDA_LAUNCH_CHECK();
}

template void dot_forward<float>(const float*, const float*, int64_t, int, int, float*, int64_t,
                                 cudaStream_t);
template void dot_forward<bf16>(const bf16*, const bf16*, int64_t, int, int, bf16*, int64_t,
                                cudaStream_t);
template void dot_backward<float, float>(const float*, const float*, const float*, int64_t,
                                         int64_t, int, int, bool, float*, float*, cudaStream_t);
template void dot_backward<bf16, float>(const bf16*, const bf16*, const bf16*, int64_t, int64_t,
                                        int, int, bool, bf16*, float*, cudaStream_t);
template void dot_forward<f16>(const f16*, const f16*, int64_t, int, int, f16*, int64_t,
                               cudaStream_t);
template void dot_backward<f16, float>(const f16*, const f16*, const f16*, int64_t, int64_t, int,
                                       int, bool, f16*, float*, cudaStream_t);

void cat_forward(const float* dense, const float* emb, int64_t B, int dd, int64_t E, float* out,
                 cudaStream_t stream) {
  const int64_t n = B * (dd + E);
  if (n == 0) return;
  cat_forward_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dense, emb, B, dd, E, out);
  DLREC_CUDA_LAUNCH_CHECK();
}

void cat_backward(const float* dout, int64_t B, int dd, int64_t E, float* d_dense, float* d_emb,
                  cudaStream_t stream) {
  const int64_t n = B * (dd + E);
  if (n == 0) return;
  cat_backward_kernel<<<grid_for(n, 256), 256, 0, stream>>>(dout, B, dd, E, d_dense, d_emb);
  DLREC_CUDA_LAUNCH_CHECK();
}

void sigmoid(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, y, n);
  DLREC_CUDA_LAUNCH_CHECK();
}

void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream, bf16* dlogits_h) {
  if (n == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), stream));
    return;
  }
  bce_kernel<bf16><<<1, kBceThreads, 0, stream>>>(logits, labels, n, dlogits, loss, dlogits_h,
                                                  nullptr);
  DLREC_CUDA_LAUNCH_CHECK();
}

void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream, f16* dlogits_h, const float* loss_scale) {
  if (n == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), stream));
    return;
  }
  bce_kernel<f16><<<1, kBceThreads, 0, stream>>>(logits, labels, n, dlogits, loss, dlogits_h,
                                                 loss_scale);
  DLREC_CUDA_LAUNCH_CHECK();
}

void scale_to_f16(const float* x, int64_t n, const float* scale, f16* y, cudaStream_t stream) {
  if (n == 0) return;
  scale_to_f16_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, scale, y);
  DLREC_CUDA_LAUNCH_CHECK();
}

void check_finite(const float* const* ptrs, const int64_t* counts, int n_tensors, int* overflow,
                  cudaStream_t stream) {
  if (n_tensors == 0) return;
  check_finite_kernel<<<dim3(64, static_cast<unsigned>(n_tensors)), 256, 0, stream>>>(
      ptrs, counts, overflow);
  DLREC_CUDA_LAUNCH_CHECK();
}

void check_finite(const float* p, int64_t n, int* overflow, cudaStream_t stream) {
  if (n == 0) return;
  check_finite1_kernel<<<grid_for(n, 256, 1024), 256, 0, stream>>>(p, n, overflow);
  DLREC_CUDA_LAUNCH_CHECK();
}

void loss_scale_update(const LossScale& ls, int growth_interval, cudaStream_t stream) {
  loss_scale_update_kernel<<<1, 1, 0, stream>>>(ls, growth_interval);
  DLREC_CUDA_LAUNCH_CHECK();
}

template <class H>
void optimizer_step_impl(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                         int64_t ldg, H* wh, int64_t ldh, const float* lr, float eps,
                         cudaStream_t stream, const float* gscale) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  optimizer_kernel<H><<<grid_for(n, 256), 256, 0, stream>>>(w, g, state, rows, cols, ldg, wh,
                                                            ldh, lr, eps, gscale);
  DLREC_CUDA_LAUNCH_CHECK();
}
void optimizer_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, bf16* wh, int64_t ldh, const float* lr, float eps,
                    cudaStream_t stream, const float* gscale) {
  optimizer_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, eps, stream, gscale);
}
void optimizer_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, f16* wh, int64_t ldh, const float* lr, float eps,
                    cudaStream_t stream, const float* gscale) {
  optimizer_step_impl(w, g, state, rows, cols, ldg, wh, ldh, lr, eps, stream, gscale);
}


// --- small-batch inference layer ------------------------------------------------------------

namespace {


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
