// The host-memory tier: rows keyed by (table, id) in `shards` maps, each with its own lock,
// eviction order and byte bound (bytes / shards). An entry costs its row plus
// kHostEntryOverhead (176 bytes, measured: embedding_store.h); filling a full shard evicts first
// the entries that come first in its order:
//   lru  the least recently used (order: last use);
//   lfu  the least frequently used (order: uses since the row was filled, then last use: among
//        rows used as often, the least recent goes first).
// A row larger than a shard's bound is not kept (lookups of it always go on to the next tier).
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/store/embedding_store.h"

namespace dlrec::store {
namespace {

constexpr int kIdBits = 48;

class HostTier final : public Tier {
 public:
  HostTier(const std::vector<TableInfo>& tables, int64_t bytes, int64_t shards, bool lfu)
      : tables_(tables), bytes_(bytes), lfu_(lfu), shards_(static_cast<size_t>(shards)) {
    DLREC_CHECK(tables.size() < (size_t{1} << 15), "host tier: at most 32767 tables");
    for (const TableInfo& t : tables)
      DLREC_CHECK(t.rows <= (int64_t{1} << kIdBits), "host tier: table '", t.name, "' has ", t.rows,
                  " rows; at most 2^48");
    shard_bytes_ = bytes / shards;
  }
  std::string name() const override { return "host"; }
  bool complete() const override { return false; }
  int64_t memory_bound() const override { return bytes_; }

  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t key = key_of(table, ids[i]);
      Shard& s = shard_of(key);
      std::lock_guard<std::mutex> lock(s.mu);
      auto it = s.map.find(key);
      if (it == s.map.end()) continue;
      Entry& e = it->second;
      s.order.erase(order_key(e, key));
      e.uses += 1;
      e.last_use = ++s.clock;
      s.order.insert(order_key(e, key));
      std::copy(e.row.begin(), e.row.end(), out + i * dim);
      found[i] = 1;
    }
  }

  void fill(int table, const int64_t* ids, int64_t n, const float* rows) override {
    const int64_t dim = tables_[table].dim;
    const int64_t cost = dim * 4 + kHostEntryOverhead;
    if (cost > shard_bytes_) return;
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t key = key_of(table, ids[i]);
      Shard& s = shard_of(key);
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.map.count(key)) continue;
      while (s.used + cost > shard_bytes_ && !s.order.empty()) {
        erase(s, std::get<2>(*s.order.begin()));
        stats.evictions += 1;
      }
      Entry e{std::vector<float>(rows + i * dim, rows + (i + 1) * dim), 1, ++s.clock};
      s.order.insert(order_key(e, key));
      s.map.emplace(key, std::move(e));
      s.used += cost;
      stats.bytes += cost;
    }
  }

  void invalidate(int table, const int64_t* ids, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t key = key_of(table, ids[i]);
      Shard& s = shard_of(key);
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.map.count(key)) erase(s, key);
    }
  }

 private:
  struct Entry {
    std::vector<float> row;
    int64_t uses;       // lookups that found it, plus its fill
    uint64_t last_use;  // the shard's clock at its last use
  };
  // (uses under LFU, else 0; last use; key): the set's first element is evicted first.
  using OrderKey = std::tuple<int64_t, uint64_t, uint64_t>;
  struct Shard {
    std::mutex mu;
    std::set<OrderKey> order;
    std::unordered_map<uint64_t, Entry> map;
    int64_t used = 0;
    uint64_t clock = 0;
  };
  OrderKey order_key(const Entry& e, uint64_t key) const {
    return OrderKey(lfu_ ? e.uses : 0, e.last_use, key);
  }
  void erase(Shard& s, uint64_t key) {  // under s.mu
    auto it = s.map.find(key);
    const int64_t freed = static_cast<int64_t>(it->second.row.size()) * 4 + kHostEntryOverhead;
    s.order.erase(order_key(it->second, key));
    s.map.erase(it);
    s.used -= freed;
    stats.bytes -= freed;
  }
  static uint64_t key_of(int table, int64_t id) {
    return (static_cast<uint64_t>(table) << kIdBits) | static_cast<uint64_t>(id);
  }
  Shard& shard_of(uint64_t key) {
    // splitmix64's finaliser: neighbouring ids land in different shards.
    uint64_t z = key + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return shards_[z % shards_.size()];
  }

  std::vector<TableInfo> tables_;
  int64_t bytes_, shard_bytes_;
  bool lfu_;
  std::vector<Shard> shards_;
};

}  // namespace

std::unique_ptr<Tier> make_host_tier(const std::vector<TableInfo>& tables, int64_t bytes,
                                     int64_t shards, const std::string& eviction) {
  DLREC_CHECK(bytes > 0 && shards > 0, "host tier: bytes and shards must be positive");
  DLREC_CHECK(eviction == "lru" || eviction == "lfu", "host tier: eviction '", eviction,
              "': expected \"lru\" or \"lfu\"");
  return std::make_unique<HostTier>(tables, bytes, shards, eviction == "lfu");
}

}  // namespace dlrec::store
