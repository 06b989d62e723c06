// The small model whose checkpoints and weights the tensor-file fuzz target loads, shared with
// the seed generator (tests/fuzz/make_fuzz_seeds.cc) so that the seeds match it exactly.
#pragma once

#include <memory>

#include "dlrec/core/config.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/model.h"

namespace dlrec::fuzz {

inline model::RunConfig tiny_config() {
  return model::RunConfig::from_json(json::parse(R"({
    "model": {"embedding_dim": 4, "bottom_mlp": [4], "top_mlp": [4, 1]},
    "optimizer": {"type": "adagrad", "lr": 0.05}})"));
}

inline io::ShardLayout tiny_layout() {
  io::ShardLayout l;
  l.num_dense = 2;
  l.cardinalities = {5, 300};
  l.multi_hot = {false, true};
  return l;
}

inline std::unique_ptr<model::Model> tiny_model() {
  const model::RunConfig c = tiny_config();
  return model::build_model(c.model, c.optimizer, tiny_layout(), Device::cpu(), 7);
}

}  // namespace dlrec::fuzz
