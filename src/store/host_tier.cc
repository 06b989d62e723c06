// The host-memory tier: rows keyed by (table, id) in `shards` maps, each with its own lock, LRU
// list and byte bound (bytes / shards). An entry costs its row plus kHostEntryOverhead; filling a
// full shard evicts its least recently used rows first. A row larger than a shard's bound is
// not kept (lookups of it always go on to the next tier).
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/store/embedding_store.h"

namespace dlrec::store {
namespace {

constexpr int kIdBits = 48;

class HostTier final : public Tier {
 public:
  HostTier(const std::vector<TableInfo>& tables, int64_t bytes, int64_t shards)
      : tables_(tables), bytes_(bytes), shards_(static_cast<size_t>(shards)) {
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
      s.lru.splice(s.lru.begin(), s.lru, it->second);  // most recently used first
      std::copy(it->second->row.begin(), it->second->row.end(), out + i * dim);
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
      while (s.used + cost > shard_bytes_ && !s.lru.empty()) {
        const Entry& victim = s.lru.back();
        const int64_t freed = static_cast<int64_t>(victim.row.size()) * 4 + kHostEntryOverhead;
        s.map.erase(victim.key);
        s.lru.pop_back();
        s.used -= freed;
        stats.bytes -= freed;
        stats.evictions += 1;
      }
      s.lru.push_front(Entry{key, std::vector<float>(rows + i * dim, rows + (i + 1) * dim)});
      s.map[key] = s.lru.begin();
      s.used += cost;
      stats.bytes += cost;
    }
  }

 private:
  struct Entry {
    uint64_t key;
    std::vector<float> row;
  };
  struct Shard {
    std::mutex mu;
    std::list<Entry> lru;
    std::unordered_map<uint64_t, std::list<Entry>::iterator> map;
    int64_t used = 0;
  };
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
  std::vector<Shard> shards_;
};

}  // namespace

std::unique_ptr<Tier> make_host_tier(const std::vector<TableInfo>& tables, int64_t bytes,
                                     int64_t shards) {
  DLREC_CHECK(bytes > 0 && shards > 0, "host tier: bytes and shards must be positive");
  return std::make_unique<HostTier>(tables, bytes, shards);
}

}  // namespace dlrec::store
