// CUDA kernels of the graph model: cross layer element-wise parts, strided column copies.
// See cross_cuda.h.
#include "nn/cross_cuda.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"

namespace dlrec::nn::cuda_graph {
namespace {

__device__ __forceinline__ float ld1(const float* p) { return *p; }
__device__ __forceinline__ float ld1(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st1(float* p, float v) { *p = v; }
__device__ __forceinline__ void st1(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ float ld1(const f16* p) { return __half2float(*p); }
__device__ __forceinline__ void st1(f16* p, float v) { *p = __float2half_rn(v); }

template <class E> __device__ __forceinline__ float rounded(float v);
template <> __device__ __forceinline__ float rounded<float>(float v) { return v; }
template <> __device__ __forceinline__ float rounded<bf16>(float v) {
  return __bfloat162float(__float2bfloat16(v));
}
template <> __device__ __forceinline__ float rounded<f16>(float v) {
  return __half2float(__float2half_rn(v));
}

// V consecutive elements as floats; V * sizeof(E) is 16 bytes for V > 1 (one vector access).
template <int V, class E>
__device__ __forceinline__ void loadv(const E* p, float (&o)[V]) {
  if constexpr (V == 1) {
    o[0] = ld1(p);
  } else {
    static_assert((V * sizeof(E)) % 16 == 0, "16-byte vectors");
    constexpr int W = 16 / sizeof(E);  // elements per 16-byte access
#pragma unroll
    for (int q = 0; q < V / W; ++q) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p + q * W);
      const E* e = reinterpret_cast<const E*>(&raw);
#pragma unroll
      for (int k = 0; k < W; ++k) o[q * W + k] = ld1(e + k);
    }
  }
}
template <int V, class E>
__device__ __forceinline__ void storev(E* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    st1(p, v[0]);
  } else {
    constexpr int W = 16 / sizeof(E);
#pragma unroll
    for (int q = 0; q < V / W; ++q) {
      uint4 raw;
      E* e = reinterpret_cast<E*>(&raw);
#pragma unroll
      for (int k = 0; k < W; ++k) st1(e + k, v[q * W + k]);
      *reinterpret_cast<uint4*>(p + q * W) = raw;
    }
  }
}

// Threads over columns (x), rows over y with a grid stride.
template <class S, class D>
__global__ void copy_cols_kernel(const S* __restrict__ src, int64_t src_ld, D* __restrict__ dst,
                                 int64_t dst_ld, int64_t B, int64_t cols, bool accumulate) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < B;
       r += int64_t(gridDim.y) * blockDim.y) {
    const float v = ld1(src + r * src_ld + c);
    D* o = dst + r * dst_ld + c;
    st1(o, accumulate ? __fadd_rn(ld1(o), v) : v);
  }
}

// The same, V elements per thread (16-byte or wider accesses on both sides; cols, lds and
// offsets multiples of V); S and D may differ.
template <int V, class S, class D>
__global__ void copy_cols_vec_kernel(const S* __restrict__ src, int64_t src_ld,
                                           D* __restrict__ dst, int64_t dst_ld, int64_t B,
                                           int64_t cols, bool accumulate) {
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= cols) return;
#pragma unroll 4  // several rows in flight per thread (one 16-byte load each)
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < B;
       r += int64_t(gridDim.y) * blockDim.y) {
    float v[V];
    loadv<V>(src + r * src_ld + c, v);
    if (accumulate) {
      float o[V];
      loadv<V>(dst + r * dst_ld + c, o);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = __fadd_rn(o[k], v[k]);
    }
    storev<V>(dst + r * dst_ld + c, v);
  }
}

// Block shape for a [B, units] sweep: up to 256 threads, x over units (a multiple of 32 up to
// 256), y over rows.
void sweep_shape(int64_t B, int64_t units, dim3& grid, dim3& block) {
  int bx = 32;
  while (bx < 256 && bx < units) bx *= 2;
  const int by = 256 / bx;
  block = dim3(bx, by);
  const int64_t gx = (units + bx - 1) / bx;
  int64_t gy = (B + by - 1) / by;
  // Enough blocks to fill the device; each block then strides over rows.
  const int64_t cap = std::max<int64_t>(1, 8192 / std::max<int64_t>(gx, 1));
  gy = std::min<int64_t>(std::min<int64_t>(gy, cap), 65535);
  grid = dim3(static_cast<unsigned>(gx), static_cast<unsigned>(std::max<int64_t>(gy, 1)));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <class E>
__global__ void bias_act_strided_kernel(E* __restrict__ y, const E* __restrict__ b, int64_t B,
                                        int64_t out, int64_t ld, bool relu) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= out) return;
  const float bc = ld1(b + c);
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < B;
       r += int64_t(gridDim.y) * blockDim.y) {
    const float v = __fadd_rn(ld1(y + r * ld + c), bc);
    st1(y + r * ld + c, relu ? fmaxf(v, 0.f) : v);
  }
}

template <class E>
__global__ void cross_combine_kernel(const E* __restrict__ x0, const E* __restrict__ u,
                                     const E* __restrict__ xl, E* __restrict__ out, int64_t B,
                                     int64_t F, int64_t ld) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= F) return;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < B;
       r += int64_t(gridDim.y) * blockDim.y) {
    const int64_t i = r * ld + c;
    st1(out + i, __fadd_rn(__fmul_rn(ld1(x0 + i), ld1(u + i)), ld1(xl + i)));
  }
}

// same: xl is x0 (the first layer), read once.
template <int V, class E>
__global__ void cross_combine_vec_kernel(const E* x0, const E* __restrict__ u, const E* xl,
                                         E* __restrict__ out, int64_t B, int64_t F, int64_t ld,
                                         bool same) {
  const int64_t c = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * V;
  if (c >= F) return;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < B;
       r += int64_t(gridDim.y) * blockDim.y) {
    const int64_t i = r * ld + c;
    float a[V], b[V], x[V];
    loadv<V>(x0 + i, a);
    loadv<V>(u + i, b);
    if (same) {
#pragma unroll
      for (int k = 0; k < V; ++k) x[k] = a[k];
    } else {
      loadv<V>(xl + i, x);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) a[k] = __fadd_rn(__fmul_rn(a[k], b[k]), x[k]);
    storev<V>(out + i, a);
  }
}

// Block (32, 8): 32 * V columns of one chunk of kRows rows; partial column sums of du reduced
// over threadIdx.y in a fixed order. mode: 0 = du only (ACC false), 1 = acc overwritten, 2 = acc
// added to (ACC true); in mode 1 the terms' products come first (n = 0 otherwise).
constexpr int kRows = 256;
template <int V, class E, bool ACC>
__global__ void cross_backward_kernel(const E* __restrict__ g, const E* __restrict__ x0,
                                      const E* __restrict__ u, E* __restrict__ du,
                                      E* __restrict__ acc, CrossTerms terms,
                                      float* __restrict__ partial, int64_t B, int64_t F,
                                      int64_t ld, int mode, bool add_g) {
  __shared__ float red[8][32 * V + 1];
  const int64_t c = (blockIdx.x * int64_t(32) + threadIdx.x) * V;
  const int64_t r0 = int64_t(blockIdx.y) * kRows;
  const int64_t r1 = min(B, r0 + kRows);
  float s[V];
#pragma unroll
  for (int k = 0; k < V; ++k) s[k] = 0.f;
  if (c < F) {
#pragma unroll(ACC ? 1 : 2)  // du only: two rows in flight per thread
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const int64_t i = r * ld + c;
      float gv[V], xv[V], dv[V];
      loadv<V>(g + i, gv);
      loadv<V>(x0 + i, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) dv[k] = __fmul_rn(gv[k], xv[k]);
      storev<V>(du + i, dv);
      if (ACC) {
        float av[V], uv[V];
        if (mode == 1) {
#pragma unroll
          for (int k = 0; k < V; ++k) av[k] = 0.f;
#pragma unroll
          for (int t = 0; t < kMaxCrossTerms; ++t) {  // constant indices: terms stay in registers
            if (t >= terms.n) break;
            float tg[V], tu[V];
            loadv<V>(static_cast<const E*>(terms.g[t]) + i, tg);
            loadv<V>(static_cast<const E*>(terms.u[t]) + i, tu);
#pragma unroll
            for (int k = 0; k < V; ++k) av[k] = __fadd_rn(av[k], __fmul_rn(tg[k], tu[k]));
          }
        } else {
          loadv<V>(acc + i, av);
        }
        loadv<V>(u + i, uv);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          float a = __fadd_rn(av[k], __fmul_rn(gv[k], uv[k]));
          if (add_g) a = __fadd_rn(a, gv[k]);
          av[k] = a;
        }
        storev<V>(acc + i, av);
      }
      // The column sums use du as stored (rounded to E), like the GEMMs that read it.
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] += rounded<E>(dv[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) red[threadIdx.y][threadIdx.x * V + k] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < F) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float t = red[0][threadIdx.x * V + k];
      for (int y = 1; y < 8; ++y) t += red[y][threadIdx.x * V + k];
      partial[int64_t(blockIdx.y) * F + c + k] = t;
    }
  }
}

__global__ void sum_partials_kernel(const float* __restrict__ partial, int chunks, int64_t F,
                                    float* __restrict__ db) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (col >= F) return;
  float s = 0.f;
  for (int c = 0; c < chunks; ++c) s += partial[int64_t(c) * F + col];
  db[col] = s;
}

template <class S, class D>
void copy_typed(const void* src, int64_t src_ld, void* dst, int64_t dst_ld, int64_t B,
                int64_t cols, bool accumulate, cudaStream_t stream) {
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  constexpr int V = 16 / sizeof(S);
  dim3 grid, block;
  if constexpr (sizeof(S) == sizeof(D) && (std::is_same<S, D>::value)) {
    if (cols % V == 0 && src_ld % V == 0 && dst_ld % V == 0 && aligned16(s) && aligned16(d)) {
      sweep_shape(B, cols / V, grid, block);
      copy_cols_vec_kernel<V, S, S><<<grid, block, 0, stream>>>(s, src_ld, d, dst_ld, B, cols,
                                                                 accumulate);
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  if constexpr (!std::is_same<S, D>::value) {
    constexpr int VM = 8;  // 16 bytes of bf16, 32 of float
    if (cols % VM == 0 && src_ld % VM == 0 && dst_ld % VM == 0 && aligned16(s) &&
        aligned16(d)) {
      sweep_shape(B, cols / VM, grid, block);
      copy_cols_vec_kernel<VM, S, D><<<grid, block, 0, stream>>>(s, src_ld, d, dst_ld, B,
                                                                      cols, accumulate);
      DLREC_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  sweep_shape(B, cols, grid, block);
  copy_cols_kernel<S, D><<<grid, block, 0, stream>>>(s, src_ld, d, dst_ld, B, cols, accumulate);
  DLREC_CUDA_LAUNCH_CHECK();
}

size_t elem_size(Elem e) { return e == Elem::F32 ? 4 : 2; }

}  // namespace

void copy_cols(const void* src, Elem src_t, int64_t src_ld, int64_t src_col, void* dst,
               Elem dst_t, int64_t dst_ld, int64_t dst_col, int64_t B, int64_t cols,
               bool accumulate, cudaStream_t stream) {
  if (B == 0 || cols == 0) return;
  const void* s = static_cast<const char*>(src) + src_col * elem_size(src_t);
  void* d = static_cast<char*>(dst) + dst_col * elem_size(dst_t);
  // One 16-bit type per model (bf16 or fp16 precision): no copies between the two.
  DLREC_CHECK(src_t == Elem::F32 || dst_t == Elem::F32 || src_t == dst_t,
              "copy_cols: no conversion between bf16 and fp16 (bug)");
  if (src_t == Elem::F32 && dst_t == Elem::F32)
    copy_typed<float, float>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
  else if (src_t == Elem::BF16 && dst_t == Elem::BF16)
    copy_typed<bf16, bf16>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
  else if (src_t == Elem::F16 && dst_t == Elem::F16)
    copy_typed<f16, f16>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
  else if (src_t == Elem::F32 && dst_t == Elem::BF16)
    copy_typed<float, bf16>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
  else if (src_t == Elem::F32)
    copy_typed<float, f16>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
  else if (src_t == Elem::BF16)
    copy_typed<bf16, float>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
  else
    copy_typed<f16, float>(s, src_ld, d, dst_ld, B, cols, accumulate, stream);
}

template <class E>
void cross_combine(const E* x0, const E* u, const E* xl, E* out, int64_t B, int64_t F,
                   int64_t ld, cudaStream_t stream) {
  if (B == 0 || F == 0) return;
  constexpr int V = 16 / sizeof(E);
  dim3 grid, block;
  if (F % V == 0 && ld % V == 0 && aligned16(x0) && aligned16(u) && aligned16(xl) &&
      aligned16(out)) {
    sweep_shape(B, F / V, grid, block);
    cross_combine_vec_kernel<V, E><<<grid, block, 0, stream>>>(x0, u, xl, out, B, F, ld,
                                                                 xl == x0);
  } else {
    sweep_shape(B, F, grid, block);
    cross_combine_kernel<E><<<grid, block, 0, stream>>>(x0, u, xl, out, B, F, ld);
  }
  DLREC_CUDA_LAUNCH_CHECK();
}

template <class E>
void bias_act_strided(E* y, const E* b, int64_t B, int64_t out, int64_t ld, bool relu,
                      cudaStream_t stream) {
  if (B == 0 || out == 0) return;
  dim3 grid, block;
  sweep_shape(B, out, grid, block);
  bias_act_strided_kernel<E><<<grid, block, 0, stream>>>(y, b, B, out, ld, relu);
  DLREC_CUDA_LAUNCH_CHECK();
}
template void bias_act_strided<float>(float*, const float*, int64_t, int64_t, int64_t, bool,
                                      cudaStream_t);
template void bias_act_strided<bf16>(bf16*, const bf16*, int64_t, int64_t, int64_t, bool,
                                     cudaStream_t);
template void bias_act_strided<f16>(f16*, const f16*, int64_t, int64_t, int64_t, bool,
                                    cudaStream_t);

int64_t cross_grad_chunks(int64_t B) { return (B + kRows - 1) / kRows; }

namespace {
template <class E>
void launch_cross_backward(const E* g, const E* x0, const E* u, E* du, E* acc,
                           const CrossTerms& terms, float* partial, float* db, int64_t B,
                           int64_t F, int64_t ld, int mode, bool add_g, cudaStream_t stream) {
  if (F == 0) return;
  const int64_t chunks = cross_grad_chunks(B);
  if (chunks == 0) {
    DLREC_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * F, stream));
    return;
  }
  DLREC_CHECK(chunks < 65536, "cross_backward: batch of ", B, " rows is too large");
  DLREC_CHECK(terms.n >= 0 && terms.n <= kMaxCrossTerms && (terms.n == 0 || mode == 1),
              "cross_backward: ", terms.n, " deferred terms (at most ", kMaxCrossTerms,
              ", only when the accumulator is overwritten)");
  constexpr int V = 16 / sizeof(E);
  bool vec = F % V == 0 && ld % V == 0 && aligned16(g) && aligned16(x0) && aligned16(du);
  if (mode != 0) vec = vec && aligned16(u) && aligned16(acc);
  for (int t = 0; t < terms.n; ++t) vec = vec && aligned16(terms.g[t]) && aligned16(terms.u[t]);
  const dim3 block(32, 8);
  if (vec) {
    dim3 grid(static_cast<unsigned>((F / V + 31) / 32), static_cast<unsigned>(chunks));
    if (mode == 0)
      cross_backward_kernel<V, E, false><<<grid, block, 0, stream>>>(
          g, x0, u, du, acc, terms, partial, B, F, ld, mode, add_g);
    else
      cross_backward_kernel<V, E, true><<<grid, block, 0, stream>>>(
          g, x0, u, du, acc, terms, partial, B, F, ld, mode, add_g);
  } else {
    dim3 grid(static_cast<unsigned>((F + 31) / 32), static_cast<unsigned>(chunks));
    if (mode == 0)
      cross_backward_kernel<1, E, false><<<grid, block, 0, stream>>>(
          g, x0, u, du, acc, terms, partial, B, F, ld, mode, add_g);
    else
      cross_backward_kernel<1, E, true><<<grid, block, 0, stream>>>(
          g, x0, u, du, acc, terms, partial, B, F, ld, mode, add_g);
  }
  DLREC_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<static_cast<unsigned>((F + 127) / 128), 128, 0, stream>>>(
      partial, static_cast<int>(chunks), F, db);
  DLREC_CUDA_LAUNCH_CHECK();
}
}  // namespace

template <class E>
void cross_backward(const E* g, const E* x0, const E* u, E* du, E* acc, float* partial,
                    float* db, int64_t B, int64_t F, int64_t ld, bool overwrite, bool add_g,
                    cudaStream_t stream) {
  launch_cross_backward(g, x0, u, du, acc, CrossTerms{}, partial, db, B, F, ld,
                        overwrite ? 1 : 2, add_g, stream);
}

template <class E>
void cross_backward_deferred(const E* g, const E* x0, const E* u, E* du, E* acc,
                             const CrossTerms& terms, float* partial, float* db, int64_t B,
                             int64_t F, int64_t ld, bool add_g, cudaStream_t stream) {
  DLREC_CHECK(acc != nullptr || (terms.n == 0 && !add_g),
              "cross_backward_deferred: terms or add_g without an accumulator");
  launch_cross_backward(g, x0, u, du, acc, terms, partial, db, B, F, ld, acc ? 1 : 0, add_g,
                        stream);
}

template void cross_combine<float>(const float*, const float*, const float*, float*, int64_t,
                                   int64_t, int64_t, cudaStream_t);
template void cross_combine<bf16>(const bf16*, const bf16*, const bf16*, bf16*, int64_t, int64_t,
                                  int64_t, cudaStream_t);
template void cross_backward<float>(const float*, const float*, const float*, float*, float*,
                                    float*, float*, int64_t, int64_t, int64_t, bool, bool,
                                    cudaStream_t);
template void cross_backward<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, float*,
                                   float*, int64_t, int64_t, int64_t, bool, bool, cudaStream_t);
template void cross_backward_deferred<float>(const float*, const float*, const float*, float*,
                                             float*, const CrossTerms&, float*, float*, int64_t,
                                             int64_t, int64_t, bool, cudaStream_t);
template void cross_backward_deferred<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*,
                                            const CrossTerms&, float*, float*, int64_t, int64_t,
                                            int64_t, bool, cudaStream_t);
template void cross_combine<f16>(const f16*, const f16*, const f16*, f16*, int64_t, int64_t,
                                 int64_t, cudaStream_t);
template void cross_backward<f16>(const f16*, const f16*, const f16*, f16*, f16*, float*, float*,
                                  int64_t, int64_t, int64_t, bool, bool, cudaStream_t);
template void cross_backward_deferred<f16>(const f16*, const f16*, const f16*, f16*, f16*,
                                           const CrossTerms&, float*, float*, int64_t, int64_t,
                                           int64_t, bool, cudaStream_t);

}  // namespace dlrec::nn::cuda_graph
