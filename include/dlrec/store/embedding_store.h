// The tiered embedding store for serving (docs/SERVING.md, "Tiered embedding store"; issue 22).
//
// Rows of a model's fixed embedding tables, looked up by (table, id) in batches through tiers in
// lookup order, each optional:
//   host     sharded by id, bounded in bytes, LRU eviction (HostTier, host_tier.cc)
//   redis    a volatile cache several servers share, keys partitioned (RedisTier, redis_tier.cc)
//   rocksdb  the persistent tier holding the full tables (RocksDbTier, rocksdb_tier.cc)
// A row missing in a tier is asked of the next one, and once found it fills the tiers above.
// A cache tier that fails (Redis down) is passed over: its rows are asked of the tiers below.
// A row found in no tier is an error naming the table and the id. Every tier counts hits,
// misses, evictions, bytes held, lookup time and failures.
//
// With "updates", an update tier (include/dlrec/store/updates.h) is asked first: the rows that
// online updates changed, read from a Redis Stream in a background thread.
// GPU model instances put a GPU cache tier above all of them (include/dlrec/store/gpu_cache.h):
// it is not one of the store's tiers (its rows are the model's device tables) but the store
// tells it of online updates (on_invalidate).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"

namespace dlrec::store {

// One table of the store: a model parameter "<layer>.<feature>.weight" [rows, dim].
struct TableInfo {
  std::string name;  // the parameter's name ("emb.3.weight")
  int64_t feature = 0;
  int64_t rows = 0, dim = 0;
  int64_t row_bytes() const { return dim * 4; }
  bool operator==(const TableInfo& o) const {
    return name == o.name && feature == o.feature && rows == o.rows && dim == o.dim;
  }
};

// The "embedding_store" section of a model's serving config (config.json) or of
// `dlrec predict --store FILE` (docs/SERVING.md). Relative paths are resolved against the
// directory of the file that holds them (`base_dir`).
struct StoreConfig {
  bool host = false;
  int64_t host_bytes = 0;    // bound on the rows held (row bytes + kHostEntryOverhead each)
  int64_t host_shards = 16;  // shards, by id; each holds host_bytes / host_shards
  std::string host_eviction = "lru";  // "lru" or "lfu"
  bool redis = false;
  std::string redis_host;  // "redis": {"address": "HOST:PORT"}
  int redis_port = 0;
  std::string redis_key_prefix = "dlrec";
  int64_t redis_partitions = 16;
  int64_t redis_timeout_ms = 1000;
  // While Redis is unreachable: at most one connection attempt per retry_ms; lookups in between
  // pass the tier over at once (0: every lookup tries).
  int64_t redis_retry_ms = 200;
  bool rocksdb = false;
  std::string rocksdb_path;
  int64_t rocksdb_block_cache_bytes = int64_t{8} << 20;
  // "rocksdb": {"reads"}: "pread" (RocksDB reads each block with a system call) or "mmap" (the
  // store's files mapped into memory: a block in the page cache costs no system call).
  std::string rocksdb_reads = "pread";
  // "rocksdb": {"export_id"}: the id of the export that wrote the store (model.json names it):
  // a store written by another export is refused, and Redis keys carry it, so rows of two
  // exports never mix. Empty: not checked.
  std::string rocksdb_export_id;
  // "updates": online updates read from a Redis Stream (include/dlrec/store/updates.h).
  bool updates = false;
  std::string updates_host;  // "address" (default: redis.address)
  int updates_port = 0;
  std::string updates_stream;
  int64_t updates_block_ms = 100;
  int64_t updates_max_bytes = int64_t{1} << 30;
  // Rows of each table the model stages per batch at first; grows to the largest batch's
  // distinct ids of one feature.
  int64_t staging_rows = 4096;
  // "gpu_cache" (GPU instances only; include/dlrec/store/gpu_cache.h): the cache's size as a
  // fraction of every table's rows or in bytes (neither: the default from the tables' size and
  // the device's free memory), its eviction ("lfu" or "lru") and the hit rate from which misses
  // are inserted asynchronously (below it: synchronously).
  bool gpu_cache = false;  // the section was given
  double gpu_cache_fraction = 0;
  int64_t gpu_cache_bytes = 0;
  std::string gpu_cache_eviction = "lfu";
  double gpu_cache_insert_threshold = 0.9;
  // The threads that run a batch's host work (the instance's spin team, the serving thread
  // among them; "threads", 1..1024). 0 (the default): one per table and per stored feature, at
  // most the process's thread count less one when it has more than 4 (a vCPU left for the
  // kernel, the asynchronous inserter and the GPU driver: docs/SERVING.md, "GPU cache tier").
  int gpu_cache_threads = 0;
  static StoreConfig from_json(const json& j, const std::string& base_dir,
                               const std::string& where);
  json to_json() const;
};

// Heap bytes a host-tier entry costs beyond its row's dim x 4, measured with glibc's malloc
// (tests/store/host_overhead_test.cc: 151 to 170 for dims 1 to 64): the map node with the key
// and the row's vector header (64), the eviction order's tree node (64), the row's own
// allocation header and rounding (12 to 28) and the map's bucket pointer (8 to 16). The update
// tier counts its entries with it too.
constexpr int64_t kHostEntryOverhead = 176;

struct TierStats {
  std::atomic<int64_t> hits{0}, misses{0}, evictions{0}, bytes{0};
  std::atomic<int64_t> lookups{0}, lookup_ns{0};  // batched lookups and their total time
  // Values found that are not a row of their table (the Redis tier's: read as misses).
  std::atomic<int64_t> bad_values{0};
  // A cache tier's lookups and fills that failed (Redis down): their rows were asked of the
  // tiers below. `failing`: 1 while its last request failed, 0 once it answers again.
  std::atomic<int64_t> failures{0}, failing{0};
  // The update tier's only (include/dlrec/store/updates.h): the version it serves, the rows and
  // versions applied, the versions rejected, the last version's lag (ms from push to applied).
  std::atomic<int64_t> update_version{0}, update_rows{0}, updates_applied{0}, updates_rejected{0},
      update_lag_ms{0};
};

class Tier {
 public:
  virtual ~Tier() = default;
  virtual std::string name() const = 0;  // "host", "rocksdb"
  // Looks up ids[0..n) of `table`: found rows go to out + i * dim and set found[i] = 1; rows not
  // held leave found[i] untouched (0). Errors (I/O, corrupt rows) throw naming the tier.
  virtual void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) = 0;
  // Fills rows found in a tier below (a no-op for a tier that holds every row).
  virtual void fill(int /*table*/, const int64_t* /*ids*/, int64_t /*n*/, const float* /*rows*/) {}
  // Drops copies of rows an online update replaced (a no-op for tiers that keep none; the
  // update tier above shadows them in any case).
  virtual void invalidate(int /*table*/, const int64_t* /*ids*/, int64_t /*n*/) {}
  // Whether the tier holds every row of every table (a miss there is then an error).
  virtual bool complete() const = 0;
  // The row set the tier holds (an export writes version 1; online updates raise it).
  virtual uint64_t version() const { return 1; }
  // Memory (bytes) the tier may use in this process at most, and on disk.
  virtual int64_t memory_bound() const = 0;
  virtual int64_t disk_bytes() const { return 0; }
  TierStats stats;
};

// The host-memory tier: `shards` maps keyed by (table, id), each bounded to bytes / shards,
// evicting the least recently used rows ("lru") or the least frequently used ("lfu").
std::unique_ptr<Tier> make_host_tier(const std::vector<TableInfo>& tables, int64_t bytes,
                                     int64_t shards, const std::string& eviction = "lru");

// The RocksDB tier (read-only): the store at `path` written by write_rocksdb_store; its tables
// must equal `expected` (the model's), else an error naming the difference.
// With an `export_id`, the store must have been written with that id.
// `reads`: "pread" or "mmap" (StoreConfig::rocksdb_reads).
std::unique_ptr<Tier> open_rocksdb_tier(const std::string& path,
                                        const std::vector<TableInfo>& expected,
                                        int64_t block_cache_bytes,
                                        const std::string& export_id = "",
                                        const std::string& reads = "pread");
// A table's rows for write_rocksdb_store: [rows, dim] f32, row-major.
struct TableRows {
  TableInfo info;
  const float* data = nullptr;
};
// Writes the tables into a new RocksDB store at `path` (staged under a temporary name and
// renamed into place; an existing path is replaced only with `overwrite`).
void write_rocksdb_store(const std::string& path, const std::vector<TableRows>& tables,
                         bool overwrite, const std::string& export_id = "");
// The Redis tier (hiredis): a volatile cache shared by servers, keys partitioned (redis_tier.cc).
std::unique_ptr<Tier> open_redis_tier(const std::vector<TableInfo>& tables,
                                      const StoreConfig& config);
// Whether this build has the Redis tier (libhiredis-dev found at configure time).
bool redis_available();
// Whether this build has the RocksDB tier (librocksdb-dev found at configure time).
bool rocksdb_available();

class UpdateTier;
class UpdateConsumer;
struct UpdateSnapshot;

class EmbeddingStore {
 public:
  EmbeddingStore(std::vector<TableInfo> tables, std::vector<std::unique_ptr<Tier>> tiers);
  ~EmbeddingStore();
  // Opens the tiers `config` asks for, in lookup order (updates, host, redis, rocksdb), and
  // with "updates" the thread that reads the stream.
  static std::unique_ptr<EmbeddingStore> open(const StoreConfig& config,
                                              const std::vector<TableInfo>& tables);
  // Rows of ids[0..n) of table `table` into out [n, dim]. Ids must be in [0, rows) (else an
  // error naming the table and the id); a row no tier holds is an error. A tier that is not
  // complete() and throws (Redis down) is counted in its stats.failures and passed over, as are
  // its fills; an error of the complete tier fails the lookup. Thread-safe.
  // `pinned`: the update snapshot to read (pin()); null reads the current one.
  void lookup(int table, const int64_t* ids, int64_t n, float* out,
              const UpdateSnapshot* pinned = nullptr);
  // The current update snapshot (null without "updates"): a batch pins it once and looks all
  // its tables up in it, so it sees all of a version's rows or none.
  std::shared_ptr<const UpdateSnapshot> pin() const;
  // The update tier (null without "updates").
  UpdateTier* updates() const { return updates_; }
  const std::vector<TableInfo>& tables() const { return tables_; }
  const std::vector<std::unique_ptr<Tier>>& tiers() const { return tiers_; }
  // One line per tier: its counters ("host: hits 10 misses 2 ...").
  std::string stats_text() const;
  // Calls fn(table, ids, n) for the rows each online update replaces, after the update tier
  // serves them (from the update thread): how the GPU cache drops its copies. One listener.
  using InvalidateFn = std::function<void(int, const int64_t*, int64_t)>;
  void on_invalidate(InvalidateFn fn);

 private:
  std::vector<TableInfo> tables_;
  std::vector<std::unique_ptr<Tier>> tiers_;
  UpdateTier* updates_ = nullptr;             // tiers_[0] with "updates"
  std::unique_ptr<UpdateConsumer> consumer_;  // stopped before the tiers go
  class Listener;                             // a Tier in the consumer's caches calling fn
  std::unique_ptr<Listener> listener_;
};

}  // namespace dlrec::store
