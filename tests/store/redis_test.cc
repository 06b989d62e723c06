// The Redis tier against a real redis-server, started on a free loopback port and stopped at the
// end (skips visibly without the binary or hiredis): misses filled from RocksDB, rows then read
// from Redis by another store (another server), predictions bit for bit through host + redis +
// rocksdb, an outage (rows read from RocksDB) and the recovery without reopening the store.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "dlrec/store/embedding_store.h"
#include "store/redis_server.h"
#include "store/store_helpers.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::expect_error;
using dlrec::testing::find_redis_server;
using dlrec::testing::RedisServer;
using dlrec::testing::TempDir;
using dlrec::testing::value_of;
namespace fs = std::filesystem;

namespace {

const std::vector<store::TableInfo> kTables = {{"emb.0.weight", 0, 200, 4},
                                               {"emb.1.weight", 1, 50, 3}};

void write_store(const std::string& path) {
  std::vector<std::vector<float>> v(kTables.size());
  std::vector<store::TableRows> rows;
  for (size_t t = 0; t < kTables.size(); ++t) {
    for (int64_t id = 0; id < kTables[t].rows; ++id)
      for (int64_t k = 0; k < kTables[t].dim; ++k)
        v[t].push_back(value_of(static_cast<int>(t), id, k));
    rows.push_back({kTables[t], v[t].data()});
  }
  store::write_rocksdb_store(path, rows, false);
}

void expect_rows(store::EmbeddingStore& s, int table, const std::vector<int64_t>& ids) {
  const int64_t dim = kTables[table].dim;
  std::vector<float> out(ids.size() * dim);
  s.lookup(table, ids.data(), static_cast<int64_t>(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t k = 0; k < dim; ++k)
      ASSERT_EQ(out[i * dim + k], value_of(table, ids[i], k)) << "id " << ids[i];
}

}  // namespace

TEST(RedisTier, SharesRowsBetweenStoresAndRecoversAfterAnOutage) {
  if (!store::redis_available()) GTEST_SKIP() << "this build has no Redis tier (libhiredis-dev)";
  if (!store::rocksdb_available()) GTEST_SKIP() << "this build has no RocksDB tier";
  const std::string binary = find_redis_server();
  if (binary.empty()) GTEST_SKIP() << "no redis-server binary (Debian's redis-server package)";
  TempDir dir("redis");
  write_store(dir.path + "/db");
  auto server = RedisServer::start(binary, dir.path);
  ASSERT_TRUE(server) << "redis-server did not start (20 ports tried)";
  const int port = server->port();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  const json cfg = json::parse(R"({"host": {"bytes": 2000, "shards": 1},
      "redis": {"address": ")" +
                               addr + R"(", "key_prefix": "t", "partitions": 4, "retry_ms": 0},
      "rocksdb": {"path": "db"}})");
  const auto c = store::StoreConfig::from_json(cfg, dir.path, "test");
  auto a = store::EmbeddingStore::open(c, kTables);
  ASSERT_EQ(a->tiers().size(), 3u);
  ASSERT_EQ(a->tiers()[1]->name(), "redis");
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 60; ++id) ids.push_back((id * 7) % 200);
  expect_rows(*a, 0, ids);  // rocksdb -> redis and host
  EXPECT_EQ(a->tiers()[2]->stats.hits, 60);
  EXPECT_EQ(a->tiers()[1]->stats.misses, 60);
  // Another server's store finds them in Redis.
  auto b = store::EmbeddingStore::open(c, kTables);
  expect_rows(*b, 0, ids);
  EXPECT_EQ(b->tiers()[1]->stats.hits, 60);
  EXPECT_EQ(b->tiers()[2]->stats.hits, 0);
  expect_rows(*b, 1, {0, 49, 7});  // another table: the same ids are other keys
  EXPECT_EQ(b->tiers()[2]->stats.hits, 3);

  // Redis down: rows the host tier holds are served, the others come from RocksDB (the failure
  // counted; redis_faults_test.cc checks the rest).
  expect_rows(*b, 1, {49});  // cached in the host tier
  server->stop();
  expect_rows(*b, 1, {49});
  expect_rows(*b, 0, {1});  // not among the ids above (multiples of 7, mod 200)
  EXPECT_EQ(b->tiers()[1]->stats.failures, 1);
  // A Redis down at load does not fail the load (RocksDB holds every row): the tier starts
  // failing, says so naming the address, and its rows come from below.
  {
    ::testing::internal::CaptureStderr();
    auto down = store::EmbeddingStore::open(c, kTables);
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("redis tier " + addr + ": cannot connect"), std::string::npos) << log;
    EXPECT_NE(log.find("at load"), std::string::npos) << log;
    EXPECT_EQ(down->tiers()[1]->stats.failing, 1);
    expect_rows(*down, 0, {5});
    EXPECT_EQ(down->tiers()[2]->stats.hits, 1);
  }
  // Back up (empty: volatile) on the same port: the store recovers without being reopened.
  server = std::make_unique<RedisServer>(binary, port, dir.path);
  ASSERT_TRUE(server->up());
  expect_rows(*b, 0, {2, 3});
  auto fresh = store::EmbeddingStore::open(c, kTables);
  expect_rows(*fresh, 0, {2});  // b filled the new Redis
  EXPECT_EQ(fresh->tiers()[1]->stats.hits, 1);
  EXPECT_EQ(fresh->tiers()[2]->stats.hits, 0);
}

TEST(RedisTier, RefusesBadAddresses) {
  for (const char* bad : {"localhost", ":6379", "h:0", "h:70000", "h:12x"}) {
    const json cfg = {{"redis", {{"address", bad}}}, {"rocksdb", {{"path", "db"}}}};
    expect_error([&] { store::StoreConfig::from_json(cfg, "/m", "embedding_store"); },
                 {"embedding_store.redis.address", "HOST:PORT"});
  }
}
