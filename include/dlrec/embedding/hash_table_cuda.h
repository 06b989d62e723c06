// HashTableCuda: a hashed (dynamic) embedding table on one NVIDIA GPU (CUDA builds only).
//
// The GPU peer of embedding::HashedEmbedding: 64-bit keys, rows inserted on first sight, rows
// initialised from (seed, key) with the very same values as the CPU table (hash_common.h), and
// SGD or element-wise Adagrad row updates computed like the CPU's (no fused multiply-add: the
// same bits for the same inputs).
//
// Layout on the device: an open-addressing index of P = 2^k >= 2 * capacity positions
// (key int64, slot int32), linear probing; rows [capacity, dim], optimizer state
// [capacity, dim] (Adagrad), the key of each row and the step at which it was last used.
//
// lookup_or_insert (one kernel, one thread per key): probes for the key; an empty position is
// claimed with atomicCAS on the key, a row is taken from an atomic counter, initialised, and
// its slot published (atomicExch); threads that meet the key while its slot is being published
// wait for it. Duplicated keys in a batch therefore share one row. When the counter reaches the
// capacity a new key gets no row: its slot is -1 (it pools as zeros and receives no update)
// until the next sweep.
//
// Eviction is a periodic sweep, not per insert (documented in docs/EMBEDDINGS.md): sweep(keep)
// keeps the `keep` rows used most recently (by the step counter of the last lookup that hit
// them; ties by slot), compacts them into slots [0, keep), rebuilds the index and drops the
// others with their optimizer state. maybe_sweep() runs one when the table is fuller than
// high_watermark * capacity, down to low_watermark * capacity. The recency is per step (one
// lookup_or_insert call), so within a step the order is not LRU-exact as on the CPU.
//
// The key -2^63 is reserved (it marks empty positions): it always has slot -1.
// Every method runs on the table's stream and returns after the work finished (the test and
// benchmark API); counters are exact.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dlrec/embedding/hashed_embedding.h"

namespace dlrec::embedding {

class HashTableCuda {
 public:
  // optimizer.kind must be SGD (no momentum) or Adagrad. Allocates everything on `device`.
  HashTableCuda(const HashedEmbeddingOptions& options, int device = 0);
  ~HashTableCuda();
  HashTableCuda(const HashTableCuda&) = delete;
  HashTableCuda& operator=(const HashTableCuda&) = delete;

  // Device-pointer API (d_ arguments are device memory of the table's device).
  // Slots of n keys, inserting missing ones; counts lookups, hits and inserts; advances the
  // recency step by one.
  void lookup_or_insert_device(const int64_t* d_keys, int64_t n, int32_t* d_slots);
  // out[i, :] = row of slot d_slots[i] (zeros for -1).
  void gather_device(const int32_t* d_slots, int64_t n, float* d_out);
  // Optimizer step on the rows d_slots[0..n) (distinct; -1 skipped) with gradients [n, dim].
  void apply_device(const int32_t* d_slots, const float* d_grads, int64_t n, float lr);

  // Host API (copies in and out).
  std::vector<int32_t> lookup_or_insert(const std::vector<int64_t>& keys);
  std::vector<float> gather(const std::vector<int32_t>& slots);
  void apply(const std::vector<int32_t>& slots, const std::vector<float>& grads, float lr);
  // The row of each key (zeros, and found[i] = false, when absent); no insertion.
  std::vector<float> read_rows(const std::vector<int64_t>& keys, std::vector<bool>* found = nullptr);
  std::vector<float> read_state(const std::vector<int64_t>& keys);

  // Keeps the `keep` most recently used rows; returns the number evicted.
  int64_t sweep(int64_t keep);
  // Sweeps when size() > high * capacity, down to low * capacity; returns the number evicted.
  int64_t maybe_sweep(double high = 0.95, double low = 0.8);

  HashedEmbeddingStats stats() const;
  int64_t size() const;  // rows in use (at most the capacity)
  int64_t capacity() const;
  int64_t dim() const;
  int64_t memory_bytes() const;  // device bytes allocated for the table

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::embedding
