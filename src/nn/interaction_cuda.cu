// CUDA kernels of the DLRM's interaction layer (declared in dense_cuda.h): the dot
// interaction (CUDA-core kernels in f32, tensor-core WMMA kernels in bf16/f16) and the concat.
#include <mma.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "core/cuda_check.h"
#include "nn/dense_cuda.h"
#include "nn/half_cuda.cuh"

namespace dlrec::nn::cuda_dense {
namespace {

using half_cuda::grid_for;

using half_cuda::from_f;
using half_cuda::to_f;
using half_cuda::unpack8;

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

}  // namespace

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

}  // namespace dlrec::nn::cuda_dense
