// The GPU cache tier's host side: slot maps, sizing, the batch remap with sync/async inserts
// (include/dlrec/store/gpu_cache.h). The device writes are in gpu_cache_cuda.cu.
#include "dlrec/store/gpu_cache.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "dlrec/core/error.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::store {

// ---- SlotMap ------------------------------------------------------------------------------

SlotMap::SlotMap(int64_t capacity, bool lfu) : lfu_(lfu) {
  DLREC_CHECK(capacity >= 1 && capacity < (int64_t{1} << 31), "gpu cache: ", capacity,
              " slots (1 .. 2^31 - 1 per feature)");
  const auto c = static_cast<size_t>(capacity);
  id_.assign(c, -1);
  prev_.assign(c, -1);
  next_.assign(c, -1);
  bucket_.assign(c, -1);
  stamp_.assign(c, 0);
  where_.reserve(c);
  clear();
}

void SlotMap::clear() {
  where_.clear();
  std::fill(id_.begin(), id_.end(), -1);
  std::fill(bucket_.begin(), bucket_.end(), -1);
  std::fill(stamp_.begin(), stamp_.end(), 0);
  free_slots_.clear();
  for (int64_t s = capacity() - 1; s >= 0; --s) free_slots_.push_back(static_cast<int32_t>(s));
  buckets_.clear();
  free_buckets_.clear();
  first_ = -1;
}

int32_t SlotMap::new_bucket(int64_t count, int32_t after) {
  int32_t b;
  if (!free_buckets_.empty()) {
    b = free_buckets_.back();
    free_buckets_.pop_back();
  } else {
    b = static_cast<int32_t>(buckets_.size());
    buckets_.push_back({});
  }
  Bucket& n = buckets_[b];
  n.count = count;
  n.head = n.tail = -1;
  n.prev = after;
  n.next = after < 0 ? first_ : buckets_[after].next;
  if (n.next >= 0) buckets_[n.next].prev = b;
  if (after < 0)
    first_ = b;
  else
    buckets_[after].next = b;
  return b;
}

void SlotMap::unlink(int32_t s) {
  const int32_t b = bucket_[s];
  Bucket& k = buckets_[b];
  if (prev_[s] >= 0)
    next_[prev_[s]] = next_[s];
  else
    k.head = next_[s];
  if (next_[s] >= 0)
    prev_[next_[s]] = prev_[s];
  else
    k.tail = prev_[s];
  prev_[s] = next_[s] = bucket_[s] = -1;
  if (k.head < 0) {  // empty: out of the bucket list
    if (k.prev >= 0)
      buckets_[k.prev].next = k.next;
    else
      first_ = k.next;
    if (k.next >= 0) buckets_[k.next].prev = k.prev;
    free_buckets_.push_back(b);
  }
}

void SlotMap::push_back(int32_t s, int32_t b) {
  Bucket& k = buckets_[b];
  prev_[s] = k.tail;
  next_[s] = -1;
  if (k.tail >= 0)
    next_[k.tail] = s;
  else
    k.head = s;
  k.tail = s;
  bucket_[s] = b;
}

int64_t SlotMap::find(int64_t id, uint64_t stamp) {
  auto it = where_.find(id);
  if (it == where_.end()) return -1;
  const int32_t s = it->second;
  stamp_[s] = stamp;
  const int32_t b = bucket_[s];
  if (!lfu_) {  // one list: to its tail
    if (buckets_[b].tail != s) {
      unlink(s);  // never empties the bucket: s was not its only slot
      push_back(s, b);
    }
    return s;
  }
  const int64_t count = buckets_[b].count + 1;
  int32_t nb = buckets_[b].next;
  if (nb < 0 || buckets_[nb].count != count) nb = new_bucket(count, b);
  unlink(s);  // may free b (nb is linked after it, so stays)
  push_back(s, nb);
  return s;
}

int64_t SlotMap::insert(int64_t id, uint64_t stamp, int64_t* evicted) {
  *evicted = -1;
  int32_t s = -1;
  if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    // The least valuable slot the batch does not use: from the first bucket's head on.
    int scanned = 0;
    for (int32_t b = first_; b >= 0 && s < 0 && scanned < kMaxScan; b = buckets_[b].next)
      for (int32_t c = buckets_[b].head; c >= 0 && scanned < kMaxScan; c = next_[c], ++scanned)
        if (stamp_[c] != stamp) {
          s = c;
          break;
        }
    if (s < 0) return -1;
    *evicted = id_[s];
    where_.erase(id_[s]);
    unlink(s);
  }
  id_[s] = id;
  stamp_[s] = stamp;
  where_.emplace(id, s);
  const int64_t count = 1;
  int32_t b = first_;
  if (b < 0 || buckets_[b].count != count) b = new_bucket(count, -1);
  push_back(s, b);
  return s;
}

bool SlotMap::erase(int64_t id) {
  auto it = where_.find(id);
  if (it == where_.end()) return false;
  const int32_t s = it->second;
  where_.erase(it);
  unlink(s);
  id_[s] = -1;
  stamp_[s] = 0;
  free_slots_.push_back(s);
  return true;
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
  for (const TableInfo& t : store_.tables())
    feature_of_table_.push_back(static_cast<int>(feature_index(t.feature)));
  for (int64_t c : sizing_.cache_rows) maps_.emplace_back(c, lfu_);
  inserter_ = std::thread([this] { insert_loop(); });
  store_.on_invalidate([this](int t, const int64_t* ids, int64_t n) { invalidate(t, ids, n); });
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

// Long (~160 lines) on purpose: the remap, the fetch and the forward of a batch are one
// critical section, with the rollbacks (more staging rows needed, a bad id, a tier failing).
int64_t GpuCache::run(const io::Batch& batch,
                      const std::function<void(const io::Batch&)>& forward) {
  std::unique_lock<std::mutex> lock(mu_);
  DLREC_CHECK(rows_ != nullptr, "gpu cache: no device tables bound (bug)");
  const auto t0 = std::chrono::steady_clock::now();
  // The update snapshot is pinned under the lock: an update applied after it invalidates its
  // rows after this batch (the invalidation waits for the lock), so no stale row stays cached.
  const auto pinned = store_.pin();
  const uint64_t generation = generation_;
  const bool sync = recent_hit_rate() < threshold_;
  ++stamp_;
  staged_ = batch;
  const size_t F = sizing_.features.size();
  std::vector<std::vector<int64_t>> fetch_ids(F), fetch_rows(F), inserted(F);
  int64_t hits = 0, misses = 0, lookups_weighted = 0, hits_weighted = 0, evictions = 0;
  int64_t need = 0;
  std::vector<int64_t> tables_per_feature(F, 0);
  for (int f : feature_of_table_) ++tables_per_feature[f];
  for (size_t k = 0; k < F; ++k) {
    const auto feature = static_cast<size_t>(sizing_.features[k]);
    DLREC_CHECK(feature < staged_.cat_indices.size(), "embedding store: the batch has ",
                staged_.cat_indices.size(), " categorical features; feature ", feature,
                " is stored");
  }
  // Per feature (independent slot maps): the remap, on several threads for large batches.
  std::vector<int64_t> h(F, 0), m(F, 0), ev(F, 0), staged(F, 0);
  auto remap = [&](size_t k) {
    const auto feature = static_cast<size_t>(sizing_.features[k]);
    int64_t rows = 0;
    for (size_t t = 0; t < feature_of_table_.size(); ++t)
      if (feature_of_table_[t] == static_cast<int>(k)) rows = store_.tables()[t].rows;
    const int64_t C = sizing_.cache_rows[k];
    SlotMap& map = maps_[k];
    std::vector<int64_t>& ids = staged_.cat_indices[feature];
    std::unordered_map<int64_t, int64_t> row_of;
    row_of.reserve(ids.size());
    for (int64_t& id : ids) {
      auto it = row_of.find(id);
      if (it != row_of.end()) {
        id = it->second;
        continue;
      }
      if (id < 0 || id >= rows)
        fail("embedding store: id ", id, " is beyond the tables of feature ", feature, " (", rows,
             " rows)");
      int64_t row = map.find(id, stamp_);
      if (row >= 0) {
        ++h[k];
      } else {
        ++m[k];
        if (sync) {
          int64_t evicted = -1;
          row = map.insert(id, stamp_, &evicted);
          if (evicted >= 0) ++ev[k];
          if (row >= 0) inserted[k].push_back(id);
        }
        if (row < 0) row = C + staged[k]++;
        fetch_ids[k].push_back(id);
        fetch_rows[k].push_back(row);
      }
      row_of.emplace(id, row);
      id = row;
    }
  };
  int64_t total_ids = 0;
  for (size_t k = 0; k < F; ++k)
    total_ids += static_cast<int64_t>(staged_.cat_indices[sizing_.features[k]].size());
  try {
    if (F > 1 && total_ids >= 4096)
      parallel_for(0, static_cast<int64_t>(F), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t k = lo; k < hi; ++k) remap(static_cast<size_t>(k));
      });
    else
      for (size_t k = 0; k < F; ++k) remap(k);
  } catch (...) {  // a bad id: the slots taken for this batch's rows were never written
    for (size_t k = 0; k < F; ++k)
      for (int64_t id : inserted[k]) maps_[k].erase(id);
    throw;
  }
  for (size_t k = 0; k < F; ++k) {
    need = std::max(need, staged[k]);
    hits += h[k];
    misses += m[k];
    evictions += ev[k];
    hits_weighted += h[k] * tables_per_feature[k];
    lookups_weighted += (h[k] + m[k]) * tables_per_feature[k];
  }
  if (need > staging_) {  // nothing fetched yet: undo the inserts (their rows were not written)
    for (size_t k = 0; k < F; ++k)
      for (int64_t id : inserted[k]) maps_[k].erase(id);
    stats.evictions += evictions;
    return need;
  }
  // The misses from the tiers below, into their device rows; kept for the async insert.
  InsertJob job{generation, {}, {}};
  const auto& tables = store_.tables();
  job.rows.resize(tables.size());
  auto fetch = [&](size_t t) {
    const size_t k = static_cast<size_t>(feature_of_table_[t]);
    const auto n = static_cast<int64_t>(fetch_ids[k].size());
    std::vector<float>& buf = job.rows[t];
    buf.resize(static_cast<size_t>(n * tables[t].dim));
    if (n > 0) store_.lookup(static_cast<int>(t), fetch_ids[k].data(), n, buf.data(), pinned.get());
  };
  try {
    if (tables.size() > 1 && misses >= 1024)  // the store is thread-safe
      parallel_for(0, static_cast<int64_t>(tables.size()), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) fetch(static_cast<size_t>(t));
      });
    else
      for (size_t t = 0; t < tables.size(); ++t) fetch(t);
    for (size_t t = 0; t < tables.size(); ++t) {
      const size_t k = static_cast<size_t>(feature_of_table_[t]);
      const auto n = static_cast<int64_t>(fetch_ids[k].size());
      if (n > 0) rows_->write(static_cast<int>(t), fetch_rows[k].data(), n, job.rows[t].data());
    }
  } catch (...) {  // a tier failed (Redis down...): the slots taken were not (all) written
    for (size_t k = 0; k < F; ++k)
      for (int64_t id : inserted[k]) maps_[k].erase(id);
    throw;
  }
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  stats.hits += hits_weighted;
  stats.misses += lookups_weighted - hits_weighted;
  stats.evictions += evictions;
  stats.lookups += 1;
  stats.lookup_ns += ns;
  int64_t cached_bytes = 0;
  for (size_t t = 0; t < tables.size(); ++t)
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
  forward(staged_);
  if (sync || misses == 0) return 0;
  job.ids = std::move(fetch_ids);
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
  }
}

void GpuCache::apply_insert(InsertJob& job) {
  std::lock_guard<std::mutex> l(mu_);
  int64_t n_ids = 0;
  for (const auto& v : job.ids) n_ids += static_cast<int64_t>(v.size());
  if (job.generation != generation_ || !rows_) {  // an update or a rebuild since the fetch
    async_dropped += n_ids;
    return;
  }
  ++stamp_;
  const auto& tables = store_.tables();
  std::vector<std::vector<int64_t>> slots(job.ids.size()), from(job.ids.size());
  int64_t evictions = 0;
  for (size_t k = 0; k < job.ids.size(); ++k)
    for (size_t j = 0; j < job.ids[k].size(); ++j) {
      const int64_t id = job.ids[k][j];
      if (maps_[k].contains(id)) continue;  // inserted by a batch since
      int64_t evicted = -1;
      const int64_t s = maps_[k].insert(id, stamp_, &evicted);
      if (evicted >= 0) ++evictions;
      if (s < 0) continue;
      slots[k].push_back(s);
      from[k].push_back(static_cast<int64_t>(j));
    }
  for (size_t t = 0; t < tables.size(); ++t) {
    const size_t k = static_cast<size_t>(feature_of_table_[t]);
    if (slots[k].empty()) continue;
    const int64_t dim = tables[t].dim;
    std::vector<float> rows(slots[k].size() * static_cast<size_t>(dim));
    for (size_t i = 0; i < from[k].size(); ++i)
      std::copy_n(job.rows[t].data() + from[k][i] * dim, dim, rows.data() + i * dim);
    rows_->write(static_cast<int>(t), slots[k].data(), static_cast<int64_t>(slots[k].size()),
                 rows.data());
  }
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
  std::unique_lock<std::mutex> q(queue_mu_);
  idle_cv_.wait(q, [&] { return queue_.empty() && !busy_; });
}

#ifndef DLREC_WITH_CUDA
std::unique_ptr<DeviceRows> make_cuda_rows(int, std::vector<float*>, std::vector<int64_t>,
                                           std::vector<int64_t>) {
  fail("the GPU cache tier needs a CUDA build (this dlrec was built without CUDA)");
}
void cuda_memory_info(int, int64_t*, int64_t*) {
  fail("the GPU cache tier needs a CUDA build (this dlrec was built without CUDA)");
}
#endif

}  // namespace dlrec::store
