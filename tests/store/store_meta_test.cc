// The RocksDB tier's meta record ("!dlrec-store") with fields of the wrong JSON type: each is an
// error naming the store's path, the record, the key and the type expected (not the JSON
// library's bare "type must be number, but is string"). The record is rewritten through RocksDB
// itself, so the test needs its headers (skips visibly without them or the tier).
#include <gtest/gtest.h>

#include <string>

#include "dlrec/store/embedding_store.h"
#include "test_errors.h"
#include "test_files.h"

#if __has_include(<rocksdb/db.h>)
#include <rocksdb/db.h>
#define DLREC_TEST_HAS_ROCKSDB 1
#endif

using namespace dlrec;
using dlrec::testing::expect_error;
using dlrec::testing::TempDir;

#ifdef DLREC_TEST_HAS_ROCKSDB
namespace {

const std::vector<store::TableInfo> kMetaTables = {{"emb.0.weight", 0, 8, 2}};

// Reads the store's meta record, lets `edit` change it, and writes it back.
template <class F>
void edit_meta(const std::string& path, F&& edit) {
  rocksdb::DB* raw = nullptr;
  rocksdb::Options options;
  ASSERT_TRUE(rocksdb::DB::Open(options, path, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string text;
  ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "!dlrec-store", &text).ok());
  json meta = json::parse(text);
  edit(meta);
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "!dlrec-store", meta.dump()).ok());
  ASSERT_TRUE(db->Close().ok());
}

}  // namespace
#endif

TEST(RocksDbMeta, AFieldOfTheWrongTypeIsAnErrorNamingTheStoreTheKeyAndTheType) {
#ifndef DLREC_TEST_HAS_ROCKSDB
  GTEST_SKIP() << "no RocksDB headers here: the meta record cannot be rewritten";
#else
  if (!store::rocksdb_available()) GTEST_SKIP() << "this build has no RocksDB tier";
  TempDir dir("store_meta");
  std::vector<float> values(16, 0.5f);
  struct Case {
    const char* key;
    json value;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"version", "1", "expected an integer"},
      {"format", 7, "expected a string"},
      {"checksum", 12345, "expected a string"},
      {"row_set_version", -3, "expected an integer >= 0"},
      {"row_set_version", "2", "expected an integer >= 0"},
      {"export_id", json::array({1}), "expected a string"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string path = dir.path + "/db" + std::to_string(n++);
    store::write_rocksdb_store(path, {{kMetaTables[0], values.data()}}, false);
    edit_meta(path, [&](json& meta) { meta[c.key] = c.value; });
    expect_error([&] { store::open_rocksdb_tier(path, kMetaTables, 0); },
                 {path + " (record !dlrec-store)", "key '" + std::string(c.key) + "'",
                  c.value.dump(), c.expected});
  }
  // The record itself no object.
  const std::string path = dir.path + "/db_tables";
  store::write_rocksdb_store(path, {{kMetaTables[0], values.data()}}, false);
  edit_meta(path, [](json& meta) { meta = json::array({1, 2}); });
  expect_error([&] { store::open_rocksdb_tier(path, kMetaTables, 0); },
               {path + " (record !dlrec-store)", "the record is array, expected an object"});
  // The store as written opens (the edits above are what fails).
  const std::string good = dir.path + "/good";
  store::write_rocksdb_store(good, {{kMetaTables[0], values.data()}}, false);
  edit_meta(good, [](json& meta) { meta["row_set_version"] = 4; });
  EXPECT_EQ(store::open_rocksdb_tier(good, kMetaTables, 0)->version(), 4u);
#endif
}
