// The CPU graph engine's layer interface (src/model/graph_model.cc runs the nodes; each layer
// type's node is in src/model/layers/<type>.cc). Every node computes in fp32 on the thread pool
// and is the reference the CUDA nodes are compared with (tests/parity).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/dist/planner.h"
#include "dlrec/embedding/hashed_embedding.h"
#include "dlrec/io/batch.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/optimizer.h"
#include "model/layers/layer.h"

namespace dlrec::model::cpu_graph {

// A dense parameter with its optimizer and learning rate (before the schedule).
struct DenseRef {
  std::string name;
  nn::Param* p;
  const nn::Optimizer* opt;
  double lr;
};
// A table: fixed (p) or hashed (h, with the flag that says its tensors were handed out).
struct TableRef {
  std::string name;  // "<layer>.<feature>"
  nn::Param* p = nullptr;
  nn::EmbeddingBag* bag = nullptr;  // a fixed table of the embedding layer (reads codes too)
  embedding::HashedEmbedding* h = nullptr;
  bool* handed_out = nullptr;
  const nn::Optimizer* opt = nullptr;  // fixed tables (hashed ones keep theirs)
};
// How one table of an embedding or wide layer is set up.
struct TableSetup {
  int64_t feature = 0, dim = 1;
  const nn::Optimizer* opt = nullptr;
  double lr = 0;
  bool hashed = false;
  embedding::HashedEmbeddingOptions hashed_options;
};

// What Model::shard_tables asks of a layer with tables.
struct ShardingRequest {
  dist::Communicator* comm = nullptr;
  const dist::PlannerOptions* options = nullptr;  // dense_bytes filled in by the model
  const std::vector<double>* ids_per_sample = nullptr;
  std::FILE* plan_log = nullptr;
};

class Node {
 public:
  virtual ~Node() = default;
  // in: the inputs' outputs. Returns [B, shape.width] (a buffer valid until the next forward).
  virtual const Tensor& forward(const std::vector<const Tensor*>& in, const io::Batch& b,
                                bool training) = 0;
  // dout [B, width] -> dins[i] for the inputs with need[i]; the parameters' gradients (dense
  // grads in Param::grad, sparse ones kept by the tables).
  virtual void backward(const Tensor& dout, const std::vector<bool>& need,
                        std::vector<Tensor>& dins) = 0;
  // Applies the tables' optimizers to their rows of the last backward (lr times lr_scale).
  virtual void step_tables(double /*lr_scale*/) {}
  // Data-parallel training: whether the layer's tables can reduce their sparse gradients, and
  // the reduction (after backward, before step_tables; table by table, on the calling thread).
  virtual bool can_reduce_table_grads() const { return false; }
  // Sharded embeddings (Model::shard_tables): whether the layer sharded its tables; and the
  // whole copies of sharded tables for checkpoints (Model::gather_sharded_tables, ...).
  virtual bool shard_tables(const ShardingRequest& /*request*/) { return false; }
  virtual void gather_sharded_tables() {}
  virtual void scatter_sharded_tables() {}
  virtual void release_sharded_tables() {}
  virtual void reduce_table_grads(GradientReducer& /*reducer*/) {}
  // Dense parameters (the model steps them) and tables (step_tables).
  virtual void collect(std::vector<DenseRef>& /*dense*/, std::vector<TableRef>& /*tables*/) {}
  ValueShape shape;
  // The optimizer of the layer's dense parameters (set by the model after construction).
  const nn::Optimizer* dense_opt = nullptr;
  double dense_lr = 0;
};

// What a layer's make_cpu gets.
struct Build {
  const LayerSpec& spec;
  const std::vector<ValueShape>& in;  // the inputs' shapes
  const ValueShape& shape;            // the output's (LayerType::infer)
  const io::ShardLayout& layout;
  uint64_t seed;  // the layer's stream: derive_seed(run seed, init_tag)
  // Table layers: the tables of `features` with widths `dims` (optimizers, hashed or fixed).
  std::function<std::vector<TableSetup>(const std::vector<int64_t>& features,
                                        const std::vector<int64_t>& dims)>
      tables;
};

// Copies each input [B, w_i] side by side into out [B, sum w_i].
void concat_cols(const std::vector<const Tensor*>& in, Tensor& out);
// Copies columns [c0, c0 + w) of src [B, Ws] into dst [B, w].
void slice_cols(const Tensor& src, int64_t c0, int64_t w, Tensor& dst);
// Splits dout [B, sum w_i] into the needed inputs' gradients (buffers owned by the caller).
void split_cols(const Tensor& dout, const std::vector<int64_t>& widths,
                const std::vector<bool>& need, std::vector<Tensor>& bufs,
                std::vector<Tensor>& dins);

}  // namespace dlrec::model::cpu_graph
