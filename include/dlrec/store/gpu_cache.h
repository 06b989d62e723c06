// The GPU cache tier of the tiered embedding store (docs/SERVING.md, "GPU cache tier"; issue 22).
//
// A GPU model instance serving through the store is built with device tables of C_f + S rows
// per stored feature f: rows 0..C_f-1 are the cache (hot rows, kept across batches), rows
// C_f..C_f+S-1 a per-batch staging area. For each batch the distinct ids of every stored
// feature are looked up in the feature's slot map (id -> cache slot, here on the host); the
// batch's ids are replaced by device rows (the slot, or a staging row) and the CUDA engine runs
// the remapped batch unchanged: it pools the same floats in the same order as the all-in-GPU
// model, so predictions are bit for bit the same.
//
// Misses are fetched from the next tiers (EmbeddingStore::lookup: updates, host, Redis,
// RocksDB) and uploaded. While the cache's hit rate (over recent lookups) is below
// `insert_threshold`, misses are inserted synchronously: they take cache slots (evicting)
// before the forward. At or above it, the misses of a batch go to the staging rows, the batch
// runs, and the rows are inserted by a background thread after the request has its answer.
//
// Why the slot map is on the host: the ids arrive on the host (the request), the misses must
// be fetched by the host from the tiers below anyway, and the remapped ids are what the engine
// copies to the device in its one input copy: a device hash table would add a round trip
// (look up, copy the misses back, fetch, insert) without removing any.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dlrec/io/batch.h"
#include "dlrec/store/embedding_store.h"

namespace dlrec::store {

// One feature's slot map: ids -> slots 0..capacity-1, with eviction.
//   "lru": the least recently used slot goes first;
//   "lfu": the least frequently used (uses since it was inserted; among equals, the least
//          recently used): hot rows of a power-law stay however many cold ones pass through.
// Both in O(1) per operation: slots sit in doubly linked lists, one per use count ("lfu") or a
// single one ("lru"), the lists in a list ordered by count (the LFU scheme of Shah, Mitra and
// Matani). Slots used by the running batch (stamped) are never evicted.
class SlotMap {
 public:
  SlotMap(int64_t capacity, bool lfu);
  int64_t capacity() const { return static_cast<int64_t>(id_.size()); }
  int64_t size() const { return static_cast<int64_t>(where_.size()); }
  // The slot of `id` (touched: recency and count, stamped with the batch), or -1.
  int64_t find(int64_t id, uint64_t stamp);
  // A slot for `id` (absent): a free one, else the least valuable slot not stamped with
  // `stamp` (its id goes to *evicted; -1 when none was evicted). -1 when every slot it may look
  // at (at most kMaxScan) is in use by the batch: the row is then not cached.
  int64_t insert(int64_t id, uint64_t stamp, int64_t* evicted);
  // Drops `id` (its slot becomes free). Whether it was there.
  bool erase(int64_t id);
  void clear();
  bool contains(int64_t id) const { return where_.count(id) > 0; }
  // The id in `slot`, or -1 (tests).
  int64_t id_at(int64_t slot) const { return id_[slot]; }
  static constexpr int kMaxScan = 256;

 private:
  struct Bucket {
    int64_t count;
    int32_t head, tail, prev, next;
  };
  void unlink(int32_t s);                // from its bucket (a bucket left empty is freed)
  void push_back(int32_t s, int32_t b);  // at b's tail (most recent)
  int32_t new_bucket(int64_t count, int32_t after);  // after bucket `after` (-1: first)
  bool lfu_;
  std::unordered_map<int64_t, int32_t> where_;
  std::vector<int64_t> id_;  // per slot: its id, -1 when free
  std::vector<int32_t> prev_, next_, bucket_;
  std::vector<uint64_t> stamp_;
  std::vector<int32_t> free_slots_;
  std::vector<Bucket> buckets_;
  std::vector<int32_t> free_buckets_;
  int32_t first_ = -1;  // the bucket of the least count
};

// Where a feature's device rows are written (the model's device tables; a host array in tests).
class DeviceRows {
 public:
  virtual ~DeviceRows() = default;
  // Rows data[i] ([n, dim] f32, host) into row rows[i] of store table `table`.
  virtual void write(int table, const int64_t* rows, int64_t n, const float* data) = 0;
};
// The CUDA implementation: the tables' device pointers ([rows, dim] f32 each, on `device`),
// written by a scatter kernel after one copy of the rows and their indices (gpu_cache_cuda.cu).
// An error in a CPU-only build.
std::unique_ptr<DeviceRows> make_cuda_rows(int device, std::vector<float*> tables,
                                           std::vector<int64_t> dims,
                                           std::vector<int64_t> table_rows);
// Free and total bytes of CUDA device `device` (an error in a CPU-only build).
void cuda_memory_info(int device, int64_t* free_bytes, int64_t* total_bytes);

// Rows per feature the cache holds, from the config and the device's free memory.
struct GpuCacheSizing {
  std::vector<int64_t> features;    // distinct stored features, in table order
  std::vector<int64_t> cache_rows;  // per entry of features: C_f
  int64_t cache_bytes = 0;          // sum over tables of C_f x row bytes
  double fraction = 0;              // of every table's rows
  std::string how;                  // "gpu_cache.fraction 0.1", "default: ...": for plans
};
// `config.gpu_cache_fraction` / `gpu_cache_bytes`, else the default: the whole tables when
// they take at most half of `free_bytes`, else the fraction that takes half of it. Every
// feature gets at least one row. An error when the cache (plus `staging_rows` per feature)
// does not fit in `free_bytes` or `total_bytes` (a negative value: not checked).
GpuCacheSizing size_gpu_cache(const StoreConfig& config, const std::vector<TableInfo>& tables,
                              int64_t free_bytes, int64_t total_bytes);

// The cache of one model instance (not shared between instances: each has its device tables).
class GpuCache {
 public:
  GpuCache(EmbeddingStore& store, const StoreConfig& config, GpuCacheSizing sizing);
  ~GpuCache();  // stops the insert thread
  const GpuCacheSizing& sizing() const { return sizing_; }
  // Rows of feature k's device tables: the cache, then `staging` rows.
  int64_t device_rows(size_t k) const { return sizing_.cache_rows[k] + staging_; }
  int64_t staging_rows() const { return staging_; }
  // After each (re)build of the model: where its tables are, and the staging rows they have.
  // The cache starts empty.
  void bind(std::unique_ptr<DeviceRows> rows, int64_t staging_rows);
  // Runs one batch: remaps its stored features' ids to device rows, fetches and uploads the
  // missing rows, and calls forward(remapped batch), all under the instance's lock; queues the
  // asynchronous inserts after it. Returns 0, or (nothing run) the staging rows the batch needs
  // when they exceed staging_rows(): the caller rebuilds the model with as many and binds.
  int64_t run(const io::Batch& batch, const std::function<void(const io::Batch&)>& forward);
  // Drops rows an online update replaced (called by the store's update thread).
  void invalidate(int table, const int64_t* ids, int64_t n);
  // Waits until the queued asynchronous inserts are done (tests, benches).
  void drain();
  // The hit rate of the recent lookups that decides sync or async inserts.
  double recent_hit_rate() const;
  TierStats stats;  // "gpu": hits/misses per (table, distinct id of a batch), evictions, bytes
  std::atomic<int64_t> sync_batches{0}, async_batches{0}, async_inserted{0}, async_dropped{0};

 private:
  struct InsertJob {
    uint64_t generation;
    std::vector<std::vector<int64_t>> ids;  // per feature
    std::vector<std::vector<float>> rows;   // per table: [ids of its feature, dim]
  };
  void insert_loop();
  void apply_insert(InsertJob& job);
  int64_t feature_index(int64_t feature) const;

  EmbeddingStore& store_;
  GpuCacheSizing sizing_;
  bool lfu_;
  double threshold_;
  int64_t staging_ = 0;
  std::vector<int> feature_of_table_;  // index into sizing_.features per store table
  std::vector<SlotMap> maps_;
  std::unique_ptr<DeviceRows> rows_;
  std::mutex mu_;  // the instance: a batch, an insert or an invalidation at a time
  uint64_t stamp_ = 0;
  uint64_t generation_ = 0;  // raised by every invalidation
  double recent_hits_ = 0, recent_lookups_ = 0;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_, idle_cv_;
  std::deque<InsertJob> queue_;
  bool busy_ = false, stop_ = false;
  std::thread inserter_;
  io::Batch staged_;
};

}  // namespace dlrec::store
