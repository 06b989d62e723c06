// The CPU's fp32 Linear for inference on a weight packed once (at model load), with its own
// AVX-512 / AVX2 kernels instead of OpenBLAS (src/nn/linear_packed.cc).
//
// Each output is one fused multiply-add chain over k in order, from 0, then the bias is added
// (and ReLU applied): y[r, j] = act(fma(x[r, in-1], W[j, in-1], ... fma(x[r, 0], W[j, 0], 0)) + b[j]).
// Every kernel computes exactly that, so
//   - the SIMD kernels give the scalar reference's bits, and
//   - a row's scores do not depend on the batch it runs in, nor on the thread count: rows and
//     output channels may be split among threads in any way (a BLAS GEMM rounds a row
//     differently depending on where it falls in the call, which made dynamically batched
//     requests differ in the last bits from the same request alone).
// Training keeps the OpenBLAS path of nn::Linear (its weights change every step).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/nn/linear.h"

namespace dlrec::nn {

enum class Fp32Kernel {
  Reference,  // scalar std::fma, on the unpacked weight
  Avx2,       // tiles of 6 rows x 16 channels (FMA3)
  Avx512,     // tiles of 8 rows x 32 channels
  Auto,       // the fastest this CPU runs: Avx512, else Avx2, else Reference
};
bool fp32_kernel_available(Fp32Kernel k);
const char* fp32_kernel_name(Fp32Kernel k);
Fp32Kernel fp32_best_kernel();

// W [out, in] in panels of `width` channels (32 for Avx512, 16 for Avx2), each [in][width] with
// the channels past `out` zero; Reference keeps the weight as it is ([out, in]).
struct PackedWeight {
  Fp32Kernel kernel = Fp32Kernel::Reference;
  int64_t out = 0, in = 0;
  int64_t width = 0;  // channels per panel (0: Reference)
  std::vector<float> w;
};
// Packs a CPU F32 weight [out, in] for kernel k (Auto: the best one here; an unavailable one is
// an error).
std::shared_ptr<const PackedWeight> pack_weight(const Tensor& weight, Fp32Kernel k = Fp32Kernel::Auto);

// y [B, out] = act(x [B, in] W^T + b) on the pool's threads; y must already be [B, out].
void packed_linear(const Tensor& x, const PackedWeight& w, const Tensor& bias, bool relu, Tensor& y);

// The inference record of an fp32 Linear (Param::quant): its weight packed at load. The model
// must not train afterwards (the packed copy would go stale): train::Predictor attaches it
// through Model::prepare_cpu_inference().
class PackedLinear final : public LinearHook {
 public:
  explicit PackedLinear(const Tensor& weight, Fp32Kernel k = Fp32Kernel::Auto);
  bool forward(const Tensor& x, const Tensor& bias, bool relu, Tensor& y) override;
  std::string kernel() const override;  // "fp32 avx512 (packed)"
  bool inference_only() const override { return true; }

 private:
  std::shared_ptr<const PackedWeight> w_;
};

}  // namespace dlrec::nn
