// EmbeddingStore: lookups through the tiers in order, misses passed down, found rows filled up
// (include/dlrec/store/embedding_store.h). The store config section's reader.
#include "dlrec/store/embedding_store.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>

#include "dlrec/core/error.h"
#include "dlrec/store/updates.h"

namespace dlrec::store {

namespace {
std::string resolve(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

// "HOST:PORT" into host and port, else an error naming the key.
void parse_address(const std::string& address, const std::string& key, std::string& host,
                   int& port_out) {
  const size_t colon = address.rfind(':');
  int64_t port = -1;
  if (colon != std::string::npos && colon > 0 && colon + 1 < address.size() &&
      address.size() - colon <= 6 &&
      address.find_first_not_of("0123456789", colon + 1) == std::string::npos)
    port = std::stoll(address.substr(colon + 1));
  DLREC_CHECK(port >= 1 && port <= 65535, key, ": '", address,
              "' is not HOST:PORT (port 1..65535)");
  host = address.substr(0, colon);
  port_out = static_cast<int>(port);
}

// Runs fn, a request to `tier`. An error of a cache tier (one not complete(): Redis down) is
// counted, logged when the tier starts failing, kept in `why` and swallowed (false): the rows
// are asked of the tiers below. The complete tier's errors propagate.
template <class F>
bool ask(Tier& tier, F&& fn, std::string& why) {
  if (tier.complete()) {
    fn();
    return true;
  }
  try {
    fn();
  } catch (const Error& e) {
    tier.stats.failures += 1;
    if (tier.stats.failing.exchange(1) == 0)
      std::fprintf(stderr,
                   "dlrec store: %s (the %s tier is passed over: its rows are read from the tiers "
                   "below until it answers again)\n",
                   e.what(), tier.name().c_str());
    why = e.what();
    return false;
  }
  if (tier.stats.failing.exchange(0) == 1)
    std::fprintf(stderr, "dlrec store: the %s tier answers again\n", tier.name().c_str());
  return true;
}
}  // namespace

StoreConfig StoreConfig::from_json(const json& j, const std::string& base_dir,
                                   const std::string& where) {
  DLREC_CHECK(j.is_object(), where,
              ": expected an object with the tiers (\"host\", \"redis\", \"rocksdb\")");
  StoreConfig c;
  ConfigReader r(j, where);
  if (r.has("host")) {
    ConfigReader h = r.child("host");
    c.host = true;
    c.host_bytes = h.get_int_range("bytes", -1, 1, int64_t{1} << 50);
    DLREC_CHECK(c.host_bytes > 0, h.key_path("bytes"),
                ": required (the bound on the rows the host tier holds, in bytes)");
    c.host_shards = h.get_int_range("shards", 16, 1, 4096);
    c.host_eviction = h.get_choice("eviction", "lru", {"lru", "lfu"});
    h.finish();
  }
  if (r.has("redis")) {
    ConfigReader d = r.child("redis");
    c.redis = true;
    parse_address(d.get<std::string>("address", ""), d.key_path("address"), c.redis_host,
                  c.redis_port);
    c.redis_key_prefix = d.get<std::string>("key_prefix", c.redis_key_prefix);
    DLREC_CHECK(!c.redis_key_prefix.empty() && c.redis_key_prefix.size() <= 200,
                d.key_path("key_prefix"), ": 1 to 200 characters");
    // Braces would change which part of a key Redis Cluster hashes (the partition tag).
    DLREC_CHECK(c.redis_key_prefix.find_first_of("{}") == std::string::npos,
                d.key_path("key_prefix"), ": '{' and '}' are not allowed (", c.redis_key_prefix,
                ")");
    c.redis_partitions = d.get_int_range("partitions", c.redis_partitions, 1, 16384);
    c.redis_timeout_ms = d.get_int_range("timeout_ms", c.redis_timeout_ms, 1, 600000);
    c.redis_retry_ms = d.get_int_range("retry_ms", c.redis_retry_ms, 0, 600000);
    d.finish();
  }
  if (r.has("rocksdb")) {
    ConfigReader d = r.child("rocksdb");
    c.rocksdb = true;
    c.rocksdb_path = d.get<std::string>("path", "");
    DLREC_CHECK(!c.rocksdb_path.empty(), d.key_path("path"),
                ": required (the directory written by dlrec export --tiers rocksdb=DIR)");
    c.rocksdb_path = resolve(c.rocksdb_path, base_dir);
    c.rocksdb_block_cache_bytes =
        d.get_int_range("block_cache_bytes", c.rocksdb_block_cache_bytes, 0, int64_t{1} << 50);
    c.rocksdb_export_id = d.get<std::string>("export_id", "");
    c.rocksdb_reads = d.get_choice("reads", c.rocksdb_reads, {"pread", "mmap"});
    d.finish();
  }
  if (r.has("updates")) {
    ConfigReader u = r.child("updates");
    c.updates = true;
    if (u.has("address")) {
      parse_address(u.get<std::string>("address", ""), u.key_path("address"), c.updates_host,
                    c.updates_port);
    } else {
      DLREC_CHECK(c.redis, u.key_path("address"),
                  ": required (the Redis server with the stream) without a \"redis\" tier");
      c.updates_host = c.redis_host;
      c.updates_port = c.redis_port;
    }
    c.updates_stream = u.get<std::string>("stream", "");
    DLREC_CHECK(!c.updates_stream.empty() && c.updates_stream.size() <= 200, u.key_path("stream"),
                ": required, 1 to 200 characters (the stream dlrec push ", "writes)");
    c.updates_block_ms = u.get_int_range("block_ms", c.updates_block_ms, 1, 10000);
    c.updates_max_bytes = u.get_int_range("max_bytes", c.updates_max_bytes, 1, int64_t{1} << 50);
    u.finish();
  }
  if (r.has("gpu_cache")) {
    ConfigReader g = r.child("gpu_cache");
    c.gpu_cache = true;
    DLREC_CHECK(!(g.has("fraction") && g.has("bytes")), g.key_path("fraction"),
                ": give \"fraction\" or \"bytes\", not both");
    if (g.has("fraction")) {
      c.gpu_cache_fraction = g.get_range("fraction", 0, 0, 1);
      DLREC_CHECK(c.gpu_cache_fraction > 0, g.key_path("fraction"),
                  ": the cache must hold rows (a fraction in (0, 1]), got 0");
    }
    if (g.has("bytes")) {
      c.gpu_cache_bytes = g.get_int_range("bytes", 0, 0, int64_t{1} << 50);
      DLREC_CHECK(c.gpu_cache_bytes > 0, g.key_path("bytes"),
                  ": the cache must hold rows (bytes >= 1), got 0");
    }
    c.gpu_cache_eviction = g.get_choice("eviction", c.gpu_cache_eviction, {"lfu", "lru"});
    c.gpu_cache_insert_threshold =
        g.get_range("insert_threshold", c.gpu_cache_insert_threshold, 0, 1);
    c.gpu_cache_threads = static_cast<int>(g.get_int_range("threads", 0, 0, 1024));
    g.finish();
  }
  c.staging_rows = r.get_int_range("staging_rows", c.staging_rows, 1, int64_t{1} << 31);
  r.finish();
  DLREC_CHECK(c.host || c.redis || c.rocksdb, where,
              ": no tier configured (\"host\", \"redis\", \"rocksdb\"); a store needs a tier "
              "holding the full tables (\"rocksdb\")");
  DLREC_CHECK(c.rocksdb, where,
              ": \"rocksdb\" is required: it is the tier holding the full tables (\"host\" and "
              "\"redis\" are caches above it)");
  return c;
}

json StoreConfig::to_json() const {
  json j = json::object();
  if (host)
    j["host"] = {{"bytes", host_bytes}, {"shards", host_shards}, {"eviction", host_eviction}};
  if (redis)
    j["redis"] = {{"address", redis_host + ":" + std::to_string(redis_port)},
                  {"key_prefix", redis_key_prefix},
                  {"partitions", redis_partitions},
                  {"timeout_ms", redis_timeout_ms},
                  {"retry_ms", redis_retry_ms}};
  if (rocksdb)
    j["rocksdb"] = {{"path", rocksdb_path},
                    {"block_cache_bytes", rocksdb_block_cache_bytes},
                    {"reads", rocksdb_reads}};
  if (rocksdb && !rocksdb_export_id.empty()) j["rocksdb"]["export_id"] = rocksdb_export_id;
  if (updates)
    j["updates"] = {{"address", updates_host + ":" + std::to_string(updates_port)},
                    {"stream", updates_stream},
                    {"block_ms", updates_block_ms},
                    {"max_bytes", updates_max_bytes}};
  if (gpu_cache) {
    j["gpu_cache"] = {{"eviction", gpu_cache_eviction},
                      {"insert_threshold", gpu_cache_insert_threshold}};
    if (gpu_cache_fraction > 0) j["gpu_cache"]["fraction"] = gpu_cache_fraction;
    if (gpu_cache_bytes > 0) j["gpu_cache"]["bytes"] = gpu_cache_bytes;
    if (gpu_cache_threads > 0) j["gpu_cache"]["threads"] = gpu_cache_threads;
  }
  j["staging_rows"] = staging_rows;
  return j;
}

// The consumer's view of the GPU cache: a cache tier whose invalidate() calls the listener.
class EmbeddingStore::Listener final : public Tier {
 public:
  std::string name() const override { return "listener"; }
  void lookup(int, const int64_t*, int64_t, float*, uint8_t*) override {}
  bool complete() const override { return false; }
  int64_t memory_bound() const override { return 0; }
  void invalidate(int table, const int64_t* ids, int64_t n) override {
    std::lock_guard<std::mutex> l(mu);
    if (fn) fn(table, ids, n);
  }
  std::mutex mu;
  InvalidateFn fn;
};

void EmbeddingStore::on_invalidate(InvalidateFn fn) {
  if (!listener_) return;  // no updates: nothing is ever invalidated
  std::lock_guard<std::mutex> l(listener_->mu);
  listener_->fn = std::move(fn);
}

EmbeddingStore::EmbeddingStore(std::vector<TableInfo> tables,
                               std::vector<std::unique_ptr<Tier>> tiers)
    : tables_(std::move(tables)), tiers_(std::move(tiers)) {
  DLREC_CHECK(!tiers_.empty(), "embedding store: no tier");
  DLREC_CHECK(tiers_.back()->complete(), "embedding store: the last tier ('", tiers_.back()->name(),
              "') does not hold the full tables");
  updates_ = dynamic_cast<UpdateTier*>(tiers_.front().get());
}

EmbeddingStore::~EmbeddingStore() { consumer_.reset(); }

std::unique_ptr<EmbeddingStore> EmbeddingStore::open(const StoreConfig& config,
                                                     const std::vector<TableInfo>& tables) {
  std::vector<std::unique_ptr<Tier>> tiers;
  if (config.updates)
    tiers.push_back(std::make_unique<UpdateTier>(tables, config.updates_max_bytes));
  if (config.host)
    tiers.push_back(
        make_host_tier(tables, config.host_bytes, config.host_shards, config.host_eviction));
  if (config.redis) tiers.push_back(open_redis_tier(tables, config));
  if (config.rocksdb)
    tiers.push_back(open_rocksdb_tier(config.rocksdb_path, tables, config.rocksdb_block_cache_bytes,
                                      config.rocksdb_export_id, config.rocksdb_reads));
  auto store = std::make_unique<EmbeddingStore>(tables, std::move(tiers));
  if (config.updates) {
    StreamAddress at{config.updates_host, config.updates_port, config.updates_stream,
                     config.redis ? config.redis_timeout_ms : 1000};
    std::vector<Tier*> caches;
    for (size_t k = 1; k < store->tiers_.size(); ++k) caches.push_back(store->tiers_[k].get());
    store->listener_ = std::make_unique<Listener>();
    caches.push_back(store->listener_.get());
    store->consumer_ =
        std::make_unique<UpdateConsumer>(at, config.updates_block_ms, store->updates_, caches);
    // The versions already on the stream are applied before the first lookup (a restarted
    // server does not serve the exported rows for a moment).
    if (!store->consumer_->wait_caught_up(60000))
      std::fprintf(stderr,
                   "dlrec store updates: %s: not read to its end within 60 s; serving version "
                   "%llu while the rest is applied\n",
                   at.str().c_str(), static_cast<unsigned long long>(store->updates_->version()));
  }
  return store;
}

std::shared_ptr<const UpdateSnapshot> EmbeddingStore::pin() const {
  return updates_ ? updates_->pin() : nullptr;
}

void EmbeddingStore::lookup(int table, const int64_t* ids, int64_t n, float* out,
                            const UpdateSnapshot* pinned) {
  std::shared_ptr<const UpdateSnapshot> own;  // without a pinned snapshot: the current one
  if (updates_ && !pinned) {
    own = updates_->pin();
    pinned = own.get();
  }
  DLREC_CHECK(table >= 0 && table < static_cast<int>(tables_.size()), "embedding store: table ",
              table, " of ", tables_.size());
  const TableInfo& t = tables_[table];
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= t.rows)
      fail("embedding store: id ", ids[i], " is beyond table '", t.name, "' (", t.rows,
           " rows; feature ", t.feature, ")");
  const int64_t dim = t.dim;
  // pending[j]: the position in ids/out of the j-th row still missing.
  std::vector<int64_t> pending(static_cast<size_t>(n)), sub_ids;
  for (int64_t i = 0; i < n; ++i) pending[i] = i;
  std::vector<float> rows;
  std::vector<uint8_t> found;
  std::vector<bool> failed(tiers_.size(), false);  // tiers passed over in this lookup
  std::string why;                                 // the last such tier's error
  for (size_t k = 0; k < tiers_.size() && !pending.empty(); ++k) {
    Tier& tier = *tiers_[k];
    const int64_t m = static_cast<int64_t>(pending.size());
    // The first tier asks for every id, in order: its rows go straight to `out` (no zeroed
    // scratch rows and no copy, in the GPU cache's fetch of a batch's misses too); a
    // row it leaves is written by a tier below. Later tiers get the ids still missing.
    const bool direct = k == 0;
    if (!direct) {
      sub_ids.resize(m);
      for (int64_t j = 0; j < m; ++j) sub_ids[j] = ids[pending[j]];
      rows.resize(static_cast<size_t>(m * dim));
    }
    const int64_t* ask_ids = direct ? ids : sub_ids.data();
    float* ask_rows = direct ? out : rows.data();
    found.assign(static_cast<size_t>(m), 0);
    const auto t0 = std::chrono::steady_clock::now();
    if (k == 0 && updates_)
      updates_->lookup_at(*pinned, table, ask_ids, m, ask_rows, found.data());
    else if (!ask(
                 tier, [&] { tier.lookup(table, ask_ids, m, ask_rows, found.data()); },
                 why)) {
      failed[k] = true;
      found.assign(static_cast<size_t>(m), 0);  // a failed request's rows are asked below
    }
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    tier.stats.lookups += 1;
    tier.stats.lookup_ns += ns;
    // Rows found here go out and up (into the tiers above, compacted); the rest go on.
    std::vector<int64_t> still, hit_ids;
    std::vector<float> hit_rows;
    for (int64_t j = 0; j < m; ++j) {
      const float* row = ask_rows + j * dim;
      if (found[j]) {
        if (!direct) std::memcpy(out + pending[j] * dim, row, static_cast<size_t>(dim) * 4);
        if (k > 0) {
          hit_ids.push_back(sub_ids[j]);
          hit_rows.insert(hit_rows.end(), row, row + dim);
        }
      } else {
        still.push_back(pending[j]);
      }
    }
    tier.stats.hits += m - static_cast<int64_t>(still.size());
    tier.stats.misses += static_cast<int64_t>(still.size());
    for (size_t up = 0; up < k && !hit_ids.empty(); ++up)
      if (!failed[up])
        failed[up] = !ask(
            *tiers_[up],
            [&] {
              tiers_[up]->fill(table, hit_ids.data(), static_cast<int64_t>(hit_ids.size()),
                               hit_rows.data());
            },
            why);
    pending.swap(still);
  }
  if (!pending.empty())
    fail("embedding store: row ", ids[pending[0]], " of table '", t.name, "' is held by no tier (",
         pending.size(), " such rows; the last tier, '", tiers_.back()->name(),
         "', should hold every row: the store is incomplete)",
         why.empty() ? "" : "; a tier above was passed over: ", why);
}

std::string EmbeddingStore::stats_text() const {
  std::ostringstream s;
  for (const auto& t : tiers_) {
    const TierStats& st = t->stats;
    s << t->name() << ": hits " << st.hits << " misses " << st.misses << " evictions "
      << st.evictions << " bytes " << st.bytes << " lookups " << st.lookups << " lookup_ms "
      << static_cast<double>(st.lookup_ns) / 1e6;
    if (st.bad_values > 0) s << " bad_values " << st.bad_values;
    if (st.failures > 0) s << " failures " << st.failures;
    s << "\n";
  }
  return s.str();
}

}  // namespace dlrec::store
