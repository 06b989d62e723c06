// HashedEmbedding: an embedding table for ids with no fixed vocabulary (CPU, F32).
//
// Keys are any 64-bit values. A key gets a row the first time training sees it; the table holds
// at most `capacity` rows, and when it is full the least recently used row is evicted (its
// weights and optimizer state are dropped with it). A row starts from values that depend only
// on (seed, key), so a key evicted and seen again restarts from the same values on any machine.
// docs/EMBEDDINGS.md explains the choices (LRU rather than LFU, lookups of unknown keys, ...).
//
// Memory is allocated once, at construction, for `capacity` rows: weights (dim floats), the
// optimizer state of the row (Optimizer::state_row_size(dim) floats), the key (8 bytes), the
// LRU links (8 bytes), and the hash index (8 bytes per slot, a power of two >= 2 * capacity).
// memory_bytes() reports it; the table never grows beyond it.
//
// Threads: find(), read_row() and forward(training = false) take a shared lock and may run
// concurrently from any number of threads; forward(training = true), backward(), apply(),
// insert-or-lookup and import take the exclusive lock. Counters are atomic.
//
// The table's whole state lives in five tensors (tensors()): the graph model hands them to
// checkpoints and exports as they are (no copy) and rebuilds the hash index from them after a
// load (import_tensors()). The member functions other than save()/load() are defined inline
// (hashed_embedding_impl.h) so that the model library can use the table without linking the
// embedding library (which depends on the tensor-file code of the train library).
#pragma once

#include <atomic>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <vector>

#include "dlrec/core/tensor.h"
#include "dlrec/nn/embedding_bag.h"
#include "dlrec/nn/optimizer.h"

namespace dlrec::embedding {

// The initial value of element k of the row of `key` in a table seeded `seed`: uniform in
// [-scale, scale), counter-based (splitmix64), identical on the CPU and the GPU.
inline float initial_value(uint64_t seed, int64_t key, int64_t k, float scale);

struct HashedEmbeddingOptions {
  int64_t dim = 16;
  int64_t capacity = 1 << 20;  // rows, at most 2^31 - 1
  uint64_t seed = 0;
  float init_scale = 0.01f;  // rows start uniform in [-init_scale, init_scale)
  nn::Pooling pooling = nn::Pooling::Sum;
  nn::OptimizerOptions optimizer;  // the rows' optimizer (sparse steps: no weight decay)
};

struct HashedEmbeddingStats {
  int64_t lookups = 0;    // ids looked up by training forwards (every occurrence)
  int64_t hits = 0;       // of those, ids whose key had a row already
  int64_t inserts = 0;    // rows created
  int64_t evictions = 0;  // rows dropped to make room
  int64_t size = 0;       // rows held now
  double hit_rate() const { return lookups ? static_cast<double>(hits) / lookups : 0.0; }
};

class HashedEmbedding {
 public:
  explicit HashedEmbedding(const HashedEmbeddingOptions& options);
  HashedEmbedding(const HashedEmbedding&) = delete;
  HashedEmbedding& operator=(const HashedEmbedding&) = delete;

  // --- Lookups ---------------------------------------------------------------------------
  // The slot of `key`, or -1 when it has no row. No insertion, no change of recency.
  int64_t find(int64_t key) const;
  // Copies the row of `key` into out (dim floats); false (and zeros) when it has no row.
  bool read_row(int64_t key, float* out) const;
  // The slots of `n` keys, inserting the missing ones (evicting the least recently used rows
  // when full) and marking all of them most recently used, in order. Counts lookups/hits per
  // key given. More distinct keys than the capacity in one call throws (a batch's rows could
  // not all be resident).
  void lookup_or_insert(const int64_t* keys, int64_t n, int64_t* slots);

  // --- Training like nn::EmbeddingBag --------------------------------------------------
  // Pools the bags of batch_rows samples (sample r's keys are keys[offsets[r] ..
  // offsets[r + 1])) into out + r * out_stride. training = true inserts unseen keys and keeps
  // the batch for backward(); training = false inserts nothing (unknown keys pool as zeros).
  void forward(const int64_t* offsets, const int64_t* keys, int64_t batch_rows, float* out,
               int64_t out_stride, bool training);
  // The sparse gradient of the last training forward; its ids are slots (rows of this table).
  const nn::SparseGrad& backward(const float* dout, int64_t dout_stride);
  // Applies the optimizer to the rows of g (ids are slots, as backward() returns them).
  void apply(const nn::SparseGrad& g, float lr);

  // --- Export / import -----------------------------------------------------------------
  // Writes keys [n] (I64), weights [n, dim], state [n, S] (when the optimizer has state), in
  // least- to most-recently-used order, to a tensor file (docs/FORMATS.md) with the options and
  // counters in its meta ("kind": "hashed_embedding").
  void save(const std::string& path) const;
  // Replaces the contents with a saved table (same dim and optimizer state size; the file's
  // rows must fit the capacity). Recency order and counters are restored.
  void load(const std::string& path);

  // --- Introspection -------------------------------------------------------------------
  HashedEmbeddingStats stats() const;
  int64_t size() const { return size_; }
  int64_t capacity() const { return cap_; }
  int64_t dim() const { return dim_; }
  const nn::Optimizer& optimizer() const { return opt_; }
  // Bytes allocated for the table (all of it allocated at construction).
  int64_t memory_bytes() const;
  // The row and state of a slot (valid until the next insertion).
  float* row(int64_t slot) { return w_ + slot * dim_; }
  float* state_row(int64_t slot) { return st_ + slot * srow_; }
  // Keys from least to most recently used (tests, export).
  std::vector<int64_t> keys_by_recency() const;

  // --- The state as tensors (checkpoints and exports of models) ------------------------
  // Slot s of every tensor is row s of the table; rows >= size are unused (zeros until first
  // used). The tensors share the table's storage: writing into them (a checkpoint load) changes
  // the table, and import_tensors() must then be called before the next use.
  struct StateTensors {
    Tensor keys;     // I64 [capacity]: the key of each slot
    Tensor weights;  // F32 [capacity, dim]
    Tensor state;    // F32 [capacity, S] (undefined when the optimizer keeps no state)
    Tensor links;    // I32 [2, capacity]: LRU list, previous (row 0) and next (row 1) slot, -1 at
                     // the ends
    Tensor meta;     // I64 [kMetaSize]: size, head (least recent slot), tail (most recent),
                     // lookups, hits, inserts, evictions, capacity
  };
  static constexpr int64_t kMetaSize = 8;
  // The tensors, with `meta` brought up to date first unless !update_meta (when the tensors may
  // hold a loaded state not imported yet, which must not be overwritten).
  StateTensors tensors(bool update_meta = true);
  // Rebuilds the index, the LRU ends, size and counters from the tensors (after they were
  // overwritten), checking that they describe a valid table; errors start with `what`.
  void import_tensors(const std::string& what);

 private:
  uint64_t index_find(int64_t key, uint64_t h) const;  // index position, or kNone
  int32_t insert_locked(int64_t key);                  // new slot for key (evicts when full)
  void erase_index(uint64_t pos);
  void lru_unlink(int32_t s);
  void lru_push_back(int32_t s);
  void init_row(int32_t s, int64_t key);

  HashedEmbeddingOptions o_;
  int64_t dim_, cap_, srow_;
  nn::Optimizer opt_;
  mutable std::shared_mutex mu_;
  // Rows: slot s holds key keys_[s], weights w_[s * dim ...], state st_[s * srow ...]; the
  // pointers point into the tensors of StateTensors.
  StateTensors t_;
  float* w_ = nullptr;
  float* st_ = nullptr;
  int64_t* keys_ = nullptr;
  int32_t *prev_ = nullptr, *next_ = nullptr;  // LRU list over slots; head_ = least recently used
  int32_t head_ = -1, tail_ = -1;
  int64_t size_ = 0;
  // Open addressing, linear probing, backward-shift deletion. Entry: (tag << 32) | (slot + 1),
  // 0 = empty; tag = the key hash's high 32 bits.
  std::vector<uint64_t> index_;
  uint64_t mask_ = 0;
  std::atomic<int64_t> lookups_{0}, hits_{0}, inserts_{0}, evictions_{0};
  // Last training forward.
  bool have_batch_ = false;
  int64_t batch_rows_ = 0;
  std::vector<int64_t> uniq_slots_, uniq_ptr_, occ_sample_, inverse_;
  std::vector<float> scale_;
  nn::SparseGrad grad_;
};

}  // namespace dlrec::embedding

#include "dlrec/embedding/hashed_embedding_impl.h"
