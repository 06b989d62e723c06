// ShardedEmbedding: a set of embedding tables spread over the ranks of a Communicator by a
// sharding Plan (planner.h), with the forward and backward exchanges of the pooled vectors.
//
// Every rank holds the shards the plan gives it and pools its own batch (B samples; rank r's
// samples are the global samples after those of ranks 0..r-1, so the global batch is the
// ranks' batches in rank order). One step:
//
//   forward   1. all-to-all of the bag lengths and ids: each id goes to the rank(s) holding
//               its row (table_wise: the owner; row_wise: rank id % N, as local row id / N;
//               column_wise: every column owner); replicated tables stay local;
//            2. each owner pools the bags of the whole global batch on its shard (sum);
//            3. all-to-all of the pooled vectors back to the ranks the samples belong to,
//               which add the row-wise partial sums in rank order, place column slices side by
//               side and apply mean pooling;
//   backward 4. all-to-all of the gradients of the pooled vectors (mean pooling's 1/len
//               applied first) to the owners, which turn them into sparse row gradients
//               exactly as nn::EmbeddingBag does (contributions summed in global sample order);
//               replicated tables all-gather the ids and gradients of every rank so that every
//               rank computes the same global sparse gradient;
//   step     5. each owner applies the sparse optimizer to its shard (the fused update of the
//               single-process model); replicated tables are updated identically everywhere.
//
// Equivalence with one unsharded nn::EmbeddingBag per table (fp32, same seed): the weights
// after any number of steps are bit-identical for every kind (gradients are summed in the
// same order, optimizers are row- or element-local); the pooled forward values are
// bit-identical except for row-wise tables, whose per-rank partial sums are added in rank
// order (within 1e-6 relative of the single-process sum).
//
// Hybrid tables (docs/DISTRIBUTED.md, "Hybrid embedding"): ids [0, F) (the most frequent after
// Categorify) are replicated on every rank and pooled locally; ids >= F are split by rows over
// the ranks (rank (id - F) % N) and exchanged as above, but only for the bags that hold such an
// id; the pooled row is the sum of the two parts. Backward: the frequent rows' gradients are
// summed into a dense [F, dim] block on each rank and all-reduced, the rare ones go to their
// owners. Summed in another order than one process, so equal to it within rounding, not bit
// for bit.
//
// This is the CPU reference (buffers on the host, any host Communicator: single or MPI). A
// CUDA version keeps the same exchange layout with device buffers and the NCCL communicator;
// the layout helpers (who sends what to whom) are shared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/dist/planner.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/optimizer.h"

namespace dlrec::dist {

// One table of a ShardedEmbedding.
struct ShardedTableConfig {
  TableSpec spec;     // name, rows, dim (value_bytes must be 4: fp32 tables)
  uint64_t seed = 0;  // values as nn::EmbeddingBag(rows, dim).init(seed) would give
  nn::Pooling pooling = nn::Pooling::Sum;
  std::shared_ptr<const nn::Optimizer> optimizer;  // sparse optimizer of the table
};

// One rank's bags of one table: sample r's ids are indices[offsets[r] .. offsets[r + 1]).
struct BagsView {
  const int64_t* offsets = nullptr;  // [B + 1]
  const int64_t* indices = nullptr;
};

// Bytes this rank sent to the other ranks through the communicator (all-to-all: the exchanges;
// all-reduce: the hybrid tables' frequent gradients, counted as a ring all-reduce's
// 2 (N-1)/N x size; all-gather: the replicated tables' gradients and the step's counts).
struct ExchangeBytes {
  int64_t all_to_all = 0, all_reduce = 0, all_gather = 0;
  int64_t total() const { return all_to_all + all_reduce + all_gather; }
};

class ShardedEmbedding {
 public:
  // The plan must be for these tables and comm.size() ranks. Allocates this rank's shards
  // (values and optimizer state) and initialises them (see ShardedTableConfig::seed). Not a
  // collective; `comm` must outlive the object.
  ShardedEmbedding(std::vector<ShardedTableConfig> tables, Plan plan, Communicator& comm);
  ~ShardedEmbedding();
  ShardedEmbedding(const ShardedEmbedding&) = delete;
  ShardedEmbedding& operator=(const ShardedEmbedding&) = delete;

  int num_tables() const { return static_cast<int>(tables_.size()); }
  // Sum of the tables' dims: the width of a sample's pooled row; table t starts at column
  // column_offset(t).
  int64_t width() const { return width_; }
  int64_t column_offset(int t) const { return col_offset_[t]; }
  const Plan& plan() const { return plan_; }
  // F of a hybrid table t (its replicated prefix [0, F)); 0 for other kinds.
  int64_t frequent_rows(int t) const;
  // Bytes sent since construction or the last reset (every collective of forward, backward,
  // gather_table and save counts).
  const ExchangeBytes& exchange_bytes() const;
  void reset_exchange_bytes();

  // Collective. Pools this rank's `batch` samples of every table (bags[t] for table t) into
  // out + r * out_stride + column_offset(t) (dim floats). Ids out of [0, rows) throw naming
  // the table, the sample and the id, before anything is exchanged (every rank checks its own
  // ids; a rank that throws must end the job, see Communicator). With training = true the
  // step's exchange state is kept for backward().
  void forward(const std::vector<BagsView>& bags, int64_t batch, float* out, int64_t out_stride,
               bool training);

  // Collective. From dL/dout of the last training forward (same layout as out), the sparse
  // gradients of this rank's shards (and of the replicated tables).
  void backward(const float* dout, int64_t dout_stride);

  // Not a collective: applies each table's optimizer with lr[t] to this rank's shards using
  // the gradients of the last backward().
  void step(const std::vector<float>& lr);

  // Collective: the whole table t (values [rows, dim], and its optimizer state in the
  // optimizer's layout when `state` is true and it has one) assembled on every rank.
  Tensor gather_table(int t, bool state = false);
  // Not a collective: sets this rank's shard of table t from the whole table (values
  // [rows, dim]; state in the optimizer's layout for [rows, dim], or undefined to reset it).
  // Loading a checkpoint written with another number of ranks (re-sharding) is this.
  void load_table(int t, const Tensor& values, const Tensor& state);

  // Collective. A checkpoint of the tables (values and optimizer state) under `dir`
  // (docs/DISTRIBUTED.md, "Sharded checkpoints"): every rank writes its pieces to
  // <dir>/embedding.step-<step>.rank-<r>-of-<N>.dlrec (a tensor file, atomic); when all have,
  // rank 0 writes <dir>/embedding.manifest.json (atomic: the commit point, naming the files, the
  // plan, the tables and the optimizer) and removes the files of the checkpoint it replaced. A
  // crash at any point leaves the previous or the new checkpoint whole.
  void save(const std::string& dir, int64_t step);
  // Loads a checkpoint written by any number of ranks with any plan into this one's shards
  // (re-sharding); returns its step. Every rank reads the files that hold its rows (each rank
  // calls it; no collective). Errors name the checkpoint and what is wrong: a missing
  // manifest or rank file, another table set (name, rows, dim) or optimizer state.
  int64_t load(const std::string& dir);

 private:
  struct Local;
  void finish_forward(const std::vector<BagsView>& bags, int64_t batch, float* out,
                      int64_t out_stride, bool training);
  void pooled_back(const std::vector<int64_t>& first, float* out, int64_t out_stride);
  void frequent_backward(const float* dout, int64_t dout_stride);
  void replicated_backward(const float* dout, int64_t dout_stride);
  // The communicator's collectives, counting the bytes sent (ExchangeBytes).
  void exchange(const void* send, const std::vector<int64_t>& scnt,
                const std::vector<int64_t>& soff, void* recv, const std::vector<int64_t>& rcnt,
                const std::vector<int64_t>& roff, Elem type);
  void gather(const void* send, void* recv, const std::vector<int64_t>& counts, Elem type);
  std::vector<int64_t> gather_counts(int64_t count);
  nn::Param& replicated_param(int t);  // the whole table t, which must be replicated
  nn::Param* owned_param(int t);       // this rank's shard of sharded table t, or null
  nn::Param* frequent_param(int t);    // the replicated prefix of hybrid table t, or null
  std::vector<ShardedTableConfig> tables_;
  Plan plan_;
  Communicator& comm_;
  int64_t width_ = 0;
  std::vector<int64_t> col_offset_;
  std::unique_ptr<Local> local_;
};

// The sparse gradient of a table from the bags of `samples` samples and the gradient row of
// each sample (dout + r * stride, dim floats), as nn::EmbeddingBag::backward computes it with
// sum pooling: distinct ids in order of first occurrence, each row summed in order of
// occurrence. Used for replicated tables, whose bags come from every rank.
void accumulate_sparse_grad(const int64_t* offsets, const int64_t* indices, int64_t samples,
                            const float* dout, int64_t stride, int64_t dim, nn::SparseGrad& out);

}  // namespace dlrec::dist
