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
// RocksDB) and uploaded, every table's in one copy and one scatter kernel, enqueued on the
// model's serving stream ahead of its forward (no host wait: the forward's host packing runs
// while they copy). A batch's misses
// always read staging rows. While the cache's hit rate (over recent lookups, per distinct id)
// is below `insert_threshold`, they are also inserted synchronously: given cache slots
// (evicting), into which the same kernel writes their rows before the forward. At or above it,
// the batch runs and its rows are inserted by a background thread after the request has its
// answer (the slot maps per feature on the instance's team, the rows written on the model's
// stream ahead of the next forward, without a host wait).
//
// The host work of a batch, in order, on the instance's spin team (core/spin_team.h): the
// lookups (in pieces of 512 ids of a feature: each id's slot looked up in a flat
// open-addressing index with the memory access started ahead, as the slot maps of hundreds of
// MiB miss the caches), in the same team job as the remap of each feature, which the task that
// looks up its last piece runs (each distinct id once, to its slot or a staging row; the
// distinct hits found through a bitmap of the slots), and as the copy of the rest of the batch;
// then, at the same time, the fetch of the misses
// (per table, into the pinned buffer the upload reads) and, when sync, the inserts (per
// feature; the batch's hits, marked in the remap's bitmap, are not evicted); then the one device write and the forward, while the team relinks the hits (their
// LFU/LRU recency and counts, list neighbours prefetched): that bookkeeping was the longest
// task before the write (bench/RESULTS.md, "GPU cache tier").
//
// Why the slot map is on the host: the ids arrive on the host (the request), the misses must
// be fetched by the host from the tiers below anyway, and the remapped ids are what the engine
// copies to the device in its one input copy: a device hash table would add a round trip
// (upload the ids, look up, copy the misses back, fetch, upload) and an engine that takes its
// ids from the device. The host map's cost is memory latency, which prefetching and huge pages
// reduce but do not remove: on the H200 host measured, a batch of 2048 at alpha 1.2 spends
// ~0.07 ms here (lookups and remap 37-43 us, fetch 18-20, write 11-14) against a 0.12 ms
// forward (bench/RESULTS.md, "GPU cache tier"; bench/gpu_cache_host.cc measures it without a
// GPU); a device-side map measured slower (the round trip of the ids and rows).
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
#include <utility>
#include <vector>

#include "dlrec/core/spin_team.h"
#include "dlrec/io/batch.h"
#include "dlrec/store/embedding_store.h"
#include "dlrec/store/flat_id_index.h"

namespace dlrec::store {

// One feature's slot map: ids -> slots 0..capacity-1, with eviction.
//   "lru": the least recently used slot goes first;
//   "lfu": the least frequently used (uses since it was inserted; among equals, the least
//          recently used): hot rows of a power-law stay however many cold ones pass through.
// Both in O(1) per operation: slots sit in doubly linked lists, one per use count ("lfu") or a
// single one ("lru"), the lists in a list ordered by count (the LFU scheme of Shah, Mitra and
// Matani). Slots used by the running batch (stamped) are never evicted. The ids' index is a
// flat open-addressing table (flat_id_index.h), so a batch's lookups can be prefetched.
// Aligned to a cache line: the slot maps of a model's features are updated by different
// threads at once, which must not write to one line (false sharing).
class alignas(64) SlotMap {
 public:
  // Ids below `id_limit` (the table's rows): below 2^32 - 1, the index keeps 32-bit keys.
  SlotMap(int64_t capacity, bool lfu, int64_t id_limit = int64_t{1} << 31);
  int64_t capacity() const { return static_cast<int64_t>(slot_.size()); }
  int64_t size() const { return where_.size(); }
  // The slot of `id` (touched: recency and count, stamped with the batch), or -1.
  int64_t find(int64_t id, uint64_t stamp) {
    const int32_t s = where_.find(id);
    if (s >= 0) touch(s, stamp);
    return s;
  }
  // The slot of `id` or -1, nothing touched (the lookup half of find).
  int32_t slot_of(int64_t id) const { return where_.find(id); }
  // f(its id -> slot index, a FlatIdIndexT<uint32_t or uint64_t>): for loops that prefetch.
  template <class F>
  void visit_index(F&& f) const {
    where_.visit(std::forward<F>(f));
  }
  // The bookkeeping half of find: `slot` (in use) was used by the batch `stamp`: stamp(), then
  // relink().
  void touch(int32_t slot, uint64_t stamp) {
    this->stamp(slot, stamp);
    relink(slot);
  }
  // Marks `slot` (in use) as used by the batch `stamp`: insert() does not evict it for that
  // batch.
  void stamp(int32_t slot, uint64_t stamp) { slot_[slot].stamp = stamp; }
  // The use's recency and count: `slot` (in use) to the tail of its list, of the next count for
  // "lfu". Its stamp is not read, so a batch's hits may be stamped before its inserts and
  // relinked after them: "lfu": the lists come out in the same order (inserts only append to
  // the list of count 1, which relinks may leave but never enter; an insert's search for a
  // slot to evict then passes over more stamped slots within its kMaxScan); "lru": the hits
  // come after the batch's inserts in the one list.
  void relink(int32_t slot);
  // A slot for `id` (absent): a free one, else the least valuable slot not stamped with
  // `stamp` nor marked in `in_use` (a bit per slot, when given: the batch's hits, which need
  // no stamp then); its id goes to *evicted (-1 when none was evicted). -1 when every slot it
  // may look at (at most kMaxScan) is in use by the batch: the row is then not cached.
  int64_t insert(int64_t id, uint64_t stamp, int64_t* evicted, const uint64_t* in_use = nullptr);
  // Drops `id` (its slot becomes free). Whether it was there.
  bool erase(int64_t id);
  void clear();
  bool contains(int64_t id) const { return where_.find(id) >= 0; }
  // The id in `slot`, or -1 (tests).
  int64_t id_at(int64_t slot) const { return slot_[slot].id; }
  // Starts loading what touch(slot) reads first.
  void prefetch_slot(int32_t slot) const { __builtin_prefetch(&slot_[slot]); }
  // Starts loading what touch(slot) then relinks: the slot's list neighbours (reads the slot's
  // record: call it once prefetch_slot's load has arrived).
  void prefetch_links(int32_t slot) const {
    const Slot& s = slot_[slot];
    if (s.prev >= 0) __builtin_prefetch(&slot_[s.prev], 1);
    if (s.next >= 0) __builtin_prefetch(&slot_[s.next], 1);
  }
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
  // id -> slot: 8-byte cells for ids below 2^32 - 1 (the index is half the size, so more of it
  // stays in the caches and the TLB's reach), else 16-byte ones.
  class Index {
   public:
    Index(int64_t capacity, bool narrow) : narrow_(narrow) {
      (narrow ? narrow_ids_.reserve(capacity) : wide_ids_.reserve(capacity));
    }
    int64_t size() const { return narrow_ ? narrow_ids_.size() : wide_ids_.size(); }
    int32_t find(int64_t id) const { return narrow_ ? narrow_ids_.find(id) : wide_ids_.find(id); }
    // f(the index): code that prefetches runs on the concrete one (GCC 12 drops a prefetch
    // whose address depends on which index it is).
    template <class F>
    void visit(F&& f) const {
      if (narrow_)
        f(narrow_ids_);
      else
        f(wide_ids_);
    }
    void insert(int64_t id, int32_t v) {
      narrow_ ? narrow_ids_.insert(id, v) : wide_ids_.insert(id, v);
    }
    void erase(int64_t id) { narrow_ ? (void)narrow_ids_.erase(id) : (void)wide_ids_.erase(id); }
    void clear() { narrow_ ? narrow_ids_.clear() : wide_ids_.clear(); }

   private:
    bool narrow_;
    FlatIdIndexT<uint32_t> narrow_ids_;
    FlatIdIndexT<uint64_t> wide_ids_;
  };
  Index where_;
  // Per slot, together (a touch reads one 32-byte record, not five arrays): its id (-1 when
  // free), the batch that last used it, its neighbours in its bucket's list and its bucket.
  struct Slot {
    int64_t id = -1;
    uint64_t stamp = 0;
    int32_t prev = -1, next = -1, bucket = -1, unused = 0;
  };
  std::vector<Slot, HugePageAllocator<Slot>> slot_;
  std::vector<int32_t> free_slots_;
  std::vector<Bucket> buckets_;
  std::vector<int32_t> free_buckets_;
  int32_t first_ = -1;  // the bucket of the least count
};

// Rows for one table: data[i] ([n, dim] f32, host) goes into row rows[i] of store table `table`,
// and also into row also[i] where `also` is given and also[i] >= 0 (a missed row into its
// staging row and the cache slot it was given).
struct RowBlock {
  int table;
  int64_t n, dim;  // rows, floats per row (the table's)
  const int64_t* rows;
  const float* data;
  const int64_t* also = nullptr;
};
// Where a feature's device rows are written (the model's device tables; a host array in tests).
class DeviceRows {
 public:
  virtual ~DeviceRows() = default;
  // Rows data[i] ([n, dim] f32, host) into row rows[i] of store table `table`.
  virtual void write(int table, const int64_t* rows, int64_t n, const float* data) = 0;
  // Every block, written when it returns. By default one write() per block; the CUDA
  // implementation makes it one copy, one kernel and one synchronisation for all of them.
  virtual void write(const std::vector<RowBlock>& blocks);
  // The same write, possibly still in flight when it returns: ordered before the model's next
  // forward (the CUDA implementation enqueues it on the model's serving stream, when it was
  // given one, without waiting). Its host buffers stay in use until settle(), which the next
  // write and values_buffer() call first. By default write(blocks).
  virtual void write_ahead(const std::vector<RowBlock>& blocks) { write(blocks); }
  // Waits for a write_ahead still in flight.
  virtual void settle() {}
  // A host buffer of `floats` floats for the values of the next write (valid until then): the
  // caller may fetch rows into it and pass blocks whose data lie in it back to back, from its
  // start, in block order; the CUDA implementation's is pinned memory, which it then copies to
  // the device as it is (no staging copy). Blocks elsewhere are copied as usual.
  virtual float* values_buffer(int64_t floats) {
    if (values_.size() < static_cast<size_t>(floats)) values_.resize(static_cast<size_t>(floats));
    return values_.data();
  }

 private:
  std::vector<float> values_;
};
// The CUDA implementation: the tables' device pointers ([rows, dim] f32 each, on `device`),
// written by a scatter kernel after one copy of the rows and their indices (gpu_cache_cuda.cu),
// all tables' blocks of a batch in the same copy and kernel. `stream`: the model's serving
// stream (CudaModel::serving_stream, a cudaStream_t), on which write_ahead() enqueues without
// waiting; null: a stream of its own, and write_ahead() waits like write(). An error in a
// CPU-only build.
std::unique_ptr<DeviceRows> make_cuda_rows(int device, std::vector<float*> tables,
                                           std::vector<int64_t> dims,
                                           std::vector<int64_t> table_rows,
                                           void* stream = nullptr);
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
  // The threads of a batch's host work, the caller included (StoreConfig::gpu_cache_threads).
  int threads() const { return team_->size(); }
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
  // Waits until the queued asynchronous inserts are done, their device writes (enqueued on
  // the model's stream ahead of the next batch) included (tests, benches; and before the
  // model whose tables the cache writes is replaced or destroyed).
  void drain();
  // The hit rate of the recent lookups that decides sync or async inserts.
  double recent_hit_rate() const;
  TierStats stats;  // "gpu": hits/misses per (table, distinct id of a batch), evictions, bytes
  // Hits per (table, id looked up): every id of a batch, repeats included, is a hit when its
  // row was cached before the batch (a repeat of a missed id is a miss). The usual hit rate,
  // id_hits / id_lookups; higher than stats' per distinct id, since hot ids repeat in a batch.
  std::atomic<int64_t> id_hits{0}, id_lookups{0};
  std::atomic<int64_t> sync_batches{0}, async_batches{0}, async_inserted{0}, async_dropped{0};
  // Where run()'s time goes (benches): waiting for the instance (an insert holding it), the
  // remap, the fetch from the tiers below, the device write of the misses, the forward.
  struct Times {
    std::atomic<int64_t> batches{0}, wait_ns{0}, remap_ns{0}, fetch_ns{0}, write_ns{0},
        forward_ns{0}, relink_ns{0};  // relink: waiting after the forward for the hits' relinks
  } times;
  // A diagnostic record of one batch (benches: where a slow batch's time went). Kept for the
  // last batch while keep_phases(true); off by default (then nothing of it is measured).
  // One job of the spin team (run_tasks): its wall time from the start of run_tasks; the
  // longest task; of the members that took part (the caller among them), the latest to begin,
  // the latest to end among those that ran a task and among all (a member that claimed its
  // part late, e.g. descheduled, ends after the work is done); how many ran a task; their
  // involuntary context switches, voluntary ones (a sleep in the kernel: a lock, a syscall
  // that waits) and page faults during it (getrusage per thread).
  struct TeamPhase {
    int64_t wall_ns = 0, max_task_ns = 0, last_start_ns = 0, last_work_end_ns = 0,
            last_end_ns = 0;
    int32_t workers = 0, preempted = 0, slept = 0;
    int64_t faults = 0;
  };
  struct BatchPhases {
    // run()'s phases, wall ns: waiting for the instance; the lookups and remaps (one team job);
    // the copy plan and the counts after it;
    // waiting for the previous device write's buffer; the fetch beside the slot maps'
    // bookkeeping; enqueuing the device write; the forward (the caller's function).
    int64_t wait_ns = 0, lookup_ns = 0, remap_ns = 0, settle_ns = 0, fetch_ns = 0,
            write_ns = 0, forward_ns = 0, relink_ns = 0, total_ns = 0;
    TeamPhase team[2];  // the lookup job (each feature's remap after its last lookup), the fetch job
    int64_t caller_preempted = 0, caller_faults = 0, caller_slept = 0;  // the calling thread,
                                                                        // over run()
    int64_t misses = 0;  // distinct ids missed, all features
    bool sync = false;
    bool inserter_busy = false;  // an async insert queued or running as the batch began
    int64_t inserts = 0, insert_ns = 0;  // async inserts applied since the last batch ended,
                                         // their time holding the instance
  };
  void keep_phases(bool on) { keep_phases_ = on; }
  const BatchPhases& last_phases() const { return phases_; }
  // The calling thread's involuntary context switches and page faults so far, and its
  // voluntary switches where `slept` is given (0 where unknown).
  static void thread_usage(int64_t* preempted, int64_t* faults, int64_t* slept = nullptr);

 private:
  struct InsertJob {
    uint64_t generation;
    std::vector<std::vector<int64_t>> ids;  // per feature
    std::vector<std::vector<float>> rows;   // per table: [ids of its feature, dim]
  };
  // One feature's part of the running batch (kept across batches for their memory).
  // Aligned to a cache line: each feature's is written by its own thread (no false sharing).
  struct alignas(64) FeatureWork {
    std::vector<int32_t> found;      // per id of the batch: its slot, or -1 (see look_up)
    std::vector<uint64_t> hit_bits;  // a bit per cache slot: set for hit_slots (see remap)
    std::vector<int32_t> miss_at;    // the positions of the batch's ids not found (remap)
    FlatIdIndex seen;                // the batch's distinct missed ids -> staging rows (remap)
    std::vector<int32_t> hit_slots;  // of its distinct ids found
    std::vector<int64_t> fetch_ids, fetch_rows;  // its distinct missed ids, their staging rows
    std::vector<int64_t> slots;     // sync: per missed id, the cache slot it took (or -1)
    std::vector<int64_t> inserted;  // sync: the ids given slots
    int64_t evictions = 0, id_hits = 0;
  };
  void plan_copies(const io::Batch& batch);
  void look_up(const io::Batch& batch, size_t k, int64_t lo, int64_t hi);
  void remap(const io::Batch& batch, size_t k);
  void maintain(size_t k);  // the sync inserts (the batch's hits protected by hit_bits)
  void relink_hits(size_t k);           // the hits' recency and counts (beside the forward)
  void undo_inserts();  // gives back the slots the running batch's sync inserts took
  void insert_loop();
  void apply_insert(InsertJob& job);
  int64_t feature_index(int64_t feature) const;

  EmbeddingStore& store_;
  GpuCacheSizing sizing_;
  bool lfu_;
  double threshold_;
  int64_t staging_ = 0;
  std::vector<int> feature_of_table_;  // index into sizing_.features per store table
  std::vector<int64_t> feature_rows_, tables_of_feature_;  // per feature: its ids, its tables
  std::vector<FeatureWork> work_;
  std::unique_ptr<SpinTeam> team_;  // a batch's per-feature and per-table tasks (run_tasks)
  // fn(0..n-1) on the team, each task taken by the next free member (in order on this thread
  // when not `threaded`); rethrows the first error.
  // With `rec` (keep_phases): the job timed per member into *rec (gpu_cache_phases.cc).
  void run_tasks(int n, bool threaded, const std::function<void(int)>& fn,
                 TeamPhase* rec = nullptr);
  void run_tasks_timed(int n, bool threaded, const std::function<void(int)>& fn,
                       TeamPhase* rec);
  // The relinks of a batch's hits, posted to the team while the caller runs the forward.
  std::atomic<int> relink_next_{0};
  std::function<void(int)> relink_job_;
  bool keep_phases_ = false;
  BatchPhases phases_;
  std::atomic<int64_t> insert_runs_{0}, insert_run_ns_{0};  // async inserts applied, their time
  std::vector<SlotMap> maps_;
  std::unique_ptr<DeviceRows> rows_;
  std::mutex mu_;  // the instance: a batch, an insert or an invalidation at a time
  std::atomic<int> batches_waiting_{0};  // run() calls waiting for mu_ (inserts let them first)
  uint64_t stamp_ = 0;
  uint64_t generation_ = 0;  // raised by every invalidation
  double recent_hits_ = 0, recent_lookups_ = 0;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_, idle_cv_;
  std::deque<InsertJob> queue_;
  bool busy_ = false, stop_ = false;
  std::thread inserter_;
  io::Batch staged_;
  struct Copy {
    void* to;
    const void* from;
    size_t bytes;
  };
  std::vector<Copy> copies_;  // the running batch's bytes into staged_ (plan_copies)
  std::vector<std::pair<int, int64_t>> pieces_;  // its lookups' pieces: (feature k, first id)
  // Per feature: its pieces not yet looked up; the task that looks up the last runs its remap.
  std::unique_ptr<std::atomic<int>[]> pieces_left_;
};

}  // namespace dlrec::store
