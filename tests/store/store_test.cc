// The tiered embedding store on its own: the host tier's LRU bound and counters, lookups through
// the tiers (misses passed down, rows filled up), the RocksDB tier's round trip and its refusals
// (another model's store, a missing, incomplete or corrupt directory, ids beyond a table), and
// the store config's validation.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "dlrec/store/embedding_store.h"
#include "store/store_helpers.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::ArrayTier;
using dlrec::testing::expect_error;
using dlrec::testing::TempDir;
using dlrec::testing::value_of;
namespace fs = std::filesystem;

namespace {

std::vector<store::TableInfo> two_tables() {
  return {{"emb.0.weight", 0, 100, 4}, {"emb.2.weight", 2, 30, 2}};
}

std::vector<std::vector<float>> table_values(const std::vector<store::TableInfo>& tables) {
  std::vector<std::vector<float>> v;
  for (size_t t = 0; t < tables.size(); ++t) {
    v.emplace_back();
    for (int64_t id = 0; id < tables[t].rows; ++id)
      for (int64_t k = 0; k < tables[t].dim; ++k)
        v.back().push_back(value_of(static_cast<int>(t), id, k));
  }
  return v;
}

void write_store(const std::string& path, const std::vector<store::TableInfo>& tables) {
  const auto values = table_values(tables);
  std::vector<store::TableRows> rows;
  for (size_t t = 0; t < tables.size(); ++t) rows.push_back({tables[t], values[t].data()});
  store::write_rocksdb_store(path, rows, false);
}

void expect_rows(store::EmbeddingStore& s, int table, const std::vector<int64_t>& ids) {
  const int64_t dim = s.tables()[table].dim;
  std::vector<float> out(ids.size() * dim, -1.f);
  s.lookup(table, ids.data(), static_cast<int64_t>(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t k = 0; k < dim; ++k)
      ASSERT_EQ(out[i * dim + k], value_of(table, ids[i], k)) << "id " << ids[i] << " k " << k;
}

#define REQUIRE_ROCKSDB()          \
  if (!store::rocksdb_available()) \
  GTEST_SKIP() << "this build has no RocksDB tier (librocksdb-dev not found at configure)"

}  // namespace

TEST(HostTier, MissesGoDownAndFillUpWithinItsBound) {
  const auto tables = two_tables();
  std::vector<std::unique_ptr<store::Tier>> tiers;
  // One shard of room for 3 rows of table 0 (16 bytes + overhead each).
  tiers.push_back(store::make_host_tier(tables, 3 * (16 + store::kHostEntryOverhead), 1));
  tiers.push_back(std::make_unique<ArrayTier>(tables));
  store::EmbeddingStore s(tables, std::move(tiers));
  store::Tier& host = *s.tiers()[0];
  store::Tier& below = *s.tiers()[1];
  expect_rows(s, 0, {5, 6, 7});
  EXPECT_EQ(host.stats.misses, 3);
  EXPECT_EQ(below.stats.hits, 3);
  EXPECT_EQ(host.stats.bytes, 3 * (16 + store::kHostEntryOverhead));
  expect_rows(s, 0, {7, 5});  // both cached; 6 is now the least recently used
  EXPECT_EQ(host.stats.hits, 2);
  EXPECT_EQ(below.stats.hits, 3);
  expect_rows(s, 0, {8});  // evicts 6
  EXPECT_EQ(host.stats.evictions, 1);
  EXPECT_EQ(host.stats.bytes, 3 * (16 + store::kHostEntryOverhead));
  expect_rows(s, 0, {5, 7, 8, 6});  // 6 missed (and refetched), the others hit
  EXPECT_EQ(host.stats.hits, 5);
  EXPECT_EQ(below.stats.hits, 5);
  // The same id in another table is another row.
  expect_rows(s, 1, {5});
  EXPECT_EQ(below.stats.hits, 6);
  EXPECT_GE(host.stats.lookups, 5);
  EXPECT_NE(s.stats_text().find("host: hits 5 misses 6 evictions"), std::string::npos)
      << s.stats_text();
}

TEST(HostTier, ManyShardsKeepTheBoundAndTheValues) {
  const auto tables = two_tables();
  std::vector<std::unique_ptr<store::Tier>> tiers;
  const int64_t bound = 20 * (16 + store::kHostEntryOverhead);
  tiers.push_back(store::make_host_tier(tables, bound, 4));
  tiers.push_back(std::make_unique<ArrayTier>(tables));
  store::EmbeddingStore s(tables, std::move(tiers));
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t id = 0; id < 100; ++id) ids.push_back((id * 37 + r) % 100);
  expect_rows(s, 0, ids);
  EXPECT_LE(s.tiers()[0]->stats.bytes, bound);
  EXPECT_GT(s.tiers()[0]->stats.evictions, 0);
}

// A first tier that writes into every row of the output, holds the even ids only, and throws
// (after writing) when `fail` is set: not a complete tier, so its failure is passed over.
class ScribblingTier final : public store::Tier {
 public:
  explicit ScribblingTier(std::vector<store::TableInfo> t) : tables_(std::move(t)) {}
  std::string name() const override { return "scribbling"; }
  bool complete() const override { return false; }
  int64_t memory_bound() const override { return 0; }
  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < dim; ++k)
        out[i * dim + k] = ids[i] % 2 == 0 ? value_of(table, ids[i], k) : 1e9f;
      if (ids[i] % 2 == 0 && !fail) found[i] = 1;
    }
    if (fail) dlrec::fail("scribbling tier: down");
  }
  bool fail = false;

 private:
  std::vector<store::TableInfo> tables_;
};

// The first tier writes its rows straight into the caller's output: a row it does not hold (or
// all of them, when it fails) is written by the tier below, whatever the first left there.
TEST(EmbeddingStore, RowsTheFirstTierLeavesComeFromTheTierBelow) {
  const auto tables = two_tables();
  std::vector<std::unique_ptr<store::Tier>> tiers;
  auto first = std::make_unique<ScribblingTier>(tables);
  ScribblingTier* scribbling = first.get();
  tiers.push_back(std::move(first));
  tiers.push_back(std::make_unique<ArrayTier>(tables));
  store::EmbeddingStore s(tables, std::move(tiers));
  const std::vector<int64_t> ids = {4, 7, 0, 99, 12, 7, 31, 2};
  expect_rows(s, 0, ids);
  expect_rows(s, 1, {1, 2, 3, 29});
  EXPECT_EQ(s.tiers()[0]->stats.hits.load(), 5);  // the even ids
  scribbling->fail = true;
  expect_rows(s, 0, ids);
  EXPECT_EQ(s.tiers()[0]->stats.failures.load(), 1);
}

TEST(EmbeddingStore, RefusesIdsBeyondATableAndRowsNoTierHolds) {
  const auto tables = two_tables();
  std::vector<std::unique_ptr<store::Tier>> tiers;
  auto array = std::make_unique<ArrayTier>(tables);
  array->missing_id = 9;
  tiers.push_back(std::move(array));
  store::EmbeddingStore s(tables, std::move(tiers));
  std::vector<float> out(8);
  const int64_t beyond[] = {3, 30};
  expect_error([&] { s.lookup(1, beyond, 2, out.data()); },
               {"id 30 is beyond table 'emb.2.weight'", "30 rows", "feature 2"});
  const int64_t negative[] = {-1};
  expect_error([&] { s.lookup(1, negative, 1, out.data()); }, {"id -1 is beyond"});
  const int64_t missing[] = {9};
  expect_error([&] { s.lookup(0, missing, 1, out.data()); },
               {"row 9 of table 'emb.0.weight' is held by no tier", "incomplete"});
}

TEST(RocksDbTier, RoundTripsTheTablesAndCachesInTheHostTier) {
  REQUIRE_ROCKSDB();
  TempDir dir("store_rt");
  const auto tables = two_tables();
  write_store(dir.path + "/db", tables);
  store::StoreConfig c = store::StoreConfig::from_json(
      json::parse(R"({"host": {"bytes": 4096, "shards": 2}, "rocksdb": {"path": "db"}})"), dir.path,
      "test");
  EXPECT_EQ(c.rocksdb_path, dir.path + "/db");
  auto s = store::EmbeddingStore::open(c, tables);
  ASSERT_EQ(s->tiers().size(), 2u);
  EXPECT_EQ(s->tiers()[1]->name(), "rocksdb");
  EXPECT_GT(s->tiers()[1]->disk_bytes(), 0);
  EXPECT_EQ(s->tiers()[1]->version(), 1u);
  std::vector<int64_t> all;
  for (int64_t id = 99; id >= 0; --id) all.push_back(id);
  expect_rows(*s, 0, all);
  expect_rows(*s, 1, {29, 0, 14});
  expect_rows(*s, 1, {29, 0, 14});
  EXPECT_EQ(s->tiers()[1]->stats.hits, 103);
  EXPECT_EQ(s->tiers()[0]->stats.hits, 3);
  // An existing directory is not replaced.
  expect_error([&] { write_store(dir.path + "/db", tables); }, {"already exists", "--overwrite"});
}

TEST(RocksDbTier, MmapReadsGiveTheSameRowsAsPreads) {
  REQUIRE_ROCKSDB();
  TempDir dir("store_mmap");
  const auto tables = two_tables();
  write_store(dir.path + "/db", tables);
  for (const char* reads : {"pread", "mmap"}) {
    SCOPED_TRACE(reads);
    store::StoreConfig c = store::StoreConfig::from_json(
        json::parse(std::string(R"({"rocksdb": {"path": "db", "block_cache_bytes": 0, "reads": ")") +
                    reads + R"("}})"),
        dir.path, "test");
    EXPECT_EQ(c.rocksdb_reads, reads);
    EXPECT_EQ(c.to_json()["rocksdb"]["reads"], reads);
    auto s = store::EmbeddingStore::open(c, tables);
    std::vector<int64_t> all;
    for (int64_t id = 99; id >= 0; --id) all.push_back(id);
    expect_rows(*s, 0, all);  // (each row checked against the array it was written from)
    expect_rows(*s, 1, {29, 0, 14, 29});
    EXPECT_EQ(s->tiers()[0]->stats.hits, 104);
  }
}

TEST(RocksDbTier, RefusesAStoreOfAnotherModel) {
  REQUIRE_ROCKSDB();
  TempDir dir("store_other");
  const auto tables = two_tables();
  write_store(dir.path + "/db", tables);
  auto open_with = [&](std::vector<store::TableInfo> want) {
    store::open_rocksdb_tier(dir.path + "/db", want, 1 << 20);
  };
  expect_error([&] { open_with({tables[0]}); },
               {"written for another model", "holds 2 tables, the model has 1"});
  auto rows = tables;
  rows[1].rows = 31;
  expect_error([&] { open_with(rows); },
               {"written for another model", "'emb.2.weight'", "has 30 rows in the store, 31"});
  auto dims = tables;
  dims[0].dim = 8;
  expect_error([&] { open_with(dims); }, {"has dim 4 in the store, 8 in the model"});
  auto names = tables;
  names[1].name = "emb.1.weight";
  names[1].feature = 1;
  expect_error([&] { open_with(names); }, {"is 'emb.2.weight' (feature 2) in the store"});
}

TEST(RocksDbTier, RefusesMissingIncompleteAndCorruptDirectories) {
  REQUIRE_ROCKSDB();
  TempDir dir("store_bad");
  const auto tables = two_tables();
  expect_error([&] { store::open_rocksdb_tier(dir.path + "/nowhere", tables, 0); },
               {"no store at", "/nowhere", "dlrec export --tiers rocksdb=DIR"});
  // An empty directory is no RocksDB database.
  dlrec::make_dirs(dir.path + "/empty");
  expect_error([&] { store::open_rocksdb_tier(dir.path + "/empty", tables, 0); },
               {"cannot open the store at", "/empty"});
  // The manifest names a file that is no longer what it was: every table file overwritten.
  write_store(dir.path + "/db", tables);
  int corrupted = 0;
  for (const auto& e : fs::directory_iterator(dir.path + "/db")) {
    if (e.path().extension() != ".sst") continue;
    const auto size = fs::file_size(e.path());
    std::ofstream(e.path(), std::ios::binary | std::ios::in | std::ios::out)
        << std::string(static_cast<size_t>(size), 'x');
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  for (const char* reads : {"pread", "mmap"}) {
    const std::string e = dlrec::testing::error_of([&] {
      auto t = store::open_rocksdb_tier(dir.path + "/db", tables, 0, "", reads);
      std::vector<float> out(4);
      uint8_t found = 0;
      const int64_t id = 1;
      t->lookup(0, &id, 1, out.data(), &found);
    });
    EXPECT_NE(e.find("rocksdb tier"), std::string::npos) << reads << ": " << e;
    EXPECT_NE(e.find("Corruption"), std::string::npos) << reads << ": " << e;
  }
}

TEST(StoreConfig, RefusesBadSections) {
  auto parse = [](const char* text) {
    store::StoreConfig::from_json(json::parse(text), "/m", "config.json: embedding_store");
  };
  expect_error([&] { parse(R"({})"); }, {"no tier configured"});
  expect_error([&] { parse(R"({"host": {"bytes": 100}})"); }, {"\"rocksdb\" is required"});
  expect_error([&] { parse(R"({"host": {}, "rocksdb": {"path": "x"}})"); },
               {"embedding_store.host.bytes", "required"});
  expect_error(
      [&] { parse(R"({"host": {"bytes": 1, "eviction": "fifo"}, "rocksdb": {"path": "x"}})"); },
      {"eviction", "fifo"});
  expect_error([&] { parse(R"({"rocksdb": {"path": "x", "cache": 1}})"); }, {"cache"});
  expect_error([&] { parse(R"({"rocksdb": {}})"); }, {"rocksdb.path", "required"});
  expect_error([&] { parse(R"({"rocksdb": {"path": "x", "reads": "direct"}})"); },
               {"embedding_store.rocksdb.reads", "direct"});
  expect_error([&] { parse(R"({"rocksdb": {"path": "x"}, "staging_rows": 0})"); },
               {"staging_rows"});
  expect_error(
      [&] { parse(R"({"redis": {"address": "h:1", "retry_ms": -1}, "rocksdb": {"path": "x"}})"); },
      {"embedding_store.redis.retry_ms"});
  expect_error(
      [&] {
        parse(R"({"redis": {"address": "h:1", "retry_ms": "soon"}, "rocksdb": {"path": "x"}})");
      },
      {"embedding_store.redis.retry_ms"});
  const auto c =
      store::StoreConfig::from_json(json::parse(R"({"rocksdb": {"path": "db"}})"), "/m", "x");
  EXPECT_EQ(c.rocksdb_path, "/m/db");
  EXPECT_FALSE(c.host);
}
