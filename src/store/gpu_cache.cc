// The GPU cache tier's host side: sizing, the batch remap with sync/async inserts
// (include/dlrec/store/gpu_cache.h). The slot maps are in gpu_cache_slots.cc, the device writes
// in gpu_cache_cuda.cu, the diagnostic per-batch record in gpu_cache_phases.cc.
#include "dlrec/store/gpu_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::store {

void DeviceRows::write(const std::vector<RowBlock>& blocks) {
  std::vector<int64_t> rows;
  std::vector<float> data;
  for (const RowBlock& b : blocks) {
    if (b.n <= 0) continue;
    write(b.table, b.rows, b.n, b.data);
    if (!b.also) continue;
    rows.clear();
    data.clear();
    for (int64_t i = 0; i < b.n; ++i)
      if (b.also[i] >= 0) {
        rows.push_back(b.also[i]);
        data.insert(data.end(), b.data + i * b.dim, b.data + (i + 1) * b.dim);
      }
    if (!rows.empty()) write(b.table, rows.data(), static_cast<int64_t>(rows.size()), data.data());
  }
}

// ---- sizing -------------------------------------------------------------------------------

GpuCacheSizing size_gpu_cache(const StoreConfig& config, const std::vector<TableInfo>& tables,
                              int64_t free_bytes, int64_t total_bytes) {
  GpuCacheSizing z;
  int64_t table_bytes = 0;
  std::vector<int64_t> feature_rows, feature_row_bytes;
  for (const TableInfo& t : tables) {
    table_bytes += t.rows * t.row_bytes();
    auto it = std::find(z.features.begin(), z.features.end(), t.feature);
    if (it == z.features.end()) {
      z.features.push_back(t.feature);
      feature_rows.push_back(t.rows);
      feature_row_bytes.push_back(0);
      it = z.features.end() - 1;
    }
    feature_row_bytes[it - z.features.begin()] += t.row_bytes();
  }
  DLREC_CHECK(table_bytes > 0, "gpu cache: the model has no stored table");
  char buf[160];
  if (config.gpu_cache_bytes > 0) {
    DLREC_CHECK(total_bytes < 0 || config.gpu_cache_bytes <= total_bytes, "gpu_cache.bytes ",
                config.gpu_cache_bytes, " is larger than the device (", total_bytes, " bytes)");
    z.fraction = std::min(1.0, static_cast<double>(config.gpu_cache_bytes) / table_bytes);
    std::snprintf(buf, sizeof buf, "gpu_cache.bytes %lld",
                  static_cast<long long>(config.gpu_cache_bytes));
  } else if (config.gpu_cache_fraction > 0) {
    z.fraction = config.gpu_cache_fraction;
    std::snprintf(buf, sizeof buf, "gpu_cache.fraction %g", config.gpu_cache_fraction);
  } else {
    DLREC_CHECK(free_bytes >= 0, "gpu cache: no size given and the device's free memory unknown");
    z.fraction = std::min(1.0, 0.5 * static_cast<double>(free_bytes) / table_bytes);
    std::snprintf(buf, sizeof buf,
                  "default: half of the device's %.1f MiB free, %.1f MiB of tables",
                  free_bytes / 1048576.0, table_bytes / 1048576.0);
  }
  z.how = buf;
  int64_t staging_bytes = 0;
  for (size_t k = 0; k < z.features.size(); ++k) {
    const auto rows = static_cast<int64_t>(std::floor(feature_rows[k] * z.fraction));
    z.cache_rows.push_back(std::clamp<int64_t>(rows, 1, feature_rows[k]));
    z.cache_bytes += z.cache_rows.back() * feature_row_bytes[k];
    staging_bytes += config.staging_rows * feature_row_bytes[k];
  }
  const int64_t need = z.cache_bytes + staging_bytes;
  if (total_bytes >= 0)
    DLREC_CHECK(z.cache_bytes <= total_bytes, "gpu_cache: ", z.cache_bytes, " bytes (", z.how,
                ") are larger than the device (", total_bytes, " bytes)");
  if (free_bytes >= 0)
    DLREC_CHECK(need <= free_bytes, "gpu_cache: ", z.cache_bytes, " bytes of cache (", z.how,
                ") + ", staging_bytes, " bytes of staging rows do not fit in the ", free_bytes,
                " bytes free on the device");
  return z;
}

// ---- GpuCache -----------------------------------------------------------------------------

GpuCache::GpuCache(EmbeddingStore& store, const StoreConfig& config, GpuCacheSizing sizing)
    : store_(store),
      sizing_(std::move(sizing)),
      lfu_(config.gpu_cache_eviction == "lfu"),
      threshold_(config.gpu_cache_insert_threshold) {
  DLREC_CHECK(config.gpu_cache_eviction == "lfu" || config.gpu_cache_eviction == "lru",
              "gpu_cache.eviction: '", config.gpu_cache_eviction, "' (lfu or lru)");
  DLREC_CHECK(threshold_ >= 0 && threshold_ <= 1, "gpu_cache.insert_threshold: ", threshold_,
              " is outside [0, 1]");
  const size_t F = sizing_.features.size();
  feature_rows_.assign(F, 0);
  tables_of_feature_.assign(F, 0);
  for (const TableInfo& t : store_.tables()) {
    const auto k = static_cast<size_t>(feature_index(t.feature));
    feature_of_table_.push_back(static_cast<int>(k));
    feature_rows_[k] = t.rows;
    ++tables_of_feature_[k];
  }
  for (size_t k = 0; k < F; ++k) maps_.emplace_back(sizing_.cache_rows[k], lfu_, feature_rows_[k]);
  work_.resize(F);
  pieces_left_ = std::make_unique<std::atomic<int>[]>(F);
  // Members for a batch's tasks (F remaps, then T fetches beside F slot map updates), the
  // caller being one; they watch for the next batch for 250 us before sleeping. By default one
  // thread of the process is left out where it has more than 4: the members spin between
  // jobs, so a team of every vCPU keeps all of them busy, and whatever else must run (the
  // kernel, the GPU driver's threads, the asynchronous inserter) would take one from a member
  // whose task the batch waits for. (On the quiet H200 host measured, teams of 12, 15 and 16
  // gave the same p99: bench/RESULTS.md, "GPU cache tier".)
  DLREC_CHECK(config.gpu_cache_threads >= 0 && config.gpu_cache_threads <= 1024,
              "gpu_cache.threads: ", config.gpu_cache_threads, " is outside [0, 1024]");
  const int all = std::max(1, num_threads());
  const int members =
      config.gpu_cache_threads > 0
          ? config.gpu_cache_threads
          : std::min<int>(static_cast<int>(store_.tables().size() + F), all > 4 ? all - 1 : all);
  team_ = std::make_unique<SpinTeam>(members, 250);
  relink_job_ = [this](int) {
    const int n = static_cast<int>(work_.size());
    for (int k; (k = relink_next_.fetch_add(1, std::memory_order_relaxed)) < n;)
      relink_hits(static_cast<size_t>(k));
  };
  inserter_ = std::thread([this] { insert_loop(); });
  store_.on_invalidate([this](int t, const int64_t* ids, int64_t n) { invalidate(t, ids, n); });
}

void GpuCache::run_tasks(int n, bool threaded, const std::function<void(int)>& fn,
                         TeamPhase* rec) {
  if (rec) return run_tasks_timed(n, threaded, fn, rec);
  if (!threaded) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int> next{0};
  team_->run([&](int) {
    for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  });
}

GpuCache::~GpuCache() {
  store_.on_invalidate(nullptr);
  {
    std::lock_guard<std::mutex> l(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  inserter_.join();
}

int64_t GpuCache::feature_index(int64_t feature) const {
  auto it = std::find(sizing_.features.begin(), sizing_.features.end(), feature);
  DLREC_CHECK(it != sizing_.features.end(), "gpu cache: feature ", feature, " is not stored");
  return it - sizing_.features.begin();
}

void GpuCache::bind(std::unique_ptr<DeviceRows> rows, int64_t staging_rows) {
  for (int64_t c : sizing_.cache_rows)  // the remap keeps device rows in 31 bits
    DLREC_CHECK(staging_rows >= 0 && c + staging_rows < (int64_t{1} << 31) - 2, "gpu cache: ", c,
                " cache rows + ", staging_rows, " staging rows exceed 2^31 - 3 per feature");
  std::lock_guard<std::mutex> l(mu_);
  rows_ = std::move(rows);
  staging_ = staging_rows;
  for (SlotMap& m : maps_) m.clear();
  ++generation_;  // queued inserts were for the old tables
  stats.bytes = 0;
}

double GpuCache::recent_hit_rate() const {
  return recent_lookups_ > 0 ? recent_hits_ / recent_lookups_ : 0.0;
}

// The remap's first half: the cache slots of feature k's ids [lo, hi) into work_[k].found (-1:
// not cached), the index's memory access started kAhead ids earlier. Read-only, so the pieces
// of a large batch run on several threads at once (they are bound by the memory latency of
// slot maps of hundreds of MiB).
void GpuCache::look_up(const io::Batch& batch, size_t k, int64_t lo, int64_t hi) {
  constexpr int64_t kAhead = 48;
  const auto feature = static_cast<size_t>(sizing_.features[k]);
  const int64_t rows = feature_rows_[k];
  const std::vector<int64_t>& in = batch.cat_indices[feature];
  int32_t* found = work_[k].found.data();
  maps_[k].visit_index([&](const auto& index) {
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kAhead < hi) index.prefetch(in[i + kAhead]);
      const int64_t id = in[i];
      if (id < 0 || id >= rows)
        fail("embedding store: id ", id, " is beyond the tables of feature ", feature, " (", rows,
             " rows)");
      found[i] = index.find(id);
    }
  });
}

// The remap's second half, per feature (once its lookups are done): feature k's ids into
// staged_ (under mu_), each distinct id once. A hit is its slot, read from work_[k].found (an
// id's slot is its own, so the distinct hits are the distinct slots: a bit per slot, in a
// bitmap of the cache's slots that stays in the caches, marks the ones listed); a miss takes a
// staging row, the first time it appears (work_[k].seen, over the misses only), and is listed
// for the fetch. The bitmap's bits stay set until the next batch's remap (maintain's inserts
// pass over the slots marked). The slot map is not changed here: inserts are maintain()'s, the
// hits' relinks relink_hits'.
void GpuCache::remap(const io::Batch& batch, size_t k) {
  FeatureWork& w = work_[k];
  const int64_t C = sizing_.cache_rows[k];
  const auto words = static_cast<size_t>((C + 63) / 64);
  if (w.hit_bits.size() != words) w.hit_bits.assign(words, 0);
  uint64_t* bits = w.hit_bits.data();
  for (int32_t s : w.hit_slots) bits[static_cast<uint32_t>(s) >> 6] = 0;  // the last batch's
  w.hit_slots.clear();
  w.fetch_ids.clear();
  w.fetch_rows.clear();
  w.slots.clear();
  w.inserted.clear();
  w.miss_at.clear();
  w.evictions = w.id_hits = 0;
  const auto feature = static_cast<size_t>(sizing_.features[k]);
  const std::vector<int64_t>& in = batch.cat_indices[feature];
  std::vector<int64_t>& ids = staged_.cat_indices[feature];
  const auto n = static_cast<int64_t>(in.size());
  const int32_t* found = w.found.data();
  int64_t id_hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = found[i];
    if (slot < 0) {
      w.miss_at.push_back(static_cast<int32_t>(i));
      continue;
    }
    ++id_hits;
    ids[i] = slot;
    uint64_t& word = bits[static_cast<uint32_t>(slot) >> 6];
    const uint64_t bit = uint64_t{1} << (slot & 63);
    if (word & bit) continue;
    word |= bit;
    w.hit_slots.push_back(slot);
  }
  // seen: a missed id -> its staging row.
  w.seen.reset(static_cast<int64_t>(w.miss_at.size()));
  for (int32_t i : w.miss_at) {
    const int64_t id = in[static_cast<size_t>(i)];
    bool added = false;
    int32_t* seen = w.seen.emplace(id, &added);
    if (!added) {
      ids[static_cast<size_t>(i)] = *seen;
      continue;
    }
    const int64_t row = C + static_cast<int64_t>(w.fetch_rows.size());
    w.fetch_ids.push_back(id);
    w.fetch_rows.push_back(row);
    *seen = static_cast<int32_t>(row);
    ids[static_cast<size_t>(i)] = row;
  }
  w.id_hits = id_hits;
}

// Before the batch's device write, when sync (on the team, beside the fetch): its misses given
// slots, none of its hits evicted (their bits in hit_bits: no stamp to write). Their recency
// and counts are relink_hits', beside the forward.
void GpuCache::maintain(size_t k) {
  constexpr size_t kAhead = 16;
  FeatureWork& w = work_[k];
  SlotMap& map = maps_[k];
  const size_t m = w.fetch_ids.size();
  w.slots.resize(m);
  const uint64_t* in_use = w.hit_bits.data();
  map.visit_index([&](const auto& index) {  // (inserts never move the index's cells)
    for (size_t j = 0; j < m; ++j) {
      if (j + kAhead < m) index.prefetch(w.fetch_ids[j + kAhead]);
      int64_t evicted = -1;
      w.slots[j] = map.insert(w.fetch_ids[j], stamp_, &evicted, in_use);
      if (evicted >= 0) ++w.evictions;
      if (w.slots[j] >= 0) w.inserted.push_back(w.fetch_ids[j]);
    }
  });
}

void GpuCache::relink_hits(size_t k) {
  constexpr size_t kAhead = 16;
  const FeatureWork& w = work_[k];
  SlotMap& map = maps_[k];
  const size_t h = w.hit_slots.size();
  // Two steps ahead: a slot's record kAhead hits earlier, its list neighbours (which the relink
  // changes) kAhead / 2 earlier, once the record has arrived.
  for (size_t j = 0; j < h; ++j) {
    if (j + kAhead < h) map.prefetch_slot(w.hit_slots[j + kAhead]);
    if (j + kAhead / 2 < h) map.prefetch_links(w.hit_slots[j + kAhead / 2]);
    map.relink(w.hit_slots[j]);
  }
}

// staged_ = batch, but for the stored features' ids, which the remap writes (saves a copy of
// most of the batch's bytes): sized here, the bytes listed in copies_ (pieces of at most
// kCopyPiece bytes, for the team).
void GpuCache::plan_copies(const io::Batch& batch) {
  struct Members {  // io::Batch's, to notice one added there (copy it here too)
    int64_t rows;
    int num_dense;
    std::vector<float> labels, dense;
    std::vector<std::vector<int64_t>> cat_offsets, cat_indices;
    bool one_id_per_row;
  };
  static_assert(sizeof(Members) == sizeof(io::Batch), "io::Batch changed: copy it here");
  constexpr size_t kCopyPiece = size_t{64} << 10;
  copies_.clear();
  auto plan = [&](auto& to, const auto& from) {
    to.resize(from.size());
    const auto* src = reinterpret_cast<const char*>(from.data());
    auto* dst = reinterpret_cast<char*>(to.data());
    const size_t bytes = from.size() * sizeof(from[0]);
    for (size_t at = 0; at < bytes; at += kCopyPiece)
      copies_.push_back({dst + at, src + at, std::min(kCopyPiece, bytes - at)});
  };
  staged_.rows = batch.rows;
  staged_.num_dense = batch.num_dense;
  staged_.one_id_per_row = batch.one_id_per_row;
  plan(staged_.labels, batch.labels);
  plan(staged_.dense, batch.dense);
  staged_.cat_offsets.resize(batch.cat_offsets.size());
  for (size_t f = 0; f < batch.cat_offsets.size(); ++f)
    plan(staged_.cat_offsets[f], batch.cat_offsets[f]);
  staged_.cat_indices.resize(batch.cat_indices.size());
  for (size_t f = 0; f < batch.cat_indices.size(); ++f)
    if (std::find(sizing_.features.begin(), sizing_.features.end(), static_cast<int64_t>(f)) ==
        sizing_.features.end())
      plan(staged_.cat_indices[f], batch.cat_indices[f]);
    else  // the remap writes every id
      staged_.cat_indices[f].resize(batch.cat_indices[f].size());
}

void GpuCache::undo_inserts() {
  for (size_t k = 0; k < work_.size(); ++k)
    for (int64_t id : work_[k].inserted) maps_[k].erase(id);
}

int64_t GpuCache::run(const io::Batch& batch,
                      const std::function<void(const io::Batch&)>& forward) {
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t).count();
  };
  const auto t_wait = clock::now();
  BatchPhases* ph = keep_phases_ ? &phases_ : nullptr;
  int64_t insert_runs0 = 0, insert_ns0 = 0;
  if (ph) {
    *ph = BatchPhases{};
    std::lock_guard<std::mutex> q(queue_mu_);
    ph->inserter_busy = busy_ || !queue_.empty();
    insert_runs0 = insert_runs_.load();
    insert_ns0 = insert_run_ns_.load();
  }
  int64_t preempted0 = 0, faults0 = 0, slept0 = 0;
  if (ph) thread_usage(&preempted0, &faults0, &slept0);
  batches_waiting_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock<std::mutex> lock(mu_);
  batches_waiting_.fetch_sub(1, std::memory_order_relaxed);
  DLREC_CHECK(rows_ != nullptr, "gpu cache: no device tables bound (bug)");
  const auto t0 = clock::now();
  times.wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - t_wait).count();
  if (ph) ph->wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - t_wait).count();
  // The update snapshot is pinned under the lock: an update applied after it invalidates its
  // rows after this batch (the invalidation waits for the lock), so no stale row stays cached.
  const auto pinned = store_.pin();
  const uint64_t generation = generation_;
  const bool sync = recent_hit_rate() < threshold_;
  const size_t F = sizing_.features.size();
  for (size_t k = 0; k < F; ++k) {
    const auto feature = static_cast<size_t>(sizing_.features[k]);
    DLREC_CHECK(feature < batch.cat_indices.size(), "embedding store: the batch has ",
                batch.cat_indices.size(), " categorical features; feature ", feature, " is stored");
  }
  for (FeatureWork& w : work_) w.inserted.clear();  // (undo_inserts may run before a remap)
  // On several threads for large batches, in one team job: the lookups, in pieces of
  // kLookUpPiece ids of a feature, each feature's remap run by the task that looked up its last
  // piece (the slot maps are independent); then the copy of the rest of the batch in pieces.
  constexpr int64_t kLookUpPiece = 512;
  int64_t total_ids = 0;
  std::vector<std::pair<int, int64_t>>& pieces = pieces_;
  pieces.clear();
  for (size_t k = 0; k < F; ++k) {
    const auto n = static_cast<int64_t>(batch.cat_indices[sizing_.features[k]].size());
    total_ids += n;
    work_[k].found.resize(static_cast<size_t>(n));
    const auto before = pieces.size();
    for (int64_t lo = 0; lo < n; lo += kLookUpPiece) pieces.emplace_back(static_cast<int>(k), lo);
    if (pieces.size() == before) pieces.emplace_back(static_cast<int>(k), 0);  // (no ids)
    pieces_left_[k].store(static_cast<int>(pieces.size() - before), std::memory_order_relaxed);
  }
  const bool threaded = total_ids >= 4096;
  plan_copies(batch);
  const auto P = static_cast<int>(pieces.size());
  run_tasks(P + static_cast<int>(copies_.size()), threaded, [&](int p) {
    if (p >= P) {
      const Copy& c = copies_[static_cast<size_t>(p - P)];
      std::memcpy(c.to, c.from, c.bytes);
      return;
    }
    const auto [k, lo] = pieces[static_cast<size_t>(p)];
    const auto n = static_cast<int64_t>(work_[k].found.size());
    look_up(batch, static_cast<size_t>(k), lo, std::min(n, lo + kLookUpPiece));
    // The last piece's task (its own and the other pieces' found[] seen through the counter).
    if (pieces_left_[k].fetch_sub(1, std::memory_order_acq_rel) == 1)
      remap(batch, static_cast<size_t>(k));
  }, ph ? &ph->team[0] : nullptr);
  if (ph) ph->lookup_ns = since(t0);
  int64_t hits = 0, misses = 0, need = 0, hits_w = 0, lookups_w = 0;
  int64_t id_hits_w = 0, id_lookups_w = 0;
  for (size_t k = 0; k < F; ++k) {
    const FeatureWork& w = work_[k];
    const int64_t tables_k = tables_of_feature_[k];
    const auto h = static_cast<int64_t>(w.hit_slots.size());
    const auto m = static_cast<int64_t>(w.fetch_ids.size());
    const auto n = static_cast<int64_t>(staged_.cat_indices[sizing_.features[k]].size());
    need = std::max(need, m);
    hits += h;
    misses += m;
    hits_w += h * tables_k;
    lookups_w += (h + m) * tables_k;
    id_hits_w += w.id_hits * tables_k;
    id_lookups_w += n * tables_k;
  }
  if (need > staging_) return need;  // nothing changed yet
  ++stamp_;
  const auto t1 = clock::now();
  times.remap_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  if (ph) {
    ph->remap_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() -
                   ph->lookup_ns;
    ph->misses = misses;
    ph->sync = sync;
  }
  // The misses from the tiers below (per table, straight into the device rows' host buffer),
  // beside the slot maps' sync inserts (per feature, when sync); then into their device rows,
  // all tables in one write. The rows are kept for the async insert.
  InsertJob job{generation, {}, {}};
  const auto& tables = store_.tables();
  const size_t T = tables.size();
  job.rows.resize(T);
  std::vector<int64_t> offset(T + 1, 0);  // of table t's rows in the values buffer, in floats
  for (size_t t = 0; t < T; ++t)
    offset[t + 1] = offset[t] + static_cast<int64_t>(work_[feature_of_table_[t]].fetch_ids.size()) *
                                    tables[t].dim;
  float* values = rows_->values_buffer(offset[T]);
  const auto t_settled = clock::now();
  if (ph) ph->settle_ns = since(t1);
  auto task = [&](size_t i) {
    if (i >= T) return maintain(i - T);
    const std::vector<int64_t>& want = work_[feature_of_table_[i]].fetch_ids;
    const auto n = static_cast<int64_t>(want.size());
    if (n == 0) return;
    float* out = values + offset[i];
    store_.lookup(static_cast<int>(i), want.data(), n, out, pinned.get());
    if (!sync) job.rows[i].assign(out, out + (offset[i + 1] - offset[i]));
  };
  try {
    // (the store is thread-safe; the slot maps are one per feature)
    run_tasks(static_cast<int>(sync ? T + F : T), threaded,
              [&](int i) { task(static_cast<size_t>(i)); },
              ph ? &ph->team[1] : nullptr);
    const auto t2 = clock::now();
    times.fetch_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count();
    if (ph) ph->fetch_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t_settled).count();
    std::vector<RowBlock> blocks;
    for (size_t t = 0; t < T; ++t) {
      const FeatureWork& w = work_[feature_of_table_[t]];
      const auto n = static_cast<int64_t>(w.fetch_rows.size());
      if (n > 0)
        blocks.push_back({static_cast<int>(t), n, tables[t].dim, w.fetch_rows.data(),
                          values + offset[t], sync ? w.slots.data() : nullptr});
    }
    // Enqueued ahead of the forward on the model's stream (no wait here: the forward's host
    // packing overlaps the copy and the scatter).
    if (!blocks.empty()) rows_->write_ahead(blocks);
    times.write_ns += since(t2);
    if (ph) ph->write_ns = since(t2);
  } catch (...) {  // a tier failed (Redis down...): the slots taken were not (all) written
    undo_inserts();
    throw;
  }
  int64_t evictions = 0;
  for (const FeatureWork& w : work_) evictions += w.evictions;
  stats.hits += hits_w;
  stats.misses += lookups_w - hits_w;
  stats.evictions += evictions;
  stats.lookups += 1;
  stats.lookup_ns += since(t0);
  id_hits += id_hits_w;
  id_lookups += id_lookups_w;
  int64_t cached_bytes = 0;
  for (size_t t = 0; t < T; ++t)
    cached_bytes += maps_[feature_of_table_[t]].size() * tables[t].row_bytes();
  stats.bytes = cached_bytes;
  // The recent hit rate: lookups of about the last 64K distinct ids (halved as it passes).
  recent_hits_ += static_cast<double>(hits);
  recent_lookups_ += static_cast<double>(hits + misses);
  while (recent_lookups_ > 65536) {
    recent_hits_ *= 0.5;
    recent_lookups_ *= 0.5;
  }
  (sync ? sync_batches : async_batches) += 1;
  // The hits' relinks on the team while this thread runs the forward (which mostly waits for
  // the GPU); in order after it for small batches. The instance stays held until they end.
  if (threaded) {
    relink_next_.store(0, std::memory_order_relaxed);
    team_->post(relink_job_);
  }
  auto relinks = [&] {
    if (threaded)
      team_->wait();
    else
      for (size_t k = 0; k < F; ++k) relink_hits(k);
  };
  const auto t3 = clock::now();
  try {
    forward(staged_);
  } catch (...) {
    relinks();
    rows_->settle();
    throw;
  }
  rows_->settle();  // done by now (the forward waited for its stream): marks the buffers free
  const auto t4 = clock::now();
  times.forward_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t4 - t3).count();
  relinks();
  times.relink_ns += since(t4);
  times.batches += 1;
  if (ph) {
    ph->forward_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t4 - t3).count();
    ph->relink_ns = since(t4);
    ph->total_ns = since(t_wait);
    thread_usage(&ph->caller_preempted, &ph->caller_faults, &ph->caller_slept);
    ph->caller_preempted -= preempted0;
    ph->caller_slept -= slept0;
    ph->caller_faults -= faults0;
    ph->inserts = insert_runs_.load() - insert_runs0;
    ph->insert_ns = insert_run_ns_.load() - insert_ns0;
  }
  if (sync || misses == 0) return 0;
  job.ids.resize(F);
  for (size_t k = 0; k < F; ++k) job.ids[k].swap(work_[k].fetch_ids);
  lock.unlock();
  {
    std::lock_guard<std::mutex> q(queue_mu_);
    if (queue_.size() >= 4) {  // bounded: under a burst of misses, later batches insert them
      async_dropped += misses;
      return 0;
    }
    queue_.push_back(std::move(job));
  }
  queue_cv_.notify_one();
  return 0;
}

void GpuCache::insert_loop() {
  for (;;) {
    InsertJob job;
    {
      std::unique_lock<std::mutex> q(queue_mu_);
      queue_cv_.wait(q, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    try {
      apply_insert(job);
    } catch (const std::exception& e) {  // a device error: the rows stay uncached
      std::fprintf(stderr, "dlrec gpu cache: asynchronous insert failed: %s\n", e.what());
    }
    {
      std::lock_guard<std::mutex> q(queue_mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
    // A batch waiting for the instance goes first: without this the next queued insert took
    // the instance again before the waiting batch's thread woke up, and a batch waited for
    // four inserts in a row (bench/RESULTS.md, "GPU cache tier"). Bounded, in case what the
    // batch waits for is an invalidation.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    while (batches_waiting_.load(std::memory_order_relaxed) > 0 &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
  }
}

void GpuCache::apply_insert(InsertJob& job) {
  std::lock_guard<std::mutex> l(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  struct Timed {  // its time under the lock, for BatchPhases
    GpuCache& c;
    std::chrono::steady_clock::time_point t0;
    ~Timed() {
      c.insert_run_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - t0)
                              .count();
      c.insert_runs_ += 1;
    }
  } timed{*this, t0};
  int64_t n_ids = 0;
  for (const auto& v : job.ids) n_ids += static_cast<int64_t>(v.size());
  if (job.generation != generation_ || !rows_) {  // an update or a rebuild since the fetch
    async_dropped += n_ids;
    return;
  }
  ++stamp_;
  const auto& tables = store_.tables();
  const size_t F = job.ids.size();
  std::vector<std::vector<int64_t>> slots(F), from(F);
  std::vector<int64_t> evicted_k(F, 0);
  // Per feature on the team (the instance is held meanwhile, so they are quick about it: one
  // thread took ~200 us for a batch of 2048's ~700 misses).
  run_tasks(static_cast<int>(F), n_ids >= 256, [&](int ki) {
    const auto k = static_cast<size_t>(ki);
    for (size_t j = 0; j < job.ids[k].size(); ++j) {
      const int64_t id = job.ids[k][j];
      if (maps_[k].contains(id)) continue;  // inserted by a batch since
      int64_t evicted = -1;
      const int64_t s = maps_[k].insert(id, stamp_, &evicted);
      if (evicted >= 0) ++evicted_k[k];
      if (s < 0) continue;
      slots[k].push_back(s);
      from[k].push_back(static_cast<int64_t>(j));
    }
  });
  int64_t evictions = 0;
  for (int64_t e : evicted_k) evictions += e;
  std::vector<std::vector<float>> rows(tables.size());
  std::vector<RowBlock> blocks;
  for (size_t t = 0; t < tables.size(); ++t) {
    const size_t k = static_cast<size_t>(feature_of_table_[t]);
    if (slots[k].empty()) continue;
    const int64_t dim = tables[t].dim;
    rows[t].resize(slots[k].size() * static_cast<size_t>(dim));
    for (size_t i = 0; i < from[k].size(); ++i)
      std::copy_n(job.rows[t].data() + from[k][i] * dim, dim, rows[t].data() + i * dim);
    blocks.push_back({static_cast<int>(t), static_cast<int64_t>(slots[k].size()), dim,
                      slots[k].data(), rows[t].data()});
  }
  // Enqueued ahead of the next batch's forward on the model's stream, not waited for (the
  // rows are copied into the writer's own buffers first); the next write, values_buffer() or
  // drain() waits for it.
  if (!blocks.empty()) rows_->write_ahead(blocks);
  int64_t inserted = 0, cached_bytes = 0;
  for (const auto& v : slots) inserted += static_cast<int64_t>(v.size());
  for (size_t t = 0; t < tables.size(); ++t)
    cached_bytes += maps_[feature_of_table_[t]].size() * tables[t].row_bytes();
  async_inserted += inserted;
  stats.evictions += evictions;
  stats.bytes = cached_bytes;
}

void GpuCache::invalidate(int table, const int64_t* ids, int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  ++generation_;
  if (table < 0 || table >= static_cast<int>(feature_of_table_.size())) return;
  SlotMap& map = maps_[feature_of_table_[table]];
  for (int64_t i = 0; i < n; ++i) map.erase(ids[i]);
}

void GpuCache::drain() {
  {
    std::unique_lock<std::mutex> q(queue_mu_);
    idle_cv_.wait(q, [&] { return queue_.empty() && !busy_; });
  }
  std::lock_guard<std::mutex> l(mu_);  // the last insert's device write done too
  if (rows_) rows_->settle();
}

#ifndef DLREC_WITH_CUDA
std::unique_ptr<DeviceRows> make_cuda_rows(int, std::vector<float*>, std::vector<int64_t>,
                                           std::vector<int64_t>, void*) {
  fail("the GPU cache tier needs a CUDA build (this dlrec was built without CUDA)");
}
void cuda_memory_info(int, int64_t*, int64_t*) {
  fail("the GPU cache tier needs a CUDA build (this dlrec was built without CUDA)");
}
#endif

}  // namespace dlrec::store
