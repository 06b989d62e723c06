// Internal: the DCNv2 cross layer's second GEMM with the layer's combine fused into its epilogue
// (CUTLASS sm90 kernel; built only when the CUTLASS headers are found, see cmake/Cutlass.cmake).
//
// Column-major views of the row-major activations (as in nn/lt_gemm.h), bf16, fp32 accumulation:
//   u      [m, n] = A [m, k] (row-major, rows lda apart) * B [k, n] (columns ldb apart) + bias [m]
//   x_next [m, n] = x0 * u + xl        (element-wise; u, x0, xl, x_next columns ld apart)
// u is stored rounded to bf16 (what the backward reads, bit-identical to a GEMM with a bias
// epilogue); x_next is formed from the unrounded u. One kernel instead of a GEMM and an
// element-wise pass: u is not read back and the pass overlaps the GEMM's math.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::cutlass_k {

// False (nothing launched) when the kernel cannot serve the call: a device other than sm_90, m
// or a leading dimension not a multiple of 8 or a pointer not 16-byte aligned (TMA's rules), or
// a launch the kernel refuses. The caller
// then takes its unfused path. Safe inside CUDA graph capture (no allocation, no sync).
bool cross_gemm_combine(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                        const void* b, int64_t ldb, const void* bias, const void* x0,
                        const void* xl, void* u, void* x_next, int64_t ld, cudaStream_t stream);

// Kernels launched by cross_gemm_combine so far (all devices): lets tests see the path taken.
int64_t cross_gemm_combine_launches();

// Whether the current device runs these kernels (sm_90).
bool cross_fused_device_ok();

// The backward (cross_bwd_fused.cu): layer l's data GEMM that forms g = dL/dx_l,
//   g [m, n] = W [m, k] (m-major: columns lda apart, the weights as stored) * dh [k, n]
//              (columns ldb apart) + C          (C = dL/dx_{l+1}; all bf16, fp32 accumulation)
// with layer l-1's element-wise pass in its epilogue: du = x0 * g (both rounded to bf16 where the
// two-step path rounds them, so g and du carry its bits) and db [m] = column sums of du (f32,
// per 128-column tile into `partial`, then added in tile order: deterministic; the two-step
// path sums in another order). x0, C, du and the outputs: columns ld apart.
struct DgradArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* w = nullptr;
  int64_t lda = 0;
  const void* dh = nullptr;
  int64_t ldb = 0;
  const void* c = nullptr;   // dL/dx_{l+1}
  const void* x0 = nullptr;
  void* du = nullptr;        // layer l-1's du
  float* db = nullptr;       // layer l-1's bias gradient [m]
  float* partial = nullptr;  // at least dgrad_partial_floats(m, n) floats
  int64_t partial_floats = 0;
  int64_t ld = 0;
};
int64_t dgrad_partial_floats(int64_t m, int64_t n);
// Layers l >= 2 (l-1 >= 1 keeps its g): also stores g into g_out. With c null, g = W dh alone:
// the data GEMM of the layer above the cross layers (the first MLP layer) doing the top cross
// layer's pass.
bool cross_dgrad_du(const DgradArgs& a, void* g_out, cudaStream_t stream);
// Layer 1 (l-1 = 0, where the deferred dL/dx0 sum is formed), g itself not stored:
//   acc = ((g3 * u2 + C * u1) + g * u0) + g   with g3/u2 (the top layer's terms when there are
// three layers) or without them (null: two layers), the products and sums in the order
// cross_backward_deferred uses.
bool cross_dgrad_acc(const DgradArgs& a, const void* u0, const void* u1, const void* g3,
                     const void* u2, void* acc, cudaStream_t stream);
// Backward kernels launched so far (all devices).
int64_t cross_dgrad_fused_launches();

}  // namespace dlrec::cutlass_k
