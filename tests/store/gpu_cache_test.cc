// The GPU cache tier's host logic, on the CPU (include/dlrec/store/gpu_cache.h): the slot map's
// LRU and LFU eviction against a brute-force reference, the batch remap with sync and async
// inserts against a host array standing in for the device tables (every row the remapped batch
// reads holds the row of its original id), staging growth, invalidation by online updates, the
// sizing and the config's bad inputs. The device side is tested against the all-in-GPU model in
// predictor_store_test.cc (GpuCache*, skipped without a GPU).
#include "dlrec/store/gpu_cache.h"

#include "dlrec/core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "store/store_helpers.h"
#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::ArrayTier;
using dlrec::testing::expect_error;
using dlrec::testing::value_of;

namespace {

// The reference: per slot its id, use count and last use; victims by a full scan.
struct RefCache {
  bool lfu;
  std::vector<int64_t> id, count, last, stamp;
  int64_t tick = 0;
  RefCache(int64_t c, bool l) : lfu(l), id(c, -1), count(c, 0), last(c, 0), stamp(c, 0) {}
  int64_t find(int64_t x, uint64_t s) {
    for (size_t i = 0; i < id.size(); ++i)
      if (id[i] == x) {
        if (lfu) ++count[i];
        last[i] = ++tick;
        stamp[i] = static_cast<int64_t>(s);
        return static_cast<int64_t>(i);
      }
    return -1;
  }
  // The evicted id (-1: a free slot was used); -2 when every slot is stamped.
  int64_t insert(int64_t x, uint64_t s) {
    int64_t best = -1;
    for (size_t i = 0; i < id.size(); ++i) {
      if (id[i] < 0) {
        best = static_cast<int64_t>(i);
        break;
      }
      if (stamp[i] == static_cast<int64_t>(s)) continue;
      auto key = [&](size_t j) { return std::make_pair(lfu ? count[j] : 0, last[j]); };
      if (best < 0 || key(i) < key(static_cast<size_t>(best))) best = static_cast<int64_t>(i);
    }
    if (best < 0) return -2;
    const int64_t evicted = id[best];
    id[best] = x;
    count[best] = 1;
    last[best] = ++tick;
    stamp[best] = static_cast<int64_t>(s);
    return evicted;
  }
};

void check_against_reference(bool lfu) {
  const int64_t C = 16;
  store::SlotMap map(C, lfu);
  RefCache ref(C, lfu);
  std::mt19937_64 rng(lfu ? 7 : 8);
  uint64_t stamp = 1;
  int64_t evictions = 0;
  for (int op = 0; op < 20000; ++op) {
    if (rng() % 8 == 0) ++stamp;  // a new batch: earlier stamps no longer protect
    // Power-law-ish ids: small ids much more often.
    const auto x =
        static_cast<int64_t>(std::pow(static_cast<double>(rng() % 10000) / 10000, 3) * 60);
    const int64_t s = map.find(x, stamp);
    const int64_t rs = ref.find(x, stamp);
    ASSERT_EQ(s >= 0, rs >= 0) << "op " << op;
    if (s >= 0) continue;
    int64_t evicted = -1;
    const int64_t slot = map.insert(x, stamp, &evicted);
    const int64_t r = ref.insert(x, stamp);
    if (r == -2) {
      ASSERT_EQ(slot, -1) << "op " << op;
      continue;
    }
    ASSERT_GE(slot, 0) << "op " << op;
    ASSERT_EQ(evicted, r) << "op " << op << (lfu ? " lfu" : " lru");
    if (evicted >= 0) ++evictions;
    ASSERT_EQ(map.id_at(slot), x);
  }
  EXPECT_GT(evictions, 1000);
}

std::vector<store::TableInfo> tables3() {
  // Two tables on feature 0 (Wide&Deep-like), one on feature 2.
  return {{"emb.0.weight", 0, 500, 4}, {"wide.0.weight", 0, 500, 1}, {"emb.2.weight", 2, 80, 3}};
}

// Host arrays standing in for the device tables.
class HostRows final : public store::DeviceRows {
 public:
  HostRows(const std::vector<store::TableInfo>& t, std::vector<int64_t> rows)
      : tables_(t), rows_(std::move(rows)) {
    for (size_t i = 0; i < t.size(); ++i) data.emplace_back(rows_[i] * t[i].dim, -1.f);
  }
  void write(int table, const int64_t* rows, int64_t n, const float* src) override {
    const int64_t dim = tables_[table].dim;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_GE(rows[i], 0);
      ASSERT_LT(rows[i], rows_[table]);
      std::copy_n(src + i * dim, dim, data[table].data() + rows[i] * dim);
    }
    writes += n;
  }
  std::vector<store::TableInfo> tables_;
  std::vector<int64_t> rows_;
  std::vector<std::vector<float>> data;
  int64_t writes = 0;
};

store::StoreConfig cache_config(double threshold, const std::string& eviction) {
  store::StoreConfig c;
  c.rocksdb = true;
  c.gpu_cache = true;
  c.gpu_cache_fraction = 0.1;
  c.gpu_cache_eviction = eviction;
  c.gpu_cache_insert_threshold = threshold;
  c.staging_rows = 64;
  return c;
}

struct Rig {
  std::vector<store::TableInfo> tables = tables3();
  std::unique_ptr<store::EmbeddingStore> store;
  std::unique_ptr<store::GpuCache> cache;
  HostRows* rows = nullptr;
  Rig(double threshold, const std::string& eviction, int64_t staging = 64, int threads = 0) {
    std::vector<std::unique_ptr<store::Tier>> tiers;
    tiers.push_back(std::make_unique<ArrayTier>(tables));
    store = std::make_unique<store::EmbeddingStore>(tables, std::move(tiers));
    store::StoreConfig c = cache_config(threshold, eviction);
    c.gpu_cache_threads = threads;
    cache = std::make_unique<store::GpuCache>(*store, c, store::size_gpu_cache(c, tables, -1, -1));
    bind(staging);
  }
  void bind(int64_t staging) {
    std::vector<int64_t> r;
    for (const auto& t : tables)
      r.push_back(cache->sizing().cache_rows[t.feature == 0 ? 0 : 1] + staging);
    auto h = std::make_unique<HostRows>(tables, r);
    rows = h.get();
    cache->bind(std::move(h), staging);
  }
  // A batch of `n` rows with power-law ids on features 0 and 2 (feature 1 not stored).
  io::Batch batch(std::mt19937_64& rng, int64_t n) {
    io::Batch b;
    b.rows = n;
    b.cat_indices.resize(3);
    b.cat_offsets.resize(3);
    const int64_t card[3] = {500, 7, 80};
    for (int f = 0; f < 3; ++f)
      for (int64_t r = 0; r < n; ++r) {
        const double u = static_cast<double>(rng() % 1000000) / 1e6;
        b.cat_indices[f].push_back(static_cast<int64_t>(std::pow(u, 4) * card[f]));
      }
    for (int f = 0; f < 3; ++f)
      for (int64_t r = 0; r <= n; ++r) b.cat_offsets[f].push_back(r);
    return b;
  }
  // Runs b; in the forward, every remapped id's row equals its original id's row.
  int64_t run_checked(const io::Batch& b) {
    int64_t checked = 0;
    const int64_t need = cache->run(b, [&](const io::Batch& m) {
      EXPECT_EQ(m.cat_indices[1], b.cat_indices[1]);  // not stored: untouched
      for (size_t t = 0; t < tables.size(); ++t) {
        const size_t f = static_cast<size_t>(tables[t].feature);
        const int64_t dim = tables[t].dim;
        for (size_t i = 0; i < b.cat_indices[f].size(); ++i) {
          const int64_t row = m.cat_indices[f][i];
          for (int64_t k = 0; k < dim; ++k)
            ASSERT_EQ(rows->data[t][row * dim + k],
                      value_of(static_cast<int>(t), b.cat_indices[f][i], k))
                << "table " << t << " id " << b.cat_indices[f][i] << " row " << row;
          ++checked;
        }
      }
    });
    if (need == 0) EXPECT_GT(checked, 0);
    return need;
  }
};

}  // namespace

TEST(GpuCacheSlots, LruEvictsTheLeastRecentlyUsed) {
  store::SlotMap m(3, false);
  int64_t ev = 0;
  for (int64_t id : {10, 20, 30}) EXPECT_GE(m.insert(id, 1, &ev), 0);
  EXPECT_EQ(ev, -1);
  EXPECT_GE(m.find(10, 2), 0);
  EXPECT_GE(m.insert(40, 2, &ev), 0);
  EXPECT_EQ(ev, 20);
  EXPECT_FALSE(m.contains(20));
  EXPECT_TRUE(m.erase(30));
  EXPECT_FALSE(m.erase(30));
  EXPECT_GE(m.insert(50, 2, &ev), 0);
  EXPECT_EQ(ev, -1);  // the erased slot was free
  // Every slot used by batch 2: nothing can be evicted for it.
  EXPECT_EQ(m.insert(60, 2, &ev), -1);
  EXPECT_EQ(m.size(), 3);
}

TEST(GpuCacheSlots, LfuKeepsHotRowsAcrossColdOnes) {
  store::SlotMap m(3, true);
  int64_t ev = 0;
  for (int64_t id : {1, 2, 3}) m.insert(id, 1, &ev);
  for (int i = 0; i < 5; ++i) m.find(1, 2);
  m.find(3, 2);
  for (int64_t cold = 100; cold < 120; ++cold) {
    ASSERT_GE(m.insert(cold, 3 + cold, &ev), 0);
    EXPECT_NE(ev, 1);
    EXPECT_NE(ev, 3);
  }
  EXPECT_TRUE(m.contains(1));
  EXPECT_TRUE(m.contains(3));
}

// A batch's hits stamped before its inserts and relinked after them (GpuCache: the relinks run
// beside the forward) leave LFU's lists as touching them first did: the same ids are evicted
// afterwards, in the same order; so do hits not stamped but marked in a bitmap passed to the
// inserts (GpuCache's remap marks them). Batches of hot ids and cold inserts over a small map.
TEST(GpuCacheSlots, LfuRelinksAfterTheInsertsGiveTheSameEvictions) {
  store::SlotMap touched(64, true), relinked(64, true), marked(64, true);
  std::mt19937_64 rng(11);
  int64_t ev_a = 0, ev_b = 0, ev_c = 0;
  int64_t protected_evictions = 0;
  for (uint64_t batch = 1; batch <= 300; ++batch) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 24; ++i) {
      const double u = static_cast<double>(rng() % 1000000) / 1e6;
      ids.push_back(static_cast<int64_t>(std::pow(u, 3) * 400));
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<int32_t> hits;
    std::vector<int64_t> misses;
    for (int64_t id : ids) {
      const int32_t s = relinked.slot_of(id);
      ASSERT_EQ(s, touched.slot_of(id)) << "batch " << batch << " id " << id;
      if (s >= 0)
        hits.push_back(s);
      else
        misses.push_back(id);
    }
    for (int32_t s : hits) touched.touch(s, batch);
    for (int32_t s : hits) relinked.stamp(s, batch);
    uint64_t bits[1] = {0};  // 64 slots
    for (int32_t s : hits) bits[0] |= uint64_t{1} << s;
    for (int64_t id : misses) {
      const int64_t slot = touched.insert(id, batch, &ev_a);
      ASSERT_EQ(slot, relinked.insert(id, batch, &ev_b));
      ASSERT_EQ(slot, marked.insert(id, batch, &ev_c, bits));
      ASSERT_EQ(ev_a, ev_b) << "batch " << batch;
      ASSERT_EQ(ev_a, ev_c) << "batch " << batch;
      if (slot >= 0 && ev_a >= 0) ++protected_evictions;
    }
    for (int32_t s : hits) relinked.relink(s);
    for (int32_t s : hits) marked.relink(s);
  }
  EXPECT_GT(protected_evictions, 100);  // the map was full: inserts chose among unmarked slots
  for (int64_t id = 1000; id < 1100; ++id) {  // the eviction order of everything left
    const int64_t slot = touched.insert(id, 1000, &ev_a);
    ASSERT_EQ(slot, relinked.insert(id, 1000, &ev_b));
    ASSERT_EQ(slot, marked.insert(id, 1000, &ev_c));
    ASSERT_EQ(ev_a, ev_b);
    ASSERT_EQ(ev_a, ev_c);
  }
}

TEST(GpuCacheSlots, LruMatchesAReferenceOverRandomOperations) { check_against_reference(false); }
TEST(GpuCacheSlots, LfuMatchesAReferenceOverRandomOperations) { check_against_reference(true); }

// threshold 1: sync inserts (the hit rate stays below 1); 0: async from the first batch; 0.15
// (the rate here is about 0.2 when warm):
// sync while cold, async once warm. Each batch's forward sees the right rows.
TEST(GpuCache, RemappedBatchesReadTheRightRowsSyncAndAsync) {
  for (const char* ev : {"lfu", "lru"})
    for (double threshold : {1.0, 0.0, 0.15}) {
      SCOPED_TRACE(std::string(ev) + " threshold " + std::to_string(threshold));
      Rig rig(threshold, ev);
      std::mt19937_64 rng(3);
      for (int i = 0; i < 60; ++i) {
        ASSERT_EQ(rig.run_checked(rig.batch(rng, 1 + static_cast<int64_t>(rng() % 40))), 0);
        if (i % 7 == 0) rig.cache->drain();
      }
      rig.cache->drain();
      const store::TierStats& s = rig.cache->stats;
      EXPECT_GT(s.hits.load(), 0);
      EXPECT_GT(s.misses.load(), 0);
      EXPECT_GT(s.evictions.load(), 0);  // 50 + 8 slots for 500 + 80 ids
      EXPECT_GT(s.bytes.load(), 0);
      EXPECT_EQ(s.lookups.load(), 60);
      if (threshold == 1.0) EXPECT_EQ(rig.cache->async_batches.load(), 0);
      if (threshold == 0.0) {
        EXPECT_EQ(rig.cache->sync_batches.load(), 0);
        EXPECT_GT(rig.cache->async_inserted.load(), 0);
      }
      if (threshold == 0.15) {
        EXPECT_GT(rig.cache->sync_batches.load(), 0);
        EXPECT_GT(rig.cache->async_batches.load(), 0);
      }
      EXPECT_GT(rig.cache->recent_hit_rate(), 0.0);
    }
}

// Batches of 4096 ids or more run on the team: the lookups in pieces of 512 ids, the remap per
// feature beside the copy of the rest of the batch. The rows read are the right ones, sync and
// async, and a bad id in a late piece is a clear error that leaves the cache serving.
TEST(GpuCache, LargeBatchesInPiecesReadTheRightRows) {
  for (double threshold : {1.0, 0.0}) {
    SCOPED_TRACE("threshold " + std::to_string(threshold));
    Rig rig(threshold, "lfu", 1024);
    std::mt19937_64 rng(5);
    for (int i = 0; i < 6; ++i) {
      io::Batch b = rig.batch(rng, 2500 + 37 * i);  // 5000+ ids over two stored features
      b.dense.assign(static_cast<size_t>(b.rows) * 3, 0.5f * static_cast<float>(i));
      b.num_dense = 3;
      b.labels.assign(static_cast<size_t>(b.rows), 1.f);
      int64_t dense_seen = 0;
      ASSERT_EQ(rig.run_checked(b), 0);
      ASSERT_EQ(rig.cache->run(b,
                               [&](const io::Batch& m) {
                                 EXPECT_EQ(m.dense, b.dense);
                                 EXPECT_EQ(m.labels, b.labels);
                                 EXPECT_EQ(m.cat_offsets, b.cat_offsets);
                                 dense_seen = static_cast<int64_t>(m.dense.size());
                               }),
                0);
      EXPECT_EQ(dense_seen, b.rows * 3);
    }
    rig.cache->drain();  // (the async inserts of a busy loop may wait until here)
    ASSERT_EQ(rig.run_checked(rig.batch(rng, 2500)), 0);
    EXPECT_GT(rig.cache->stats.hits.load(), 0);
    EXPECT_GT(rig.cache->stats.evictions.load(), 0);
    io::Batch bad = rig.batch(rng, 2500);
    bad.cat_indices[2][2400] = 80;  // in the last piece of feature 2
    expect_error([&] { rig.cache->run(bad, [](const io::Batch&) {}); },
                 {"id 80", "feature 2", "80 rows"});
    ASSERT_EQ(rig.run_checked(rig.batch(rng, 2500)), 0);
  }
}

// gpu_cache.threads: the team of a batch's host work (the caller among them). By default one
// per table and stored feature (3 + 2 here), at most the process's threads less one above 4;
// given, as given. Large batches read the right rows with any team.
TEST(GpuCache, TheThreadsOptionSizesTheTeam) {
  const int before = num_threads();
  for (const auto& [process, given, want] :
       std::vector<std::tuple<int, int, int>>{{16, 0, 5}, {5, 0, 4}, {3, 0, 3}, {16, 2, 2},
                                              {2, 7, 7}}) {
    SCOPED_TRACE(std::to_string(process) + " threads, gpu_cache.threads " +
                 std::to_string(given));
    set_num_threads(process);
    Rig rig(1.0, "lfu", 1024, given);
    EXPECT_EQ(rig.cache->threads(), want);
    std::mt19937_64 rng(9);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(rig.run_checked(rig.batch(rng, 2500)), 0);
  }
  set_num_threads(before);
}

// A large batch (on the team) in which a stored feature has no ids: its remap still runs (its
// lists emptied, nothing fetched for it), the other feature's ids read the right rows, and the
// hits are counted once per distinct id (the remap lists distinct slots through a bitmap that
// it clears for the next batch).
TEST(GpuCache, ALargeBatchWithAnEmptyStoredFeatureReadsTheRightRows) {
  Rig rig(1.0, "lfu", 1024);
  std::mt19937_64 rng(11);
  ASSERT_EQ(rig.run_checked(rig.batch(rng, 2500)), 0);  // feature 2's ids cached, some of them
  io::Batch b = rig.batch(rng, 2500);
  for (int64_t r = 0; r < b.rows; ++r) b.cat_indices[0][static_cast<size_t>(r)] = 7 + r % 2;
  b.cat_indices[0].resize(5000, 7);  // 5000 ids of feature 0 (two distinct), none of feature 2
  for (int64_t r = 0; r <= b.rows; ++r) b.cat_offsets[0][static_cast<size_t>(r)] = 2 * r;
  b.cat_indices[2].clear();
  b.cat_offsets[2].assign(static_cast<size_t>(b.rows) + 1, 0);
  ASSERT_EQ(rig.run_checked(b), 0);  // 7 and 8 cached by now (synchronous inserts)
  const int64_t hits0 = rig.cache->stats.hits.load(), misses0 = rig.cache->stats.misses.load();
  const int64_t id_hits0 = rig.cache->id_hits.load();
  ASSERT_EQ(rig.run_checked(b), 0);
  EXPECT_EQ(rig.cache->stats.hits.load() - hits0, 2 * 2);  // 2 distinct ids x 2 tables
  EXPECT_EQ(rig.cache->stats.misses.load() - misses0, 0);
  EXPECT_EQ(rig.cache->id_hits.load() - id_hits0, 5000 * 2);
  ASSERT_EQ(rig.run_checked(rig.batch(rng, 2500)), 0);  // both features again
}

// keep_phases: the last batch's record (the bench's diagnosis of slow batches) adds up and
// names what ran: the team's jobs for large batches, the misses, sync or async.
TEST(GpuCache, KeptPhasesDescribeTheLastBatch) {
  Rig rig(1.0, "lfu", 1024);
  std::mt19937_64 rng(9);
  EXPECT_EQ(rig.cache->last_phases().total_ns, 0);  // off by default: nothing recorded
  ASSERT_EQ(rig.run_checked(rig.batch(rng, 2500)), 0);
  EXPECT_EQ(rig.cache->last_phases().total_ns, 0);
  rig.cache->keep_phases(true);
  int64_t forward_ns = 0;
  ASSERT_EQ(rig.cache->run(rig.batch(rng, 2500),
                           [&](const io::Batch&) {
                             const auto t = std::chrono::steady_clock::now();
                             while (std::chrono::steady_clock::now() - t <
                                    std::chrono::microseconds(200)) {
                             }
                             forward_ns = 200000;
                           }),
            0);
  const auto& p = rig.cache->last_phases();
  EXPECT_TRUE(p.sync);
  EXPECT_GE(p.forward_ns, forward_ns);
  EXPECT_GE(p.total_ns, p.wait_ns + p.lookup_ns + p.remap_ns + p.settle_ns + p.fetch_ns +
                            p.write_ns + p.forward_ns);
  EXPECT_GT(p.misses, 0);  // ids not seen in the first batch
  for (const auto& t : p.team) {
    EXPECT_GE(t.workers, 1);
    EXPECT_GT(t.max_task_ns, 0);
    EXPECT_LE(t.last_work_end_ns, t.last_end_ns);
    EXPECT_LE(t.last_end_ns, t.wall_ns);
    EXPECT_GE(t.preempted, 0);
  }
  EXPECT_FALSE(p.inserter_busy);
  EXPECT_EQ(p.inserts, 0);
  rig.cache->keep_phases(false);
}

TEST(GpuCache, ABatchNeedingMoreStagingRowsAsksForThemAndRunsAfterABind) {
  Rig rig(0.0, "lfu", 4);  // async: every distinct miss takes a staging row
  std::mt19937_64 rng(5);
  const io::Batch b = rig.batch(rng, 200);
  const int64_t need = rig.run_checked(b);
  ASSERT_GT(need, 4);
  EXPECT_EQ(rig.cache->stats.lookups.load(), 0);  // nothing ran
  rig.bind(need);
  EXPECT_EQ(rig.run_checked(b), 0);
}

TEST(GpuCache, AnInvalidatedRowIsFetchedAgain) {
  Rig rig(1.0, "lru");
  std::mt19937_64 rng(6);
  io::Batch b = rig.batch(rng, 1);
  b.cat_indices[0] = {7};
  b.cat_indices[2] = {5};
  ASSERT_EQ(rig.run_checked(b), 0);
  ASSERT_EQ(rig.run_checked(b), 0);
  EXPECT_EQ(rig.cache->stats.misses.load(), 3);  // 2 tables of feature 0 + 1 of feature 2
  EXPECT_EQ(rig.cache->stats.hits.load(), 3);
  const int64_t writes = rig.rows->writes;
  const int64_t id = 7;
  rig.cache->invalidate(1, &id, 1);  // wide.0: feature 0, both its tables
  ASSERT_EQ(rig.run_checked(b), 0);
  EXPECT_EQ(rig.cache->stats.misses.load(), 5);
  // Fetched again for its 2 tables, each row written to its staging row and its new slot.
  EXPECT_EQ(rig.rows->writes, writes + 2 * 2);
}

// An update applied while a batch runs (its invalidation waits for the batch) leaves the row
// uncached whether the batch's asynchronous insert runs before the invalidation (then erased)
// or after it (then dropped: it holds the rows fetched before the update).
TEST(GpuCache, ARowUpdatedDuringABatchIsNotCachedByItsAsyncInsert) {
  for (int round = 0; round < 20; ++round) {
    Rig rig(0.0, "lfu");
    std::mt19937_64 rng(6 + round);
    io::Batch b = rig.batch(rng, 30);
    const int64_t id = b.cat_indices[0][0];
    std::thread t;
    ASSERT_EQ(rig.cache->run(b,
                             [&](const io::Batch&) {
                               t = std::thread([&] { rig.cache->invalidate(0, &id, 1); });
                             }),
              0);
    t.join();
    rig.cache->drain();
    EXPECT_EQ(rig.cache->async_inserted.load() > 0, rig.cache->async_dropped.load() == 0);
    io::Batch one = b;
    one.rows = 1;
    for (auto& v : one.cat_indices) v.resize(1);
    for (auto& o : one.cat_offsets) o.resize(2);
    const int64_t misses = rig.cache->stats.misses.load();
    ASSERT_EQ(rig.run_checked(one), 0);
    // Feature 0 (two tables) adds 0 or 2 misses, feature 2 (one table) 0 or 1.
    EXPECT_GE(rig.cache->stats.misses.load(), misses + 2) << "the updated row was still cached";
  }
}

// A tier failing in the middle of a batch (Redis down, say) fails the batch; the slots its
// misses took are given back, so no later batch reads a row that was never written.
TEST(GpuCache, ATierFailingMidBatchLeavesNoUnwrittenSlot) {
  for (int64_t batch_rows : {int64_t{30}, int64_t{3000}}) {  // serial and threaded remaps
    Rig rig(1.0, "lfu", 4096);
    auto* tier = dynamic_cast<ArrayTier*>(rig.store->tiers()[0].get());
    std::mt19937_64 rng(9);
    io::Batch b = rig.batch(rng, batch_rows);
    tier->missing_id = b.cat_indices[2][0];
    expect_error([&] { rig.cache->run(b, [](const io::Batch&) {}); }, {"held by no tier"});
    tier->missing_id = -1;
    ASSERT_EQ(rig.run_checked(b), 0);  // every row it reads was written
    ASSERT_EQ(rig.run_checked(b), 0);
  }
}

TEST(GpuCache, AnIdBeyondTheTableIsAClearError) {
  Rig rig(1.0, "lru");
  std::mt19937_64 rng(1);
  io::Batch b = rig.batch(rng, 2);
  b.cat_indices[2][1] = 80;
  expect_error([&] { rig.cache->run(b, [](const io::Batch&) {}); },
               {"id 80", "feature 2", "80 rows"});
}

TEST(GpuCacheSizing, FractionBytesAndTheDefault) {
  const auto tables = tables3();  // feature 0: 500 rows x (4 + 1) floats; feature 2: 80 x 3
  store::StoreConfig c;
  c.staging_rows = 10;
  c.gpu_cache_fraction = 0.1;
  auto z = store::size_gpu_cache(c, tables, -1, -1);
  EXPECT_EQ(z.cache_rows, (std::vector<int64_t>{50, 8}));
  EXPECT_EQ(z.cache_bytes, 50 * 20 + 8 * 12);
  c.gpu_cache_fraction = 0;
  c.gpu_cache_bytes = (500 * 20 + 80 * 12) / 2;
  z = store::size_gpu_cache(c, tables, -1, -1);
  EXPECT_EQ(z.cache_rows, (std::vector<int64_t>{250, 40}));
  c.gpu_cache_bytes = 0;  // default: half of the free memory, at most the whole tables
  z = store::size_gpu_cache(c, tables, 1 << 30, 1 << 30);
  EXPECT_EQ(z.cache_rows, (std::vector<int64_t>{500, 80}));
  z = store::size_gpu_cache(c, tables, 500 * 20 + 80 * 12, 1 << 30);  // half of it
  EXPECT_EQ(z.cache_rows[0], 250);
  EXPECT_NE(z.how.find("default"), std::string::npos);
  c.gpu_cache_fraction = 1e-9;  // at least one row per feature
  z = store::size_gpu_cache(c, tables, -1, -1);
  EXPECT_EQ(z.cache_rows, (std::vector<int64_t>{1, 1}));
}

TEST(GpuCacheSizing, ACacheLargerThanTheDeviceOrItsFreeMemoryIsRefused) {
  const auto tables = tables3();
  store::StoreConfig c;
  c.staging_rows = 10;
  c.gpu_cache_bytes = 10000;
  expect_error([&] { store::size_gpu_cache(c, tables, 100000, 5000); },
               {"gpu_cache.bytes 10000", "larger than the device", "5000 bytes"});
  c.gpu_cache_bytes = 0;
  c.gpu_cache_fraction = 1;  // 10960 bytes of tables
  expect_error([&] { store::size_gpu_cache(c, tables, 100000, 5000); },
               {"gpu_cache", "larger than the device", "5000 bytes"});
  c.gpu_cache_fraction = 0;
  c.gpu_cache_bytes = 10000;
  expect_error([&] { store::size_gpu_cache(c, tables, 5000, 100000); },
               {"gpu_cache", "do not fit", "5000 bytes free"});
}

TEST(GpuCacheConfig, ParsesAndRefusesBadInputs) {
  auto parse = [](const std::string& gpu) {
    return store::StoreConfig::from_json(
        json::parse(R"({"rocksdb": {"path": "d"}, "gpu_cache": )" + gpu + "}"), "/b", "store");
  };
  store::StoreConfig c = parse(R"({"fraction": 0.15, "eviction": "lru", "insert_threshold": 0.5})");
  EXPECT_TRUE(c.gpu_cache);
  EXPECT_EQ(c.gpu_cache_fraction, 0.15);
  EXPECT_EQ(c.gpu_cache_eviction, "lru");
  EXPECT_EQ(c.gpu_cache_insert_threshold, 0.5);
  EXPECT_EQ(c.gpu_cache_threads, 0);
  c = parse(R"({"fraction": 0.15, "threads": 12})");
  EXPECT_EQ(c.gpu_cache_threads, 12);
  EXPECT_EQ(store::StoreConfig::from_json(c.to_json(), "/b", "again").to_json(), c.to_json());
  c = parse(R"({"bytes": 1048576})");
  EXPECT_EQ(c.gpu_cache_bytes, 1048576);
  EXPECT_EQ(c.gpu_cache_eviction, "lfu");
  EXPECT_EQ(c.gpu_cache_insert_threshold, 0.9);
  expect_error([&] { parse(R"({"fraction": 0})"); }, {"store.gpu_cache.fraction", "0"});
  expect_error([&] { parse(R"({"bytes": 0})"); }, {"store.gpu_cache.bytes", "0"});
  expect_error([&] { parse(R"({"fraction": 1.5})"); }, {"gpu_cache.fraction"});
  expect_error([&] { parse(R"({"fraction": 0.1, "bytes": 10})"); }, {"not both"});
  expect_error([&] { parse(R"({"eviction": "fifo"})"); }, {"gpu_cache.eviction", "fifo"});
  expect_error([&] { parse(R"({"insert_threshold": 1.5})"); }, {"gpu_cache.insert_threshold"});
  expect_error([&] { parse(R"({"insert_threshold": -0.1})"); }, {"gpu_cache.insert_threshold"});
  expect_error([&] { parse(R"({"size": 3})"); }, {"size"});
  expect_error([&] { parse(R"({"threads": -1})"); }, {"gpu_cache.threads"});
  expect_error([&] { parse(R"({"threads": 2000})"); }, {"gpu_cache.threads"});
  expect_error([&] { parse(R"({"threads": 1.5})"); }, {"gpu_cache.threads"});
}
