// Builds nn::Optimizers from the run's optimizer section (docs/CONFIG.md, `optimizer`).
//
// A model keeps two optimizers: one for its dense layers (make_dense_optimizer: weight decay and
// global-norm clipping apply) and one for its embedding tables (make_embedding_optimizer: the
// `optimizer.embedding` override when present; never weight decay or global-norm clipping).
// Learning rates at step s: dense_lr(c) * schedule factor, embedding_lr(c) * schedule factor.
//
//   nn::Optimizer dense = make_dense_optimizer(cfg), emb = make_embedding_optimizer(cfg);
//   for (Param* p : dense_params) dense.init_state(*p);   // once
//   dense.step_dense(dense_params, lr * factor);          // each step, after backward
//   emb.step_sparse(table, sparse_grad, emb_lr * factor);
//   state tensors: "<param name>" + opt.state_suffix() (none when !opt.has_state())
#pragma once

#include "dlrec/model/model.h"
#include "dlrec/nn/optimizer.h"

namespace dlrec::model {

// The nn options of one configuration (all its hyperparameters, as they are).
nn::OptimizerOptions optimizer_options(const OptimizerConfig& c);
nn::Optimizer make_dense_optimizer(const OptimizerConfig& c);
nn::Optimizer make_embedding_optimizer(const OptimizerConfig& c);
inline double dense_lr(const OptimizerConfig& c) { return c.lr; }
inline double embedding_lr(const OptimizerConfig& c) { return c.embedding_lr_value(); }

}  // namespace dlrec::model
