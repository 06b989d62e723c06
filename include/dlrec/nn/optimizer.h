// Optimizers for dense parameters and sparse embedding rows (F32, CPU).
//
//   sgd:      w -= lr * g
//   adagrad:  a += g * g;  w -= lr * g / (sqrt(a) + eps)   (element-wise accumulator a, the
//             parameter's state, starting at `initial_accumulator`)
// Sparse steps touch only the rows of the gradient; rows absent from the batch keep their
// weights and their accumulator.
#pragma once

#include <string>

#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/param.h"

namespace dlrec::nn {

enum class OptimizerKind { SGD, Adagrad };
OptimizerKind parse_optimizer(const std::string& s);  // "sgd" | "adagrad"

class Optimizer {
 public:
  explicit Optimizer(OptimizerKind kind, float eps = 1e-8f, float initial_accumulator = 0.f);

  // Allocates p.state for the kind (Adagrad: filled with initial_accumulator; SGD: none).
  void init_state(Param& p) const;
  // Dense step with p.grad.
  void step(Param& p, float lr) const;
  // Sparse step on the rows of a table [rows, dim]; ids must be distinct (SparseGrad's are),
  // which makes the parallel update race-free.
  void step_sparse(Param& table, const SparseGrad& g, float lr) const;

  OptimizerKind kind() const { return kind_; }
  bool has_state() const { return kind_ == OptimizerKind::Adagrad; }

 private:
  OptimizerKind kind_;
  float eps_, init_;
};

}  // namespace dlrec::nn
