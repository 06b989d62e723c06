// Internal: one compressed Linear layer of the CUDA engine's serving path (docs/COMPRESSION.md,
// "Compressed layers on the GPU"). It holds the layer's compressed forms (the 2:4 compressed
// weight for cuSPARSELt, the int8 weight and scales), times the candidate kernels at each
// serving batch size on its first (eager) run and keeps the fastest (kernel_choice.h).
//
//   y [B, out] (rows out_ld apart) = act(x [B, in_pad] W^T + b)
//
// INT8 arithmetic in fp32 engines (the CPU reference's, compress::int8_linear):
//   qx = clamp(rint(x * (1 / sx)), -127, 127)    quantize kernel (x as the engine stores it)
//   acc = qx . qw                                int32, exact (cuBLASLt int8 -> int32)
//   y = act(float(acc) * (sx * sw[j]) + b[j])    dequantize/bias/ReLU kernel, no FMA
// so a layer's int8 output equals the CPU reference's bit for bit given the same input values.
// 2:4-int8 there hands the int32 sums out as bf16 (cuSPARSELt's int8 -> bf16 output), a
// relative rounding of at most 2^-9 before the scale: not bit-exact.
//
// In 16-bit (bf16/fp16) engines an int8 layer is one GEMM where the library allows it: the
// dequantize (per-output alpha vector sx * sw[j]), bias and ReLU run in cuBLASLt's (or
// cuSPARSELt's) epilogue, which writes y in the engine's type; and where the next layer of a
// chain (set_next) runs an int8 kernel too, the epilogue writes int8 requantized with that
// layer's input scale, q = sat(round(relu(acc * (sx sw[j] / sx') + b[j] / sx'))), straight into
// its int8 input, so the chain never goes through 16-bit or int32 memory. The epilogue's
// rounding (a fused multiply-add, the int8 conversion's rounding and saturation to [-128, 127])
// is the library's: not bit-exact with the CPU reference, within one int8 step per value
// (docs/COMPRESSION.md). Where the library has no such kernel, the fp32 engines' path runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/nn/kernel_choice.h"

namespace dlrec::nn::cuda_lt {
class Lt;
struct Gemm;
}  // namespace dlrec::nn::cuda_lt
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

  // Serving chains: `next` is the layer that alone reads this layer's output (an MLP's next
  // layer, a low-rank cross layer's second GEMM). In 16-bit engines, at a batch size where
  // both chose an int8 kernel, this layer writes its output quantized into next's int8 input
  // and leaves y unwritten; next skips its quantize kernel. Call once, before serving.
  void set_next(CompressedLinear* next, cudaStream_t stream);
  // Whether the int8 (sparse: 2:4-int8) kernel has a form that writes next's int8 input at B
  // rows (false: the libraries offer none here; the layer then writes its 16-bit output).
  bool chain_form_exists(bool sparse, int64_t B, cuda_lt::Lt& lt);
  // Whether the kernel chosen for B rows reads the int8 input (int8 or 2:4-int8).
  bool takes_int8(int64_t B) const {
    auto it = choice_.find(B);
    if (it == choice_.end()) return false;
    const kc::Kernel k = it->second.cand[it->second.chosen].kernel;
    return k == kc::Kernel::Int8 || k == kc::Kernel::Sparse24Int8;
  }
  // Whether the kernel chosen for B rows is dense (false before the choice is made).
  bool chose_dense(int64_t B) const {
    auto it = choice_.find(B);
    return it != choice_.end() && it->second.cand[it->second.chosen].kernel == kc::Kernel::Dense;
  }
  // The kernel's name ("dense", "2:4", "int8", "2:4-int8") that runs at B rows: "dense" before
  // the choice and under the dense policy.
  const char* kernel_at(int64_t B) const {
    auto it = choice_.find(B);
    if (policy_ == kc::Policy::Dense || it == choice_.end()) return "dense";
    return kc::kernel_name(it->second.cand[it->second.chosen].kernel);
  }
  const std::string& name() const { return name_; }
  kc::Policy policy() const { return policy_; }
  // The INT8 record on the device, for a kernel that runs the layer itself (the fused
  // small-batch forward, model/infer_small_cuda.h): int8 weights [out, ld] (rows zero-padded
  // from in_pad to ld, a multiple of 16), deq[j] = xscale * wscale[j], 1 / xscale and the f32
  // bias (null: none). q is null without an INT8 record.
  struct Int8View {
    const int8_t* q = nullptr;
    int64_t ld = 0;
    const float* deq = nullptr;
    float inv_x = 0.f;
    const float* bias = nullptr;
  };
  Int8View int8_view() const;
  // Records that the fused small-batch kernel ran this layer at B rows (the choice the reports
  // show for B): its INT8 arithmetic, or a 2:4 layer's pruned weights.
  void note_fused(int64_t B);
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
  // The int8 / 2:4-int8 kernel. chain_out: write next_'s int8 input (false: y); timing: the
  // input is taken as already quantized when a previous int8 layer can hand it over.
  bool run_int8(bool sparse, int64_t B, const void* x, void* y, Act ydt, int64_t out_ld,
                cuda_lt::Lt& lt, cudaStream_t stream, bool chain_out);
  // The cuBLASLt GEMM of the int8 kernel: int32 out (fp32 engines), ydt with the epilogue, or
  // int8 into next_ (chain).
  cuda_lt::Gemm int8_gemm(int64_t B, Act ydt, int64_t out_ld, bool chain_out) const;
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
  bool fused_;  // a 16-bit engine: epilogues and chains (see the top of this file)
  // sp_int8_: bf16 engines, the epilogue form (y bf16); others, the int32 sums as bf16.
  // sp_int8q_: int8 output for next_ (chains).
  std::unique_ptr<cuda_sparse::Gemm24> sp_half_, sp_int8_, sp_int8q_;
  bool sp_int8_epi_ = false;     // sp_int8_ has the epilogue (its output is y)
  Tensor qw_;                    // int8 [out, in_q]
  Tensor deq_;                   // f32 [out]: xscale * wscale[j] (the alpha vector)
  Tensor bias_half_;             // the bias in the engine's 16-bit type (cuSPARSELt's epilogue)
  Tensor req_alpha_, req_bias_;  // f32 [out]: deq[j] / next's xscale, b[j] / next's xscale
  std::vector<float> deq_h_, bias_h_;
  float xscale_ = 0.f, inv_x_ = 0.f;  // the input scale, 1 / it
  Tensor qx_;                         // int8 [rows, in_q]
  Tensor acc_;                        // int32 [rows, out] (or bf16 for 2:4-int8)
  int64_t rows_ = 0;
  CompressedLinear* next_ = nullptr;  // set_next
  CompressedLinear* prev_ = nullptr;  // the layer whose set_next named this one
  // Whether this layer, at B rows, hands its output over quantized to next_ once next_ runs an
  // int8 kernel: it chose an int8 kernel that has a chain form (for the choice in context).
  bool hands_over(int64_t B, cuda_lt::Lt& lt);
  // Runs prev_'s chosen int8 kernel at B from its quantized input, writing x (this layer's
  // 16-bit input) or, chain_out, this layer's int8 input. False when it did not run.
  bool run_prev(int64_t B, const void* x, bool chain_out, cuda_lt::Lt& lt, cudaStream_t stream);
  int64_t qx_ready_ = -1;  // the previous layer wrote qx_ for this many rows (its next run)
  std::map<int64_t, Choice> choice_;
};

}  // namespace dlrec::nn::cuda_compress
