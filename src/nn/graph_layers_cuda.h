// Internal: CUDA kernels of the graph model's `fm` and `wide` layers (src/model/graph_cuda.cu),
// beside cross_cuda.h. Launchers enqueue on `stream` and never synchronise.
//
// Inputs are row-major [B, n * d] with rows `ld` elements apart, elements float, bf16 or
// f16; all
// arithmetic is in float (the FM's final sum over the d components in double, as the CPU's
// nn::FactorizationMachine does), f32 products and sums rounded separately (no fused
// multiply-add), so fp32 results equal the CPU's but for the order of the final sum's terms.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::nn::cuda_graph {

// Factorization machine (second-order term) over n fields of width d per sample:
//   y[b] = 0.5 * sum_k ((sum_i x[b, i, k])^2 - sum_i x[b, i, k]^2)      (y f32 [B], 1 wide)
template <class E>
void fm_forward(const E* x, int64_t ld, int64_t B, int n, int d, float* y, cudaStream_t stream);

// Its backward: dx[b, i, k] (+)= dy[b] * (sum_j x[b, j, k] - x[b, i, k]), dx of type D
// (float, bf16 or f16) with rows dx_ld apart; accumulate adds to dx instead of overwriting it.
template <class E, class D>
void fm_backward(const E* x, int64_t ld, const float* dy, int64_t B, int n, int d, D* dx,
                 int64_t dx_ld, bool accumulate, cudaStream_t stream);

// The wide layer's sum: y[b] = bias[0] + parts[b, 0] + ... + parts[b, T - 1] (in that order,
// f32), parts [B, T] the pooled 1-wide table rows.
void wide_sum(const float* parts, const float* bias, int64_t B, int T, float* y,
              cudaStream_t stream);

// dparts[b, t] = dy[b] for t < T (the gradient of every pooled part is the output's).
void wide_broadcast(const float* dy, int64_t B, int T, float* dparts, cudaStream_t stream);

}  // namespace dlrec::nn::cuda_graph
