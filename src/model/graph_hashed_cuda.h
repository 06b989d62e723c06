// Internal: hashed (dynamic) embedding tables as a layer of the CUDA graph model
// (src/model/graph_cuda.cu). The tables' rows are ordinary device tables [capacity_t, dim] that
// the embedding kernels (nn/embedding_cuda.h) pool and update; this class maps the batch's int64
// keys to rows of them on the device before the embedding forward runs, inserting keys on first
// sight and evicting the least recently used rows when a table is full, with the CPU layer's
// semantics wherever they can be the same (docs/EMBEDDINGS.md, "In the CUDA graph model").
//
// Rows are numbered globally: table t owns rows [sbase_t, sbase_t + capacity_t), the same
// numbering as the embedding kernels' row_base, so a resolved key is written straight into the
// step's uint32 row array. Per row the device keeps its key and a recency stamp (int64: a global
// sequence number given to every distinct key of a training batch in order of first
// occurrence; older rows have smaller stamps, free rows the largest value). The LRU order is the
// order of the stamps, which is the CPU table's list order. Per table it keeps the size, a stack
// of free rows, an open-addressing index (key -> row, tombstones on eviction, rebuilt when the
// tombstones fill a quarter of it) and the counters lookups, hits, inserts and evictions.
//
// A training resolution is a fixed sequence of kernels (no host synchronisation, so it is part
// of the step's CUDA graph): de-duplicate the batch's (table, key) pairs and rank them by first
// occurrence; look the distinct keys up (hits get a new stamp); count the misses per table; in a
// table that would overflow, select the `needed` oldest rows by a radix select over the stamps
// (six passes of 8 bits over 48-bit stamps) and evict them; insert the misses into free rows (in
// order of first occurrence), initialising their weights from (seed, key) exactly as the CPU
// table does and resetting their optimizer state; write every position's row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/core/gpu_resources.h"
#include "dlrec/core/tensor.h"
#include "dlrec/io/batch.h"
#include "model/cuda_step.h"
#include "nn/embedding_cuda.h"

namespace dlrec::model::hashed_cuda {

struct TableOptions {
  std::string name;    // "<layer>.<feature>", for messages
  int64_t capacity = 0;  // rows (already clamped to the feature's cardinality)
  uint64_t seed = 0;     // row initialisation seed (as the CPU table's)
  float init_scale = 0;  // rows start uniform in [-s, s)
};

// Counters and size of one table (the CPU table's HashedEmbeddingStats).
struct Stats {
  int64_t size = 0, lookups = 0, hits = 0, inserts = 0, evictions = 0;
};

class HashedTables {
 public:
  // `dim`: the rows' width; `state_cols`/`init_acc`: the embedding optimizer's state values per
  // row (dim for Adagrad, 1 for row-wise Adagrad, 2 * dim + 1 for Adam, 0 for none), reset to
  // init_acc for a new row (Adam: 0).
  // Allocates everything sized by the capacities (fixed from here on).
  HashedTables(std::vector<TableOptions> tables, int64_t dim, int64_t state_cols, float init_acc,
               Device dev, cudaStream_t stream);
  ~HashedTables();
  HashedTables(const HashedTables&) = delete;
  HashedTables& operator=(const HashedTables&) = delete;

  int64_t num_tables() const { return static_cast<int64_t>(opts_.size()); }
  const std::vector<int64_t>& capacities() const { return caps_; }
  // The device tables the rows live in (weights [capacity_t, dim] and optimizer state
  // [capacity_t, state_cols] of table t).
  void bind(const nn::cuda_emb::Tables& tab) { tab_ = tab; }

  // Batch scratch and the two upload slots' key buffers for up to `max_nnz` ids (the caller has
  // synchronised its streams).
  void alloc(int64_t max_nnz);
  // Host side of a step, before the model's own upload: rebuilds the device state when it was
  // handed out (import), checks the keys (>= 0; with `training`, at most capacity_t distinct
  // keys per table) and sets the mode of the next resolve(). `own_slot` false: predict()'s
  // buckets carry the keys, chunk by chunk (no upload() follows; evaluation only).
  void prepare(const io::Batch& b, bool training, bool own_slot = true);
  // After the model's upload into slot `slot`: packs the keys like the uint32 ids of
  // cuda_step's upload into the slot's pinned buffer, copies them on `copy` (after the model's
  // upload, which enqueued the wait for the slot's previous step) and makes `compute` wait.
  void upload(const io::Batch& b, int slot, cudaStream_t copy, cudaStream_t compute);
  // Device: the keys of the last upload (in evaluation `keys` instead, when given: predict()'s
  // bucket) -> rows[nnz] (global rows; in evaluation, a key that no table row holds gets
  // kMissing). Training resolutions insert, evict and count.
  void resolve(const int32_t* offsets, uint32_t* rows, int64_t B, int64_t nnz, cudaStream_t st,
               const int64_t* keys = nullptr);
  // Evaluation pooling of rows that may be kMissing (pooled as zeros, counted in a mean), the
  // layout of nn::cuda_emb::forward.
  template <class O>
  void pool_eval(const int32_t* offsets, const uint32_t* rows, int64_t B, bool mean, O* out,
                 cudaStream_t st) const;
  bool training() const { return training_; }
  static constexpr uint32_t kMissing = 0xFFFFFFFFu;

  // State as the CPU table's tensors (docs/EMBEDDINGS.md, "Inside a model"): per table
  // "keys" I64 [capacity], "lru" I32 [2, capacity], "hash_meta" I64 [8], host tensors filled from
  // the device (unless they are still handed out: then they are returned as the caller left
  // them). The caller may write into them (a checkpoint load): the next upload() checks them and
  // rebuilds the device state from them; on a failed check the table is left empty and the
  // error names it.
  struct HostState {
    Tensor keys, lru, meta;
  };
  const std::vector<HostState>& export_state();
  std::vector<Stats> stats();

 private:
  void import_state();  // from host_ (see export_state)
  void rebuild_index_all(cudaStream_t st);

  std::vector<TableOptions> opts_;
  std::vector<int64_t> caps_, sbase_, ibase_, psize_;
  int64_t dim_ = 0, total_rows_ = 0, total_index_ = 0, max_cap_ = 0, max_p_ = 0;
  int64_t state_cols_ = 0;
  float init_acc_ = 0;
  Device dev_;
  cudaStream_t st_ = nullptr;
  nn::cuda_emb::Tables tab_;

  // Device state.
  Tensor d_caps_, d_sbase_, d_ibase_, d_pmask_, d_seed_, d_scale_;  // constants per table
  Tensor d_slot_key_, d_stamp_, d_free_;                             // [total_rows]
  Tensor d_ikey_, d_islot_;                                          // [total_index]
  Tensor d_ctl_, d_glob_, d_hist_;                                   // per-table control
  // Batch scratch.
  int64_t max_nnz_ = 0, dedup_size_ = 0;
  Tensor d_owner_, d_cnt_, d_dpos_, d_flag_, d_rank_, d_miss_, d_mrank_, d_hitocc_, d_rowslot_,
      d_cub_;
  size_t cub_bytes_ = 0;
  // Upload slots: int64 keys, pinned and on the device.
  struct Slot {
    cuda_step::PinnedPtr host;
    Tensor dev;
    gpu::Event copied;  // the keys' copy (copy stream) finished
    bool pending = false;
  } slots_[2];
  int cur_ = 0;
  bool training_ = false;
  uint64_t seq_bound_ = 0;  // an upper bound of the device's stamp sequence

  std::vector<HostState> host_;
  bool handed_out_ = false;
};

}  // namespace dlrec::model::hashed_cuda
