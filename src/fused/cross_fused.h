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

}  // namespace dlrec::cutlass_k
