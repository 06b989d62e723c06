// Internal: column-major GEMMs through cuBLASLt with fused epilogues, planned once per shape.
//
//   D [m, n] = op(A) [m, k] * op(B) [k, n]       (column-major, leading dimensions lda/ldb/ldd)
//
// With `accumulate_c` the GEMM adds a separate matrix C (same type and layout as D, C != D):
//   D = op(A) op(B) + C   (beta = 1; C is read only, so a first-use timing run is harmless).
// Types: ab_type bf16/fp16/fp32 (fp32 accumulation), or int8 (CUDA_R_8I: int32 accumulation on
// the integer tensor cores, transposed A and untransposed B, D int8 requantized by alpha, or
// int32).
// Epilogues (cuBLASLt's names):
//   Bias:        D += bias (per row of D, length m; bias type = D type)
//   ReluAuxBias: D = relu(D + bias), and the ReLU mask as bits into `aux` (ld aux_ld bits)
//   DRelu:       D = D masked by the bit mask `aux` of a ReluAuxBias output of the same shape
//   BGradB:      bias gradient: grad [n] = sums of op(B) over k (type = D type)
//   ReluBias:    D = relu(D + bias), no mask (serving)
// alpha_vector: alpha is a device vector of length m (one scale per row of D, cuBLASLt's
// CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO; no accumulate_c), passed to run() as
// alpha_dev. bias_f32: the bias vector is f32 whatever D's type (int8 operands: the type
// cuBLASLt takes with a float scale; bf16/fp16 D: asked for explicitly).
// On its first use outside graph capture, a plan times up to 8 of the heuristic's candidates on
// the real operands and keeps the fastest (Lt's `tune` false: the heuristic's first choice,
// the same algorithm in every run, which bit-identity tests need).
// A plan that cuBLASLt cannot serve (no algorithm for the types, shapes and epilogue) is
// remembered as unsupported and run() returns false: the caller then uses a plain GEMM and its
// own kernels. Plans are cached per descriptor, so the heuristic query runs once per shape and
// run() is safe inside CUDA graph capture after a first eager call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "dlrec/core/gpu_resources.h"

namespace dlrec::nn::cuda_lt {

enum class Epi { None, Bias, ReluAuxBias, DRelu, BGradB, ReluBias };

struct Gemm {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t ab_type = CUDA_R_16BF, d_type = CUDA_R_16BF;
  Epi epi = Epi::None;
  int64_t aux_ld = 0;  // bits, multiple of 128 (ReluAuxBias / DRelu)
  bool accumulate_c = false;  // D = op(A) op(B) + C (C passed to run(), C != D)
  int sm_target = 0;  // > 0: cuBLASLt's SM count target (a kernel meant to share the device)
  bool alpha_vector = false;  // alpha: a device vector over the rows of D (see above)
  bool bias_f32 = false;      // the bias vector is f32 (see above)
  // A GEMM of this shape (column-major D [m, n] = op(A) op(B)), other fields at their defaults.
  static Gemm shape(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                    int64_t ldd) {
    Gemm g;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = lda;
    g.ldb = ldb;
    g.ldd = ldd;
    return g;
  }
  auto key() const {
    return std::make_tuple(trans_a, trans_b, m, n, k, lda, ldb, ldd, static_cast<int>(ab_type),
                           static_cast<int>(d_type), static_cast<int>(epi), aux_ld,
                           accumulate_c, sm_target, alpha_vector, bias_f32);
  }
};

class Lt {
 public:
  // A planner on a handle and workspace leased from the device's pool (gpu_resources.h).
  // tune: time the heuristic's candidates on first use (false: take its first choice).
  explicit Lt(gpu::LtLease lease, bool tune = true);
  ~Lt();
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  // D = op(A) op(B) with the epilogue; `vec` is the bias (input) or bias gradient (output),
  // `aux` the ReLU mask (output of ReluAuxBias, input of DRelu), `C` the added matrix when
  // g.accumulate_c (else ignored). False when unsupported.
  // alpha scales op(A) op(B) (int8 operands with an int8 D: the requantizing scale); with
  // g.alpha_vector, alpha_dev is the device vector [m] instead.
  bool run(const Gemm& g, const void* A, const void* B, void* D, const void* vec, void* aux,
           cudaStream_t stream, const void* C = nullptr, float alpha = 1.f,
           const float* alpha_dev = nullptr);
  // Whether the plan exists (queries the heuristic on first use).
  bool supported(const Gemm& g);
  // How many plans fell back (for the profile print).
  int unsupported_count() const { return unsupported_; }

 private:
  struct Plan;
  Plan* plan(const Gemm& g);
  gpu::LtLease lease_;  // the pooled handle and workspace
  cublasLtHandle_t handle_ = nullptr;
  void* ws_;
  size_t ws_bytes_;
  bool tune_ = true;
  int unsupported_ = 0;
  std::map<decltype(Gemm{}.key()), std::unique_ptr<Plan>> plans_;
};

}  // namespace dlrec::nn::cuda_lt
