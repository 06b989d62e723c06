// Internal: one compressed Linear layer of the CUDA engine's serving path (docs/COMPRESSION.md,
// "Compressed layers on the GPU"). It holds the layer's compressed forms (the 2:4 compressed
// weight for cuSPARSELt, the int8 weight and scales), times the candidate kernels at each
// serving batch size on its first (eager) run and keeps the fastest (kernel_choice.h).
//
//   y [B, out] (rows out_ld apart) = act(x [B, in_pad] W^T + b)
//
// INT8 arithmetic (the CPU reference's, compress::int8_linear):
//   qx = clamp(rint(x * (1 / sx)), -127, 127)    quantize kernel (x as the engine stores it)
//   acc = qx . qw                                int32, exact (cuBLASLt int8 -> int32)
//   y = act(float(acc) * (sx * sw[j]) + b[j])    dequantize/bias/ReLU kernel, no FMA
// so a layer's int8 output equals the CPU reference's bit for bit given the same input values
// (in fp32 precision; bf16 precision rounds y to bf16 after). 2:4-int8 hands the int32 sums
// out as bf16 (cuSPARSELt's int8 -> bf16 output), a relative rounding of at most 2^-9 before
// the scale: not bit-exact.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/nn/kernel_choice.h"

namespace dlrec::nn::cuda_lt {
class Lt;
}
namespace dlrec::nn::cuda_sparse {
class Gemm24;
}

namespace dlrec::nn::cuda_compress {

namespace kc = kernel_choice;

// Element types of the activations (the engine's: f32, bf16 or f16).
enum class Act { F32, BF16, F16 };

struct Int8Weight {
  std::vector<int8_t> q;      // [out, in] row-major
  std::vector<float> wscale;  // [out]
  float xscale = 0.f;
};

class CompressedLinear {
 public:
  // name: the weight's ("top.0.weight"), for reports and errors. w_half: the engine's 16-bit
  // weight copy [out, in_pad] on the device (null in fp32 precision). masked: the weight is 2:4
  // (its mask checked by the caller). int8: the INT8 record (null: none). bias_f32: the f32
  // bias on the device (null: none). act: the engine's activation type.
  CompressedLinear(std::string name, int64_t out, int64_t in, int64_t in_pad, bool relu, Act act,
                   const void* w_half, bool masked, const Int8Weight* int8, const float* bias_f32,
                   kc::Policy policy, cudaStream_t stream);
  ~CompressedLinear();
  CompressedLinear(const CompressedLinear&) = delete;
  CompressedLinear& operator=(const CompressedLinear&) = delete;

  // Scratch for up to `rows` rows (called when the engine's capacity grows).
  void reserve(int64_t rows);
  // Runs the layer's kernel for B rows. On the first run of a batch size (outside graph
  // capture) chooses it: times the candidates (dense through `dense`, the engine's own path)
  // and keeps the choice. Returns false when the choice is dense (the caller runs it).
  bool forward(int64_t B, const void* x, void* y, Act ydt, int64_t out_ld, cuda_lt::Lt& lt,
               cudaStream_t stream, const std::function<void()>& dense);
  // Runs the non-dense kernel k (for tests): false when unavailable for this output.
  bool run(kc::Kernel k, int64_t B, const void* x, void* y, Act ydt, int64_t out_ld,
           cuda_lt::Lt& lt, cudaStream_t stream);

  // Whether the kernel chosen for B rows is dense (false before the choice is made).
  bool chose_dense(int64_t B) const {
    auto it = choice_.find(B);
    return it != choice_.end() && it->second.cand[it->second.chosen].kernel == kc::Kernel::Dense;
  }
  const std::string& name() const { return name_; }
  kc::Policy policy() const { return policy_; }
  void set_policy(kc::Policy p) {
    policy_ = p;
    choice_.clear();
  }
  // The load-time line (candidates and why not), and per batch size chosen so far, the timed
  // candidates (kernel_choice::describe).
  std::string describe_load() const;
  std::vector<std::string> describe_choices() const;

 private:
  struct Choice {
    std::vector<kc::Candidate> cand;
    size_t chosen = 0;
  };
  Choice& choose(int64_t B, const void* x, void* y, Act ydt, int64_t out_ld, cuda_lt::Lt& lt,
                 cudaStream_t stream, const std::function<void()>& dense);
  std::string name_;
  int64_t out_, in_, in_pad_, in_q_;
  bool relu_;
  Act act_;
  const void* w_half_;
  bool masked_, quantized_;
  const float* bias_;
  kc::Policy policy_;
  std::string sparse_why_;           // why cuSPARSELt is unavailable ("" if it loads)
  std::string half_why_, int8_why_;  // why the 2:4 / 2:4-int8 kernel is (when it is not built)
  std::unique_ptr<cuda_sparse::Gemm24> sp_half_, sp_int8_;
  void* qw_ = nullptr;    // int8 [out, in_q]
  float* deq_ = nullptr;  // [out]: xscale * wscale[j]
  float inv_x_ = 0.f;     // 1 / xscale
  void* qx_ = nullptr;    // int8 [rows, in_q]
  void* acc_ = nullptr;   // int32 [rows, out] (or bf16 for 2:4-int8)
  int64_t rows_ = 0;
  std::map<int64_t, Choice> choice_;
};

}  // namespace dlrec::nn::cuda_compress
