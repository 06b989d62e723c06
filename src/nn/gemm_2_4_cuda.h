// Internal: 2:4 structured-sparse GEMMs on the sparse tensor cores, through NVIDIA's cuSPARSELt.
//
//   Y [batch, out] = X [batch, in] * W^T          (row-major, as the nn layers store them)
//
// W [out, in] is 2:4 sparse along `in`: in every group of 4 consecutive values of a row, at
// least 2 are zero (the layout compress::compute_mask_2_4 produces). It is checked and
// compressed once, in set_weight(); plans are made per batch size on first use (the library's
// default kernel configuration; see plan()), so the first run() of a batch size must not be
// inside CUDA graph capture. Plans live as long as the GEMM (captured graphs use their
// workspaces), at most kMaxPlans distinct batch sizes (the engine uses power-of-two buckets:
// at most 17); one more is an error naming the limit.
//
// Types: bf16 or fp16 (X, W, Y of that type, fp32 accumulation), or int8 (X and W int8, int32
// accumulation, Y int8 requantized by `alpha`, or bf16 scaled by `alpha`).
//
// cuSPARSELt is loaded at run time (dlopen of libcusparseLt.so.0: the loader's path, then the
// copy found at build time), so that builds and binaries without it work and only the sparse
// path says why it is unavailable. The build needs its header (the nvidia-cusparselt-cu13 wheel,
// requirements-cuda.txt); without it, available() says so.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dlrec/core/tensor.h"

namespace dlrec::nn::cuda_sparse {

// Whether 2:4 GEMMs can run here: the build had cuSPARSELt's header and the library loads. On
// false, `why` (if given) says what is missing.
bool available(std::string* why = nullptr);

enum class Type { BF16, FP16, INT8 };
// How the activations are stored (row-major):
//   RowMajor:        X [batch, in] -> Y [batch, out], as the engine's layers store them;
//   FeatureMajor:    X^T [in, batch] -> Y^T [out, batch];
//   FeatureMajorOut: X [batch, in] -> Y^T [out, batch] (PyTorch's semi-structured F.linear).
enum class Layout { RowMajor, FeatureMajor, FeatureMajorOut };
const char* type_name(Type t);

class Gemm24 {
 public:
  // A GEMM with weights [out, in]; throws (with the reason) when cuSPARSELt is unavailable or
  // refuses the shape.
  // int8_to_bf16: with Type::INT8, Y is bf16 (alpha * the int32 sums) instead of int8.
  Gemm24(int64_t out, int64_t in, Type type, Layout layout = Layout::RowMajor,
         bool int8_to_bf16 = false);
  ~Gemm24();
  Gemm24(const Gemm24&) = delete;
  Gemm24& operator=(const Gemm24&) = delete;

  // Checks that w (device, row-major [out, in] of the type) is 2:4 along `in` (an error
  // otherwise) and keeps its compressed form. Synchronizes `stream`.
  void set_weight(const void* w, cudaStream_t stream);
  // Prunes w (device, row-major [out, in]) in place to 2:4 with the library's own rule (in each
  // group of 4 along `in`, the 2 largest magnitudes kept).
  void prune(void* w, cudaStream_t stream);
  // Y = alpha * X W^T on `stream` (x and y on the device, of the type, stored as the layout
  // says).
  void run(const void* x, void* y, int64_t batch, cudaStream_t stream, float alpha = 1.f);
  // The epilogue of every later plan (call before the first run()): alpha_vec (device [out],
  // float): one alpha per output feature instead of run()'s scalar (cuSPARSELt's
  // ALPHA_VECTOR_SCALING); bias (device [out]): added after the scale, of the output's type
  // (bf16/fp16; f32 when the output is int8); relu: max(., 0) last. The int8 output rounds to
  // nearest and saturates. Throws if plans exist already.
  struct Epilogue {
    const float* alpha_vec = nullptr;
    const void* bias = nullptr;
    bool relu = false;
  };
  void set_epilogue(const Epilogue& e);
  // Bytes of the compressed weight (values and metadata).
  size_t compressed_bytes() const { return compressed_bytes_; }

 private:
  struct State;
  struct Plan;
  Plan& plan(int64_t batch, const void* x, void* y, cudaStream_t stream);
  int64_t out_, in_;
  Type type_;
  bool int8_to_bf16_ = false;
  Epilogue epi_;
  Layout layout_ = Layout::RowMajor;
  std::unique_ptr<State> s_;
  static constexpr size_t kMaxPlans = 64;
  std::map<int64_t, std::unique_ptr<Plan>> plans_;
  Tensor compressed_;  // the compressed weight (device bytes)
  size_t compressed_bytes_ = 0;
};

}  // namespace dlrec::nn::cuda_sparse
