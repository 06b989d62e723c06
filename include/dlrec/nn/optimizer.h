// Optimizers for dense parameters and sparse embedding rows (F32, CPU).
//
// An Optimizer is stateless itself: the state of a parameter lives in Param::state, one F32
// tensor whose layout the kind defines. "Rows" are the first dimension of the parameter
// (a table's rows; a Linear weight's output rows; a bias [n] has n rows of 1 value) and C is
// the number of values per row (numel / rows).
//
//   kind              state (name suffix, shape)            update of one value (g: its gradient)
//   sgd               none (momentum = 0)                   w -= lr * g
//                     ".momentum", param shape              b = mu * b + g;  w -= lr * b
//                                                           (nesterov: w -= lr * (g + mu * b))
//   adagrad           ".adagrad", param shape               a += g^2;  w -= lr * g / (sqrt(a) + eps)
//   rowwise_adagrad   ".rowwise_adagrad", [rows]            per row: a += mean over the row of g^2;
//                                                           w -= lr * g / (sqrt(a) + eps)
//                                                           (TorchRec/FBGEMM EXACT_ROWWISE_ADAGRAD)
//   adam              ".adam", [rows, 2C + 1]               row r holds m (C values), v (C values)
//                                                           and its step count t:
//                                                           t += 1; m = b1 m + (1 - b1) g;
//                                                           v = b2 v + (1 - b2) g^2;
//                                                           w -= lr * (m / (1 - b1^t)) /
//                                                                (sqrt(v / (1 - b2^t)) + eps)
//   ftrl              ".ftrl", [rows, 2C]                   FTRL-Proximal (McMahan et al. 2013)
//                                                           with alpha = lr: row r holds z and n:
//                                                           s = (sqrt(n + g^2) - sqrt(n)) / alpha;
//                                                           z += g - s * w;  n += g^2;
//                                                           w = |z| <= l1 ? 0 :
//                                                             -(z - sign(z) l1) /
//                                                              ((beta + sqrt(n)) / alpha + l2)
//                                                           (a step with lr = 0 does nothing)
//
// Dense steps (step, step_dense) update every value. Sparse steps (step_sparse) update only the
// rows of the gradient: the weights and the state of every other row stay exactly as they
// are. For momentum this means a row's velocity decays only when the row is in a batch; for
// Adam it is the "lazy" variant (TensorFlow's LazyAdam, PyTorch's SparseAdam): m, v and the
// step count t of a row advance only when the row is in the batch, and the bias correction
// uses the row's own t, so the first update of a row is the same whatever step it happens at
// (with a global t, a row first seen late would get an update up to
// (1 - b1) / sqrt(1 - b2) ~ 3x larger than Adam's first step). A dense Adam step advances the t
// of every row; the count is a float, exact up to 2^24 steps (beyond, it stays there, where
// both corrections are exactly 1 in float arithmetic).
//
// Gradient transformations, in this order, before the update:
//   1. grad_scale (step only): the factor global-norm clipping computed (step_dense).
//   2. clip_value > 0: every gradient value clamped to [-clip_value, clip_value]; applies to
//      dense and sparse (embedding) gradients alike.
//   3. weight_decay > 0, dense steps only (embedding rows never decay): adam: decoupled
//      (AdamW): w -= lr * weight_decay * w before the update; every other kind: L2 added to
//      the gradient, g += weight_decay * w.
// Global-norm clipping (clip_norm > 0, step_dense only): the L2 norm of all the given dense
// gradients together; when it exceeds clip_norm every dense gradient is scaled by
// clip_norm / norm. Embedding gradients are not part of the norm and are never scaled by it
// (they are applied table by table, fused with the backward pass); clip them by value.
// The gradient tensors themselves are never modified.
// Masks (Param::mask, 2:4 pruning, docs/COMPRESSION.md): after a dense step, every value whose
// mask is 0 is set to 0 (its optimizer state keeps evolving but never reaches the weight).
//
// All updates are element-wise or row-local, so results are bit-identical for any thread count.
#pragma once

#include <string>
#include <vector>

#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/param.h"

namespace dlrec::nn {

// The widest row the CUDA tables' rowwise_adagrad update takes (src/nn/embedding_backward_cuda.cu: the
// row in a warp's registers, up to 4 slices a lane of 4 values when the dim is a multiple of 4,
// else of 1 value): 512, else 128.
inline int64_t cuda_rowwise_max_dim(int64_t dim) { return dim % 4 == 0 ? 512 : 128; }

enum class OptimizerKind { SGD, Adagrad, RowWiseAdagrad, Adam, FTRL };
// "sgd" | "adagrad" | "rowwise_adagrad" | "adam" | "ftrl"
OptimizerKind parse_optimizer(const std::string& s);
const char* optimizer_name(OptimizerKind k);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::SGD;
  // sgd
  float momentum = 0.f;  // [0, 1)
  bool nesterov = false;  // needs momentum > 0
  // adagrad, rowwise_adagrad
  float adagrad_eps = 1e-8f;
  float initial_accumulator = 0.f;
  // adam
  float beta1 = 0.9f, beta2 = 0.999f;  // [0, 1)
  float adam_eps = 1e-8f;
  // ftrl (alpha is the learning rate passed to the step)
  float ftrl_beta = 1.f;
  float ftrl_l1 = 0.f, ftrl_l2 = 0.f;
  float ftrl_init = 0.f;  // initial n
  // all kinds
  float weight_decay = 0.f;  // dense steps only
  float clip_value = 0.f;    // 0: off
  float clip_norm = 0.f;     // 0: off; step_dense only
  // Throws (naming the field) on a value out of range.
  void validate() const;
};

class Optimizer {
 public:
  explicit Optimizer(const OptimizerOptions& options);
  // The historical constructor: SGD or Adagrad with its eps and initial accumulator.
  explicit Optimizer(OptimizerKind kind, float eps = 1e-8f, float initial_accumulator = 0.f);

  // Allocates p.state for the kind (see the table above; undefined for plain SGD).
  void init_state(Param& p) const;
  // Dense step with p.grad (its gradient multiplied by grad_scale first).
  void step(Param& p, float lr, float grad_scale = 1.f) const;
  // Dense step of several parameters with global-norm clipping (clip_norm) over all their
  // gradients. Returns the gradients' global L2 norm before clipping (computed only when
  // clip_norm > 0; else 0).
  double step_dense(const std::vector<Param*>& params, float lr) const;
  // Sparse step on the rows of a table [rows, dim]; ids must be distinct (SparseGrad's are),
  // which makes the parallel update race-free. No weight decay.
  void step_sparse(Param& table, const SparseGrad& g, float lr) const;
  // One row of `dim` values with its state row (state_row_size(dim) floats), for tables that
  // keep their rows elsewhere (hashed embeddings). No weight decay.
  void step_row(float* w, float* state, const float* g, int64_t dim, float lr) const;
  // Floats of state per row of `dim` values (0 for plain SGD).
  int64_t state_row_size(int64_t dim) const;
  // Writes the initial state of one row (state_row_size(dim) floats).
  void init_state_row(float* state, int64_t dim) const;

  OptimizerKind kind() const { return o_.kind; }
  const OptimizerOptions& options() const { return o_; }
  bool has_state() const { return state_row_size(1) > 0; }
  // The checkpoint name suffix of the state (".adagrad", ".adam", ...; "" without state).
  std::string state_suffix() const;

  // The L2 norm of the gradients of `params` (double accumulation in a fixed order).
  static double grad_norm(const std::vector<Param*>& params);

 private:
  OptimizerOptions o_;
};

}  // namespace dlrec::nn
