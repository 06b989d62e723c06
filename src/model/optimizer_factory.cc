#include "dlrec/model/optimizer_factory.h"

namespace dlrec::model {

nn::OptimizerOptions optimizer_options(const OptimizerConfig& c) {
  nn::OptimizerOptions o;
  o.kind = nn::parse_optimizer(c.type);
  o.momentum = static_cast<float>(c.momentum);
  o.nesterov = c.nesterov;
  o.adagrad_eps = static_cast<float>(c.adagrad_eps);
  o.initial_accumulator = static_cast<float>(c.adagrad_init);
  o.beta1 = static_cast<float>(c.beta1);
  o.beta2 = static_cast<float>(c.beta2);
  o.adam_eps = static_cast<float>(c.adam_eps);
  o.ftrl_beta = static_cast<float>(c.ftrl_beta);
  o.ftrl_l1 = static_cast<float>(c.ftrl_l1);
  o.ftrl_l2 = static_cast<float>(c.ftrl_l2);
  o.weight_decay = static_cast<float>(c.weight_decay);
  o.clip_value = static_cast<float>(c.clip_value);
  o.clip_norm = static_cast<float>(c.clip_norm);
  return o;
}

nn::Optimizer make_dense_optimizer(const OptimizerConfig& c) {
  return nn::Optimizer(optimizer_options(c));
}

nn::Optimizer make_embedding_optimizer(const OptimizerConfig& c) {
  nn::OptimizerOptions o = optimizer_options(c.embedding_config());
  o.weight_decay = 0.f;
  o.clip_norm = 0.f;
  return nn::Optimizer(o);
}

}  // namespace dlrec::model
