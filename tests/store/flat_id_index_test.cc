// The GPU cache's flat id index (include/dlrec/store/flat_id_index.h) against std::map over
// random inserts, erases (backward shift: every remaining id stays reachable), emplaces, growth
// and resets; and the GPU cache's count of hits per id looked up (repeats in a batch included).
#include "dlrec/store/flat_id_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "dlrec/store/gpu_cache.h"
#include "store/store_helpers.h"

using namespace dlrec;

namespace {

// Random inserts, erases, emplaces and finds against std::map; ids below `id_bound`, mostly from
// a small range (many collisions and re-inserts), some spread over all of it.
template <class Key>
void check_against_a_map(uint64_t id_bound) {
  for (int64_t capacity : {int64_t{0}, int64_t{5}, int64_t{300}}) {
    store::FlatIdIndexT<Key> idx(capacity);
    std::map<int64_t, int32_t> ref;
    std::mt19937_64 rng(static_cast<uint64_t>(capacity) + 1);
    for (int op = 0; op < 200000; ++op) {
      const int64_t id = rng() % 16 == 0 ? static_cast<int64_t>(rng() % id_bound)
                                         : static_cast<int64_t>(rng() % 700);
      const auto r = rng() % 10;
      if (r < 4) {
        const auto v = static_cast<int32_t>(rng() % 1000);
        idx.insert(id, v);
        ref[id] = v;
      } else if (r < 7) {
        ASSERT_EQ(idx.erase(id), ref.erase(id) > 0) << "op " << op;
      } else if (r < 8) {
        bool added = false;
        int32_t* v = idx.emplace(id, &added);
        ASSERT_EQ(added, ref.count(id) == 0) << "op " << op;
        if (added) *v = 7;
        ASSERT_EQ(*v, ref.emplace(id, 7).first->second);
      } else {
        const auto it = ref.find(id);
        ASSERT_EQ(idx.find(id), it == ref.end() ? store::FlatIdIndex::kAbsent : it->second)
            << "op " << op;
      }
      ASSERT_EQ(idx.size(), static_cast<int64_t>(ref.size()));
      ASSERT_LE(idx.size(), idx.capacity());
    }
    for (const auto& [id, v] : ref) ASSERT_EQ(idx.find(id), v);
    idx.reset(10);
    EXPECT_EQ(idx.size(), 0);
    EXPECT_GE(idx.capacity(), 10);
    for (const auto& [id, v] : ref) ASSERT_EQ(idx.find(id), store::FlatIdIndex::kAbsent);
  }
}

}  // namespace

TEST(FlatIdIndex, MatchesAMapOverRandomOperations) {
  check_against_a_map<uint64_t>(uint64_t{1} << 62);
  check_against_a_map<uint32_t>(store::FlatIdIndexT<uint32_t>::kMaxId + 1);
}

// The slot map picks 32-bit keys for tables of fewer than 2^32 - 1 rows, else 64-bit ones;
// both hold ids across their range.
TEST(FlatIdIndex, SlotMapsHoldIdsOfEitherWidth) {
  for (int64_t limit : {int64_t{4294967295}, int64_t{1} << 40}) {
    store::SlotMap m(4, true, limit);
    int64_t ev = 0;
    for (int64_t id : {int64_t{0}, limit - 1, limit / 2}) ASSERT_GE(m.insert(id, 1, &ev), 0);
    EXPECT_TRUE(m.contains(limit - 1));
    EXPECT_TRUE(m.contains(0));
    EXPECT_FALSE(m.contains(1));
    EXPECT_TRUE(m.erase(limit - 1));
    EXPECT_FALSE(m.contains(limit - 1));
    EXPECT_TRUE(m.contains(limit / 2));
  }
}

// A batch whose ids repeat: the distinct-id counts (stats) count each id once per table, the
// per-id counts every occurrence; a repeat of a missed id is a miss, of a cached id a hit.
TEST(GpuCache, HitsAreCountedPerDistinctIdAndPerIdLookedUp) {
  std::vector<store::TableInfo> tables = {{"emb.0.weight", 0, 500, 4},
                                          {"wide.0.weight", 0, 500, 1}};
  std::vector<std::unique_ptr<store::Tier>> tiers;
  tiers.push_back(std::make_unique<dlrec::testing::ArrayTier>(tables));
  store::EmbeddingStore es(tables, std::move(tiers));
  store::StoreConfig c;
  c.rocksdb = true;
  c.gpu_cache = true;
  c.gpu_cache_fraction = 0.1;
  c.gpu_cache_insert_threshold = 1.0;  // sync inserts
  c.staging_rows = 8;
  store::GpuCache cache(es, c, store::size_gpu_cache(c, tables, -1, -1));
  struct NoRows final : store::DeviceRows {
    void write(int, const int64_t*, int64_t, const float*) override {}
  };
  cache.bind(std::make_unique<NoRows>(), 8);
  io::Batch b;
  b.rows = 4;
  b.cat_indices = {{7, 7, 9, 7}};
  b.cat_offsets = {{0, 1, 2, 3, 4}};
  std::vector<int64_t> seen;
  ASSERT_EQ(cache.run(b, [&](const io::Batch& m) { seen = m.cat_indices[0]; }), 0);
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[0], seen[3]);
  EXPECT_NE(seen[0], seen[2]);
  EXPECT_EQ(cache.stats.misses.load(), 2 * 2);  // 2 distinct ids x 2 tables
  EXPECT_EQ(cache.id_lookups.load(), 4 * 2);
  EXPECT_EQ(cache.id_hits.load(), 0);
  b.cat_indices = {{7, 8, 7, 7}};
  ASSERT_EQ(cache.run(b, [](const io::Batch&) {}), 0);
  EXPECT_EQ(cache.stats.hits.load(), 1 * 2);
  EXPECT_EQ(cache.stats.misses.load(), 3 * 2);
  EXPECT_EQ(cache.id_lookups.load(), 8 * 2);
  EXPECT_EQ(cache.id_hits.load(), 3 * 2);
}
