// Internal: CUDA kernels of the graph model (src/model/graph_cuda.cu) beside those of the DLRM:
// the DCNv2 cross layer's element-wise parts and strided column copies (concat, gradient
// routing between layers). Launchers enqueue on `stream` and never synchronise.
//
// Matrices are row-major [B, cols] with rows `ld` elements apart (ld >= cols; the columns past
// `cols` are padding that these kernels never read or write). Elements are float, bf16 or
// f16 (`Elem`); arithmetic is in float, f32 products and sums rounded separately (no fused
// multiply-add), as the CPU reference does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::nn::cuda_graph {

using bf16 = __nv_bfloat16;
using f16 = __half;  // fp16 precision (with loss scaling): every bf16 form has an f16 twin
enum class Elem { F32, BF16, F16 };

// dst[b, dst_col + c] (+)= src[b, src_col + c] for b < B, c < cols, converting between the
// element types; accumulate adds to dst instead of overwriting it.
void copy_cols(const void* src, Elem src_t, int64_t src_ld, int64_t src_col, void* dst,
               Elem dst_t, int64_t dst_ld, int64_t dst_col, int64_t B, int64_t cols,
               bool accumulate, cudaStream_t stream);

// y [B, out] (rows ld apart) += b per column, then ReLU when relu (bias of the element type).
template <class E>
void bias_act_strided(E* y, const E* b, int64_t B, int64_t out, int64_t ld, bool relu,
                      cudaStream_t stream);

// Cross layer forward, element-wise part: out = x0 * u + xl ([B, F], rows ld apart; u already
// holds W x_l + b).
template <class E>
void cross_combine(const E* x0, const E* u, const E* xl, E* out, int64_t B, int64_t F,
                   int64_t ld, cudaStream_t stream);

// Cross layer backward, element-wise part, for g = dL/dx_{l+1}:
//   du = g * x0                       (E, [B, F])
//   acc = (overwrite ? 0 : acc) + g * u (+ g when add_g)     (accumulator of dL/dx0, E)
//   db [F] = column sums of du, summed in a fixed order through `partial`
//            [cross_grad_chunks(B), F] (deterministic).
int64_t cross_grad_chunks(int64_t B);
template <class E>
void cross_backward(const E* g, const E* x0, const E* u, E* du, E* acc, float* partial,
                    float* db, int64_t B, int64_t F, int64_t ld, bool overwrite, bool add_g,
                    cudaStream_t stream);

// The same pass with the dL/dx0 sum deferred to the first layer (one read and one write of it
// instead of one per layer). Layers l >= 1 pass acc = null: only du and db. Layer 0 passes the
// deeper layers' pairs (dL/dx_{k+1}, u_k) in `terms`, deepest first, and gets
//   acc = ((terms.g[0] * terms.u[0] + terms.g[1] * terms.u[1]) + ...) + g * u (+ g when add_g)
// summed in f32 in that order and rounded to E once: the order in which cross_backward adds
// them layer by layer (identical results in f32; in bf16 without the rounding between layers).
constexpr int kMaxCrossTerms = 7;
struct CrossTerms {
  const void* g[kMaxCrossTerms] = {};
  const void* u[kMaxCrossTerms] = {};
  int n = 0;
};
template <class E>
void cross_backward_deferred(const E* g, const E* x0, const E* u, E* du, E* acc,
                             const CrossTerms& terms, float* partial, float* db, int64_t B,
                             int64_t F, int64_t ld, bool add_g, cudaStream_t stream);

}  // namespace dlrec::nn::cuda_graph
