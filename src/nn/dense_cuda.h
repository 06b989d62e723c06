// Internal: CUDA kernels of the dense part of the model (bias/ReLU epilogues, interactions,
// BCE loss, dense optimizer steps). Launchers enqueue on `stream` and never synchronise.
// Arithmetic that the CPU reference does as a separate multiply and add is rounded the same way
// here (no fused multiply-add), so that fp32 runs track the CPU closely.
// Defined in dense_cuda.cu (element-wise passes, BCE, loss scaling, optimizer steps),
// interaction_cuda.cu (dot and concat interactions) and skinny_linear_cuda.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dlrec::nn::cuda_dense {

using bf16 = __nv_bfloat16;
using f16 = __half;  // fp16 mode (with loss scaling); every bf16 launcher below has an f16 twin

// y [B, ld] (bf16 or f16) = x [B, cols] (f32), columns cols..ld-1 set to 0 (GEMM-aligned
// padding).
void to_half_padded(const float* x, int64_t B, int64_t cols, bf16* y, int64_t ld,
                    cudaStream_t stream);
void to_half_padded(const float* x, int64_t B, int64_t cols, f16* y, int64_t ld,
                    cudaStream_t stream);

// Inference layer for a handful of rows (serving at batch 1..kSkinnyRows), where a GEMM runs
// a few thread blocks over the whole weight matrix: one warp per output, 16-byte loads.
// y [R, out] = x [R, k] W^T + b, then ReLU when relu; W [out, k] row-major and x [R, k], both
// 16-bit with k a multiple of 8 and 16-byte aligned rows; sums in f32. With f32_out, b and y are
// f32, else 16-bit like x. Returns false (nothing enqueued) when R or the alignment is outside
// that contract.
constexpr int64_t kSkinnyRows = 8;
bool skinny_linear(const bf16* w, const bf16* x, int64_t R, int64_t out, int64_t k,
                   const void* b, bool relu, void* y, bool f32_out, cudaStream_t stream);
bool skinny_linear(const f16* w, const f16* x, int64_t R, int64_t out, int64_t k,
                   const void* b, bool relu, void* y, bool f32_out, cudaStream_t stream);

// y [B, out] += b (per column), then ReLU when relu.
void bias_act(float* y, const float* b, int64_t B, int64_t out, bool relu, cudaStream_t stream);
void bias_act(bf16* y, const bf16* b, int64_t B, int64_t out, bool relu, cudaStream_t stream);
void bias_act(f16* y, const f16* b, int64_t B, int64_t out, bool relu, cudaStream_t stream);
// Backward of bias (+ ReLU) for dy [B, out]: with y given, dz = dy where y > 0 else 0 (dz is
// unused when y is null: then dz = dy); db [out] = column sums of dz, summed in a fixed order
// (deterministic) through `partial` [bias_grad_chunks(B), out]. 16-bit types with out % 8 == 0
// and 16-byte aligned rows read 8 columns per thread (the same sums in the same order as one
// column per thread, which the other cases use).
int64_t bias_grad_chunks(int64_t B);
void mask_bias_grad(const float* dy, const float* y, float* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream);
void mask_bias_grad(const bf16* dy, const bf16* y, bf16* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream);
void mask_bias_grad(const f16* dy, const f16* y, f16* dz, float* partial, float* db,
                    int64_t B, int64_t out, cudaStream_t stream);
// The same with the ReLU mask as bits instead of y: dz = dy where the bit is set, else 0. `bits`
// is the mask a cuBLASLt RELU_AUX(_BIAS) epilogue writes beside a [out, B] column-major output
// (one sample per column), a column-major bit matrix whose leading dimension bits_ld (in bits)
// is a multiple of 128 and >= out: row r's bit for column c is bit c % 8 (least significant
// first) of byte r * bits_ld / 8 + c / 8 (checked against cuBLASLt on an H100). cuBLASLt sets
// the bit where its pre-activation is >= 0, so the bits are y > 0 except where that is exactly
// 0 (bit set, y = 0) and, for some shapes, at a few more elements (25 of 100,000 in a 100-wide
// test). The sums are in the same order as the y form's. mask_bits_launches(): how many such
// passes were enqueued in this process (for tests).
void mask_bias_grad_bits(const bf16* dy, const uint8_t* bits, int64_t bits_ld, bf16* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream);
void mask_bias_grad_bits(const f16* dy, const uint8_t* bits, int64_t bits_ld, f16* dz,
                         float* partial, float* db, int64_t B, int64_t out, cudaStream_t stream);
int64_t mask_bits_launches();
// dz = dy where y > 0, else 0 (all [n]).
void relu_mask(const float* dy, const float* y, float* dz, int64_t n, cudaStream_t stream);
void relu_mask(const bf16* dy, const bf16* y, bf16* dz, int64_t n, cudaStream_t stream);
void relu_mask(const f16* dy, const f16* y, f16* dz, int64_t n, cudaStream_t stream);

// Dot interaction over elements E (float, bf16 or f16, the 16-bit types on tensor cores;
// products and sums in float, in the CPU's order): Z_b = [dense_b; emb_b,0..T-1] (n = T + 1 rows of dim d);
// out [B, ld_out] = [dense, strict lower triangle of Z Z^T row-major] (F = d + n(n-1)/2
// values, then zeros up to ld_out >= F).
template <class E>
void dot_forward(const E* dense, const E* emb, int64_t B, int T, int d, E* out, int64_t ld_out,
                 cudaStream_t stream);
// dout [B, ld_out] -> d_dense [B, d] (pass-through + dZ_0; masked by dense > 0 when
// relu_dense, i.e. the ReLU of the layer that produced `dense` is applied here), d_emb
// [B, T, d] in G (float or bf16).
template <class E, class G>
void dot_backward(const E* dense, const E* emb, const E* dout, int64_t ld_out, int64_t B, int T,
                  int d, bool relu_dense, E* d_dense, G* d_emb, cudaStream_t stream);
// Cat interaction: out [B, dd + T d] = [dense, emb flattened]; backward splits.
void cat_forward(const float* dense, const float* emb, int64_t B, int dd, int64_t E, float* out,
                 cudaStream_t stream);
void cat_backward(const float* dout, int64_t B, int dd, int64_t E, float* d_dense, float* d_emb,
                  cudaStream_t stream);

// Mean BCE-with-logits over n samples: *loss (double, device) and dlogits = (sigmoid - y) / n.
// y = 1 / (1 + exp(-x)) over n values.
void sigmoid(const float* x, float* y, int64_t n, cudaStream_t stream);

// With dlogits_h, dL/dlogits is also written as bf16 (for bf16 backward GEMMs); the f16 form
// writes it multiplied by the loss scale *loss_scale (device), for fp16 backward GEMMs. With
// `mse` the loss is the mean squared error of the outputs instead (train.loss "mse"). `denom`
// > 0 divides by it instead of n (data-parallel: the n rows are part of a global batch of denom
// rows; *loss is then this part's share of the global mean).
void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream, bf16* dlogits_h = nullptr,
                     bool mse = false, int64_t denom = 0);
void bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                     double* loss, cudaStream_t stream, f16* dlogits_h, const float* loss_scale,
                     bool mse = false);
// The distillation loss (compress.distill; CPU reference compress::distill_loss, in double as
// there): *loss = mean of alpha BCE(z, y) + (1 - alpha) BCE(z / T, sigmoid(t / T)) and its
// gradient, t the teacher's logits (device, n values).
void distill_with_logits(const float* logits, const float* labels, const float* teacher,
                         int64_t n, double alpha, double temperature, float* dlogits,
                         double* loss, cudaStream_t stream);
// y [n] (f16) = x [n] (f32) * *scale (device).
void scale_to_f16(const float* x, int64_t n, const float* scale, f16* y, cudaStream_t stream);

// Dense optimizer steps (SGD when state is null, else Adagrad with accumulator `state`) on a
// [rows, cols] parameter w (and state) whose gradient rows are ldg apart; the learning rate is
// read from device memory (*lr), so a captured CUDA graph follows the schedule. With wh, the
// updated weights are also written as bf16 (or f16) into wh [rows, ldh] (the compute copy).
// With gscale (device; loss scaling), the gradient is multiplied by *gscale first, and
// *gscale == 0 skips the update (an overflowed step). With mask (device F32 0/1 [rows, cols]; 2:4
// pruning), a value whose mask is 0 is written as 0 after its update (the state still evolves),
// as the CPU's Optimizer::step does.
void optimizer_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, bf16* wh, int64_t ldh, const float* lr, float eps,
                    cudaStream_t stream, const float* gscale = nullptr,
                    const float* mask = nullptr);
void optimizer_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                    int64_t ldg, f16* wh, int64_t ldh, const float* lr, float eps,
                    cudaStream_t stream, const float* gscale = nullptr,
                    const float* mask = nullptr);

// SGD with momentum, nn::Optimizer's "sgd" with `momentum` > 0: velocity b (state, the
// parameter's shape) = mu b + g, then w -= lr b, or with nesterov w -= lr (g + mu b). Arguments
// as optimizer_step's.
void momentum_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                   int64_t ldg, bf16* wh, int64_t ldh, const float* lr, float mu, bool nesterov,
                   cudaStream_t stream, const float* gscale = nullptr, const float* mask = nullptr);
void momentum_step(float* w, const float* g, float* state, int64_t rows, int64_t cols,
                   int64_t ldg, f16* wh, int64_t ldh, const float* lr, float mu, bool nesterov,
                   cudaStream_t stream, const float* gscale = nullptr, const float* mask = nullptr);

// Adam, nn::Optimizer's "adam" with the CPU's state layout and arithmetic: state
// [rows, 2 * cols + 1], per row m [cols], v [cols] and the row's step count t (a bias [n] is n
// rows of one column). Per row t += 1 (up to 2^24), c1 = 1 - beta1^t, c2 = 1 - beta2^t (double,
// rounded to float); per value, with weight_decay > 0 first w -= lr * weight_decay * w
// (decoupled, AdamW), then m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g g,
// w -= (lr / c1) m / (sqrt(v) / sqrt(c2) + eps) (nn/optimizer_math_cuda.cuh). Gradient rows ldg
// apart; wh, gscale and mask as optimizer_step's (*gscale == 0: neither the values nor t move).
struct AdamParams {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
};
void adam_step(float* w, const float* g, float* state, int64_t rows, int64_t cols, int64_t ldg,
               bf16* wh, int64_t ldh, const float* lr, const AdamParams& p, cudaStream_t stream,
               const float* gscale = nullptr, const float* mask = nullptr);
void adam_step(float* w, const float* g, float* state, int64_t rows, int64_t cols, int64_t ldg,
               f16* wh, int64_t ldh, const float* lr, const AdamParams& p, cudaStream_t stream,
               const float* gscale = nullptr, const float* mask = nullptr);

// Dynamic loss scaling (fp16 mode), all state on the device so a CUDA graph can replay it.
struct LossScale {
  float* scale = nullptr;   // the loss scale S: dL/dlogits is multiplied by it
  float* gscale = nullptr;  // this step's gradient factor: 1 / S, or 0 when the step overflowed
  int* overflow = nullptr;  // set by check_finite when a gradient holds Inf/NaN
  int* good_steps = nullptr;
  int64_t* skipped = nullptr;  // steps skipped so far
};
// Sets *overflow when any of the n_tensors float arrays (device arrays of pointers and
// element counts) holds a non-finite value.
void check_finite(const float* const* ptrs, const int64_t* counts, int n_tensors, int* overflow,
                  cudaStream_t stream);
void check_finite(const float* p, int64_t n, int* overflow, cudaStream_t stream);
void check_finite(const f16* p, int64_t n, int* overflow, cudaStream_t stream);
// x [n] *= *scale (device): the graph engine's dL/dlogits (f32) times the loss scale.
void scale_inplace(float* x, int64_t n, const float* scale, cudaStream_t stream);
// After the checks: gscale = overflow ? 0 : 1 / S; on overflow S halves (not below 1) and the
// good-step count restarts, else after `growth_interval` good steps in a row S doubles (up to
// 2^24); overflow is cleared for the next step.
void loss_scale_update(const LossScale& ls, int growth_interval, cudaStream_t stream);

}  // namespace dlrec::nn::cuda_dense
