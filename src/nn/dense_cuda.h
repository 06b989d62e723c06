// Internal: CUDA kernels of the dense part of the model (bias/ReLU epilogues, interactions,
// BCE loss, dense optimizer steps). Launchers enqueue on `stream` and never synchronise.
// Arithmetic that the CPU reference does as a separate multiply and add is rounded the same way
// here (no fused multiply-add), so that fp32 runs track the CPU closely.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::nn::cuda_dense {

// y [B, out] += b (per column), then ReLU when relu.
void bias_act(float* y, const float* b, int64_t B, int64_t out, bool relu, cudaStream_t stream);
// Backward of bias (+ ReLU) for dy [B, out]: with y given, dz = dy where y > 0 else 0 (dz is
// unused when y is null: then dz = dy); db [out] = column sums of dz, summed in a fixed order
// (deterministic) through `partial` [bias_grad_chunks(B), out].
int64_t bias_grad_chunks(int64_t B);
void mask_bias_grad(const float* dy, const float* y, float* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream);
// dz = dy where y > 0, else 0 (all [n]).
void relu_mask(const float* dy, const float* y, float* dz, int64_t n, cudaStream_t stream);

// Dot interaction: Z_b = [dense_b; emb_b,0..T-1] (n = T + 1 rows of dim d);
// out [B, d + n(n-1)/2] = [dense, strict lower triangle of Z Z^T row-major].
void dot_forward(const float* dense, const float* emb, int64_t B, int T, int d, float* out,
                 cudaStream_t stream);
// dout [B, F] -> d_dense [B, d] (pass-through + dZ_0), d_emb [B, T, d].
void dot_backward(const float* dense, const float* emb, const float* dout, int64_t B, int T, int d,
                  float* d_dense, float* d_emb, cudaStream_t stream);
// Cat interaction: out [B, dd + T d] = [dense, emb flattened]; backward splits.
void cat_forward(const float* dense, const float* emb, int64_t B, int dd, int64_t E, float* out,
                 cudaStream_t stream);
void cat_backward(const float* dout, int64_t B, int dd, int64_t E, float* d_dense, float* d_emb,
                  cudaStream_t stream);

// Mean BCE-with-logits over n samples: *loss (double, device) and dlogits = (sigmoid - y) / n.
void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream);

// Dense optimizer steps (SGD when state is null, else Adagrad with accumulator `state`).
void optimizer_step(float* w, const float* g, float* state, int64_t n, float lr, float eps,
                    cudaStream_t stream);

}  // namespace dlrec::nn::cuda_dense
