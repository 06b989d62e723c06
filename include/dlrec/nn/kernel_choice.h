// The per-layer kernel choice of compressed models on the CUDA engine (docs/COMPRESSION.md,
// "Compressed layers on the GPU"): which GEMM kernels a layer may run, and which one it keeps.
// Plain C++ (no CUDA): the CUDA side (src/nn/compressed_linear_cuda.cu) times the candidates,
// this part decides, so the decision is tested in CPU builds too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrec::nn::kernel_choice {

enum class Kernel {
  Dense,        // the engine's own GEMM (cuBLASLt, bias/ReLU in its epilogue) on the 16-bit
                // (or fp32) weights
  Sparse24,     // cuSPARSELt 2:4 in the engine's 16-bit type, bias/ReLU in its epilogue
  Int8,         // cuBLASLt int8 x int8 (16-bit engines: the epilogue forms where cuBLASLt has
                // them; else quantize, int32 GEMM, dequantize/bias/ReLU kernels)
  Sparse24Int8  // cuSPARSELt 2:4 int8 x int8 (bf16: alpha vector/bias/ReLU in its epilogue)
};
const char* kernel_name(Kernel k);  // "dense", "2:4", "int8", "2:4-int8"

// How a model picks: Fastest (time every available candidate at the batch size, keep the
// fastest; dense is always one), Compressed (the most compressed available candidate, no
// timing: 2:4-int8, else int8, else 2:4, else dense; for checking the arithmetic), Dense.
enum class Policy { Fastest, Compressed, Dense };
Policy parse_policy(const std::string& s, const std::string& what);  // "fastest", ...
const char* policy_name(Policy p);

struct Candidate {
  Kernel kernel = Kernel::Dense;
  bool available = true;
  std::string why;  // why not, when unavailable; a note (where it runs) when available
  double ms = -1;   // timed milliseconds per call (< 0: not timed)
};

// What a layer could run: dense always; 2:4 when masked and the engine computes in 16 bits;
// int8 when it has an INT8 record; 2:4-int8 when both. Candidates that need cuSPARSELt are
// marked unavailable with `sparse_why` when !sparse_ok.
std::vector<Candidate> candidates(bool masked, bool quantized, bool half_engine, bool sparse_ok,
                                  const std::string& sparse_why);

// Under Fastest a compressed kernel replaces dense only where its time is at most
// (1 - kMinGain) of dense's: each is timed alone, and a near-tie there was seen to lose inside
// the forward (a DCNv2 bottom layer's 2:4 kernel, 3 % faster alone at 2048 rows, took twice
// dense's time between its neighbours; bench/RESULTS.md).
constexpr double kMinGain = 0.05;

// The index of the kernel to keep: under Fastest the available timed candidate with the least
// time if it beats dense by kMinGain, else dense (also when dense was not timed); under
// Compressed the most compressed available one; under Dense the dense one. candidates[0] must
// be the dense one.
size_t choose(const std::vector<Candidate>& c, Policy p);

// Checks that a mask (0/1 values of a weight [out, in], row-major) is 2:4 along `in`: at most 2
// of every group of 4 consecutive values kept (a last partial group at most 2 as well). Throws
// dlrec::Error naming `layer`, the row and the group's first column otherwise.
void check_mask_2_4(const std::string& layer, const float* mask, int64_t out, int64_t in);

// One line per candidate: "top.0.weight [B=2048]: int8 0.012 ms*, dense 0.020 ms, 2:4 n/a (...)"
std::string describe(const std::string& layer, int64_t rows, const std::vector<Candidate>& c,
                     size_t chosen);

}  // namespace dlrec::nn::kernel_choice
