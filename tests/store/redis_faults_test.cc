// The Redis tier when things go wrong, against a real redis-server (skips visibly without the
// binary, hiredis or RocksDB): values of the wrong size for their table (read as misses,
// counted, logged once per table, overwritten by the row from RocksDB), and a Redis stopped in
// the middle of the test (lookups fall through to RocksDB, failures counted, and an error only
// for rows no remaining tier holds).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

#include "dlrec/store/embedding_store.h"
#include "store/redis_server.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::expect_error;
using dlrec::testing::redis_command;
using dlrec::testing::RedisServer;
using dlrec::testing::TempDir;

namespace {

const std::vector<store::TableInfo> kFaultTables = {{"emb.0.weight", 0, 40, 4},
                                                    {"emb.1.weight", 1, 10, 2}};

float row_value(int table, int64_t id, int64_t k) {
  return static_cast<float>(table * 100 + id) + static_cast<float>(k) / 4;
}

// A RocksDB store of kFaultTables at `path`.
void write_fault_store(const std::string& path) {
  std::vector<std::vector<float>> values(kFaultTables.size());
  std::vector<store::TableRows> rows;
  for (size_t t = 0; t < kFaultTables.size(); ++t) {
    for (int64_t id = 0; id < kFaultTables[t].rows; ++id)
      for (int64_t k = 0; k < kFaultTables[t].dim; ++k)
        values[t].push_back(row_value(static_cast<int>(t), id, k));
    rows.push_back({kFaultTables[t], values[t].data()});
  }
  store::write_rocksdb_store(path, rows, false);
}

// Looks ids up in `s` and checks every row against row_value.
void check_rows(store::EmbeddingStore& s, int table, const std::vector<int64_t>& ids) {
  const int64_t dim = kFaultTables[table].dim;
  std::vector<float> out(ids.size() * dim, -1.f);
  s.lookup(table, ids.data(), static_cast<int64_t>(ids.size()), out.data());
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t k = 0; k < dim; ++k)
      ASSERT_EQ(out[i * dim + k], row_value(table, ids[i], k)) << "id " << ids[i] << " k " << k;
}

// The complete tier `inner` with one row hidden: a store that is incomplete for that row.
class HiddenRowTier final : public store::Tier {
 public:
  HiddenRowTier(std::unique_ptr<store::Tier> inner, int64_t hidden)
      : inner_(std::move(inner)), hidden_(hidden) {}
  std::string name() const override { return "hidden-" + inner_->name(); }
  bool complete() const override { return true; }
  int64_t memory_bound() const override { return inner_->memory_bound(); }
  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    inner_->lookup(table, ids, n, out, found);
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] == hidden_) found[i] = 0;
  }

 private:
  std::unique_ptr<store::Tier> inner_;
  int64_t hidden_;
};

// A temporary directory with the RocksDB store and a redis-server of its own.
struct RedisFixture {
  TempDir dir{"redis_faults"};
  std::unique_ptr<RedisServer> server;
  std::string address;
  // The store config: `host` adds a host tier; one partition, so that keys are
  // "f{0}:<table>:<id>".
  store::StoreConfig config(bool host) const {
    json j = {
        {"redis", {{"address", address}, {"key_prefix", "f"}, {"partitions", 1}, {"retry_ms", 0}}},
        {"rocksdb", {{"path", "db"}}}};
    if (host) j["host"] = {{"bytes", 4096}, {"shards", 1}};
    return store::StoreConfig::from_json(j, dir.path, "test");
  }
};

#define REDIS_FIXTURE(f)                                                                   \
  if (!store::redis_available()) GTEST_SKIP() << "this build has no Redis tier (hiredis)"; \
  if (!store::rocksdb_available()) GTEST_SKIP() << "this build has no RocksDB tier";       \
  if (dlrec::testing::find_redis_server().empty())                                         \
    GTEST_SKIP() << "no redis-server binary (Debian's redis-server package)";              \
  RedisFixture f;                                                                          \
  write_fault_store(f.dir.path + "/db");                                                   \
  f.server = RedisServer::start(dlrec::testing::find_redis_server(), f.dir.path);          \
  ASSERT_TRUE(f.server) << "redis-server did not start (20 ports tried)";                  \
  f.address = "127.0.0.1:" + std::to_string(f.server->port())

std::string row_bytes(int table, int64_t id) {
  std::string b(static_cast<size_t>(kFaultTables[table].dim) * 4, '\0');
  for (int64_t k = 0; k < kFaultTables[table].dim; ++k) {
    const float v = row_value(table, id, k);
    std::memcpy(&b[static_cast<size_t>(k) * 4], &v, 4);
  }
  return b;
}

}  // namespace

TEST(RedisFaults, AValueOfTheWrongSizeIsAMissThatTheRowBelowOverwrites) {
  REDIS_FIXTURE(f);
  const int port = f.server->port();
  // Values that are no row of their table: too short, too long (table 0: rows of 16 bytes), and
  // one in table 1 (rows of 8 bytes).
  ASSERT_EQ(redis_command(port, {"SET", "f{0}:0:5", "abc"}), "OK");
  ASSERT_EQ(redis_command(port, {"SET", "f{0}:0:6", std::string(20, 'x')}), "OK");
  ASSERT_EQ(redis_command(port, {"SET", "f{0}:1:3", std::string(16, 'y')}), "OK");
  auto s = store::EmbeddingStore::open(f.config(false), kFaultTables);
  ASSERT_EQ(s->tiers()[0]->name(), "redis");
  const store::TierStats& redis = s->tiers()[0]->stats;

  ::testing::internal::CaptureStderr();
  check_rows(*s, 0, {5, 6, 7});  // read from RocksDB
  const std::string log0 = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(redis.bad_values, 2);
  EXPECT_EQ(redis.misses, 3);
  EXPECT_EQ(s->tiers()[1]->stats.hits, 3);
  // Logged once for the table, naming the address, the key and the sizes.
  EXPECT_NE(log0.find("redis tier " + f.address +
                      ": key f{0}:0:5 holds 3 bytes, expected a row "
                      "of 16 bytes"),
            std::string::npos)
      << log0;
  EXPECT_EQ(log0.find("f{0}:0:6"), std::string::npos) << "logged twice for one table:\n" << log0;
  // The fill overwrote them with the rows: now hits in Redis.
  EXPECT_EQ(redis_command(port, {"GET", "f{0}:0:5"}), row_bytes(0, 5));
  EXPECT_EQ(redis_command(port, {"GET", "f{0}:0:6"}), row_bytes(0, 6));
  check_rows(*s, 0, {5, 6});
  EXPECT_EQ(redis.hits, 2);
  EXPECT_EQ(redis.bad_values, 2);

  // Another table's bad value: logged for that table too.
  ::testing::internal::CaptureStderr();
  check_rows(*s, 1, {3, 4});
  const std::string log1 = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(redis.bad_values, 3);
  EXPECT_NE(log1.find("key f{0}:1:3 holds 16 bytes, expected a row of 8 bytes"), std::string::npos)
      << log1;
  EXPECT_NE(log1.find("'emb.1.weight'"), std::string::npos) << log1;
  // A later bad value of table 0 is counted, not logged.
  ASSERT_EQ(redis_command(port, {"SET", "f{0}:0:9", "z"}), "OK");
  ::testing::internal::CaptureStderr();
  check_rows(*s, 0, {9});
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(redis.bad_values, 4);
  EXPECT_NE(s->stats_text().find("redis: hits 2 misses 6 evictions 0 bytes 0 lookups 4"),
            std::string::npos)
      << s->stats_text();
  EXPECT_NE(s->stats_text().find("bad_values 4"), std::string::npos) << s->stats_text();
}

TEST(RedisFaults, AnOutageFallsThroughToRocksDb) {
  REDIS_FIXTURE(f);
  auto s = store::EmbeddingStore::open(f.config(true), kFaultTables);
  ASSERT_EQ(s->tiers().size(), 3u);
  const store::TierStats& redis = s->tiers()[1]->stats;
  check_rows(*s, 0, {1, 2, 3});  // RocksDB -> Redis and host
  EXPECT_EQ(redis.failures, 0);

  // Redis stopped: rows in no tier above it come from RocksDB; the failure is counted and logged
  // once (not per lookup), and the fills into Redis are not tried again in the same lookup.
  f.server->stop();
  ::testing::internal::CaptureStderr();
  check_rows(*s, 0, {10, 11, 12});
  check_rows(*s, 1, {0, 9});
  check_rows(*s, 0, {1, 2, 3});  // still served by the host tier
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(redis.failures, 2);  // the two lookups that reached Redis, no fill after them
  EXPECT_EQ(redis.failing, 1);
  EXPECT_EQ(s->tiers()[2]->stats.hits, 3 + 3 + 2);
  EXPECT_NE(log.find("redis tier " + f.address), std::string::npos) << log;
  EXPECT_NE(log.find("the redis tier is passed over"), std::string::npos) << log;
  EXPECT_EQ(log.find("passed over", log.find("passed over") + 1), std::string::npos)
      << "logged more than once:\n"
      << log;
  EXPECT_NE(s->stats_text().find("failures 2"), std::string::npos) << s->stats_text();

  // Back on the same port (empty): used again without reopening the store, and said so.
  f.server = std::make_unique<RedisServer>(dlrec::testing::find_redis_server(),
                                           std::stoi(f.address.substr(10)), f.dir.path);
  ASSERT_TRUE(f.server->up());
  ::testing::internal::CaptureStderr();
  check_rows(*s, 0, {20});
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("the redis tier answers again"),
            std::string::npos);
  EXPECT_EQ(redis.failing, 0);
  EXPECT_EQ(redis_command(f.server->port(), {"GET", "f{0}:0:20"}), row_bytes(0, 20));
}

TEST(RedisFaults, DuringAnOutageOnlyRowsNoRemainingTierHoldsFail) {
  REDIS_FIXTURE(f);
  std::vector<std::unique_ptr<store::Tier>> tiers;
  tiers.push_back(store::open_redis_tier(kFaultTables, f.config(false)));
  tiers.push_back(std::make_unique<HiddenRowTier>(
      store::open_rocksdb_tier(f.dir.path + "/db", kFaultTables, 1 << 20), 7));
  store::EmbeddingStore s(kFaultTables, std::move(tiers));
  f.server->stop();
  ::testing::internal::CaptureStderr();
  check_rows(s, 0, {6, 8});  // held below
  std::vector<float> out(8);
  const std::vector<int64_t> ids = {6, 7};
  expect_error([&] { s.lookup(0, ids.data(), 2, out.data()); },
               {"row 7 of table 'emb.0.weight' is held by no tier", "hidden-rocksdb",
                "a tier above was passed over: redis tier " + f.address, "cannot connect"});
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.tiers()[0]->stats.failures, 2);
}

// While Redis is down, connections are tried at most once per retry_ms: a lookup inside the
// interval passes the tier over without a connection attempt (its error says when the next one
// is), and the first lookup after it reconnects.
TEST(RedisFaults, ReconnectsAtMostOncePerRetryInterval) {
  REDIS_FIXTURE(f);
  const int port = f.server->port();
  json j = {{"redis",
             {{"address", f.address}, {"key_prefix", "f"}, {"partitions", 1}, {"retry_ms", 60000}}},
            {"rocksdb", {{"path", "db"}}}};
  auto s = store::EmbeddingStore::open(store::StoreConfig::from_json(j, f.dir.path, "test"),
                                       kFaultTables);
  const store::TierStats& redis = s->tiers()[0]->stats;
  check_rows(*s, 0, {1});
  f.server->stop();
  ::testing::internal::CaptureStderr();
  check_rows(*s, 0, {2});  // the connection is lost; one attempt fails
  EXPECT_EQ(redis.failures, 1);
  f.server = std::make_unique<RedisServer>(dlrec::testing::find_redis_server(), port, f.dir.path);
  ASSERT_TRUE(f.server->up());
  // Up again, but inside the 60 s interval: no attempt, still passed over, and the error says so.
  std::unique_ptr<store::Tier> alone = store::open_redis_tier(kFaultTables, f.config(false));
  std::vector<float> out(8);
  std::vector<uint8_t> found(1, 0);
  const int64_t id = 3;
  check_rows(*s, 0, {3});
  EXPECT_EQ(redis.failures, 2);
  EXPECT_EQ(redis.failing, 1);
  ::testing::internal::GetCapturedStderr();
  alone->lookup(0, &id, 1, out.data(), found.data());  // retry_ms 0: connects at once
  EXPECT_EQ(found[0], 0);  // Redis is empty after the restart (volatile)

  // retry_ms 100: after the interval the next lookup connects again.
  j["redis"]["retry_ms"] = 100;
  auto q = store::EmbeddingStore::open(store::StoreConfig::from_json(j, f.dir.path, "test"),
                                       kFaultTables);
  f.server->stop();
  ::testing::internal::CaptureStderr();
  check_rows(*q, 0, {4});
  std::vector<float> row(8);
  const int64_t four = 4;
  store::Tier& qr = *q->tiers()[0];
  try {
    qr.lookup(0, &four, 1, row.data(), found.data());
    ADD_FAILURE() << "a lookup inside the retry interval reached Redis";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("next attempt in"), std::string::npos) << e.what();
  }
  f.server = std::make_unique<RedisServer>(dlrec::testing::find_redis_server(), port, f.dir.path);
  ASSERT_TRUE(f.server->up());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  check_rows(*q, 0, {5});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(qr.stats.failing, 0) << log;
  EXPECT_NE(log.find("the redis tier answers again"), std::string::npos) << log;
  EXPECT_EQ(redis_command(port, {"EXISTS", "f{0}:0:5"}), "1");
}

// The test scaffolding (redis_server.h): a port taken by another process between its pick and
// redis-server's bind is not mistaken for the server being up, and start() moves to a fresh port.
TEST(RedisFaults, AServerThatLostItsPortIsNotTakenForUp) {
  const std::string binary = dlrec::testing::find_redis_server();
  if (binary.empty()) GTEST_SKIP() << "no redis-server binary (Debian's redis-server package)";
  TempDir dir("redis_port");
  // Another process's listener on the port (it accepts connections, answers nothing).
  const int holder = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(holder, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(holder, 16), 0);
  socklen_t len = sizeof a;
  ::getsockname(holder, reinterpret_cast<sockaddr*>(&a), &len);
  const int taken = ntohs(a.sin_port);
  ASSERT_TRUE(dlrec::testing::port_open(taken));
  {
    RedisServer lost(binary, taken, dir.path);  // its bind fails: it exits
    EXPECT_FALSE(lost.up()) << "the listener on port " << taken << " was taken for redis-server";
  }
  auto server = RedisServer::start(binary, dir.path);
  ASSERT_TRUE(server);
  EXPECT_NE(server->port(), taken);
  EXPECT_EQ(redis_command(server->port(), {"PING"}), "PONG");
  ::close(holder);
}
