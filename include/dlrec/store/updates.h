// Online updates of the tiered embedding store (docs/SERVING.md, "Online updates"; issue 22).
//
// A push publishes the rows changed since the last push as one version through a Redis Stream;
// every serving store that names the stream reads it in a background thread and applies each
// complete, valid version atomically with respect to lookups:
//   - the rows of every applied version live in the update tier, an in-memory overlay asked
//     before every other tier (so rows cached below it, in the host tier or Redis, are shadowed
//     by the newer rows; the host tier also drops them);
//   - the overlay is an immutable snapshot replaced under a short lock (copy on write, per
//     table): a batch pins the snapshot once (EmbeddingStore::pin) and looks all its tables up
//     in it, so a request sees all of a version's rows or none.
// Stream entries (fields, values binary-safe):
//   {type: begin,  version: V}
//   {type: rows,   version: V, table: NAME, dim: D, ids: n x i64 LE, rows: n x D x f32 LE}
//   {type: commit, version: V, rows: N, time_ms: T}     (T: when the push committed, for lag)
// Versions: an export is version 1; pushes are 2, 3, ... A version is applied only when its
// commit arrives, only if every entry of it was valid, and only if it is the next one
// (applied + 1); otherwise it is rejected with a logged error naming the entry, and the store
// keeps serving the last good version. The stream is the log: a store reads it from its first
// entry when it opens, so a restarted server replays every version.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlrec/store/embedding_store.h"

namespace dlrec::store {

// The rows of one table that a version changes: rows is [ids.size(), dim] f32.
struct RowUpdate {
  int table = 0;
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

// One state of the update tier: every row changed since the export, up to `version`.
struct UpdateSnapshot {
  uint64_t version = 1;
  int64_t bytes = 0;
  std::vector<std::shared_ptr<const std::unordered_map<int64_t, std::vector<float>>>> tables;
};

// Counters of the updates a store applied (Prometheus dlrec_embedding_store_update_*).
struct UpdateStats {
  std::atomic<int64_t> versions_applied{0}, rows_applied{0}, versions_rejected{0};
  std::atomic<int64_t> lag_ms{0};  // the last applied version: applied time - commit time
  std::mutex mu;
  std::string last_error;  // the last rejection or stream error ("" when none)
  void set_error(const std::string& e);
  std::string error();
};

// The update tier: the overlay of updated rows (see above). Bounded by max_bytes (a version
// that would exceed it is rejected).
class UpdateTier final : public Tier {
 public:
  UpdateTier(std::vector<TableInfo> tables, int64_t max_bytes);
  std::string name() const override { return "updates"; }
  bool complete() const override { return false; }
  int64_t memory_bound() const override { return max_bytes_; }
  uint64_t version() const override;
  std::shared_ptr<const UpdateSnapshot> pin() const;
  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override;
  void lookup_at(const UpdateSnapshot& s, int table, const int64_t* ids, int64_t n, float* out,
                 uint8_t* found);
  // Validates every update (table, dim, ids in range, version == current + 1, the bound), then
  // makes them visible at once. Throws, changing nothing, on any error.
  void apply(uint64_t version, const std::vector<RowUpdate>& updates);
  const std::vector<TableInfo>& tables() const { return tables_; }
  // Copies `updates`' counters into stats (the metrics endpoint's TierStats).
  void publish_stats();
  UpdateStats updates;

 private:
  std::vector<TableInfo> tables_;
  int64_t max_bytes_;
  mutable std::mutex mu_;  // guards current_ (the pointer only; snapshots are immutable)
  std::shared_ptr<const UpdateSnapshot> current_;
};

// Where a stream is: a Redis server and the stream's key.
struct StreamAddress {
  std::string host;
  int port = 0;
  std::string key;
  int64_t timeout_ms = 1000;
  std::string str() const { return host + ":" + std::to_string(port) + " stream '" + key + "'"; }
};

// The rows that differ (bitwise) between `base` and `next`, per table: base[t] and next[t] are
// [rows, dim] f32 of tables[t].
std::vector<RowUpdate> diff_tables(const std::vector<TableInfo>& tables,
                                   const std::vector<const float*>& base,
                                   const std::vector<const float*>& next);

// Publishes `updates` as a version on the stream (begin, rows in chunks of at most chunk_rows
// rows, commit); returns the version. With version 0 it is the stream's last committed version
// + 1 (2 on an empty stream; a push that died before its commit is published again under its
// version); a version given (>= 2) publishes that one: how a version that stores rejected is
// published again, corrected (stores apply only the next version, so a rejected one holds the
// later ones back until it is). One pusher per stream at a time.
uint64_t publish_update(const StreamAddress& at, const std::vector<TableInfo>& tables,
                        const std::vector<RowUpdate>& updates, int64_t chunk_rows,
                        uint64_t version = 0);
// Appends one raw entry (field, value pairs) to the stream: for tools and tests.
void append_stream_entry(const StreamAddress& at,
                         const std::vector<std::pair<std::string, std::string>>& fields);

// Consumes a stream in a background thread, applying versions to an update tier (and dropping
// their rows from `caches`, tiers below it that hold copies). Stops at destruction.
class UpdateConsumer {
 public:
  UpdateConsumer(StreamAddress at, int64_t block_ms, UpdateTier* tier, std::vector<Tier*> caches);
  ~UpdateConsumer();
  // Waits (at most `ms`) until the thread has read the stream to its end once (or found it
  // unreadable): a store opened then serves the latest version from its first request.
  // Returns whether it had.
  bool wait_caught_up(int64_t ms);
  UpdateConsumer(const UpdateConsumer&) = delete;
  UpdateConsumer& operator=(const UpdateConsumer&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::store
