// Online updates (include/dlrec/store/updates.h) and the host tier's LFU eviction:
//   - the update tier alone: a version is applied whole or not at all, pinned snapshots keep
//     their rows, gaps / bad tables / dims / ids / the byte bound are refused;
//   - LFU evicts the least frequently used row where LRU evicts the least recent;
//   - with a real redis-server: after `push`, a predictor serves the new rows (bit for bit those
//     of a model exported with them) within 1 s; bad stream entries and a version gap are
//     rejected with a logged error while the last good version is served; a rejected version
//     published again, corrected, is applied.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/model/model.h"
#include "dlrec/store/updates.h"
#include "dlrec/train/export.h"
#include "dlrec/train/push.h"
#include "store/redis_server.h"
#include "store/store_helpers.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::expect_error;
using dlrec::testing::TempDir;
namespace fs = std::filesystem;

namespace {

std::vector<store::TableInfo> two_tables() {
  return {{"emb.0.weight", 0, 10, 2}, {"emb.1.weight", 1, 5, 3}};
}

store::RowUpdate update(int table, std::vector<int64_t> ids, std::vector<float> rows) {
  store::RowUpdate u;
  u.table = table;
  u.ids = std::move(ids);
  u.rows = std::move(rows);
  return u;
}

}  // namespace

TEST(UpdateTier, AppliesAVersionWholeAndKeepsPinnedSnapshots) {
  store::UpdateTier tier(two_tables(), 1 << 20);
  EXPECT_EQ(tier.version(), 1u);
  const auto before = tier.pin();
  tier.apply(2, {update(0, {3, 7}, {1, 2, 3, 4}), update(1, {4}, {5, 6, 7})});
  EXPECT_EQ(tier.version(), 2u);
  EXPECT_EQ(tier.updates.versions_applied, 1);
  EXPECT_EQ(tier.updates.rows_applied, 3);
  const int64_t ids[3] = {7, 1, 3};
  float out[6] = {0};
  uint8_t found[3] = {0};
  tier.lookup(0, ids, 3, out, found);
  EXPECT_EQ(found[0], 1);
  EXPECT_EQ(found[1], 0);
  EXPECT_EQ(found[2], 1);
  EXPECT_EQ(out[0], 3.f);
  EXPECT_EQ(out[1], 4.f);
  EXPECT_EQ(out[4], 1.f);
  // The snapshot pinned before the version holds none of its rows.
  uint8_t old_found[3] = {0};
  tier.lookup_at(*before, 0, ids, 3, out, old_found);
  EXPECT_EQ(old_found[0] + old_found[1] + old_found[2], 0);
  // A later version replaces a row and keeps the others.
  tier.apply(3, {update(0, {7}, {9, 9})});
  std::fill(found, found + 3, 0);
  tier.lookup(0, ids, 3, out, found);
  EXPECT_EQ(out[0], 9.f);
  EXPECT_EQ(out[4], 1.f);
}

TEST(UpdateTier, RefusesGapsBadRowsAndTheBoundChangingNothing) {
  store::UpdateTier tier(two_tables(), 3 * (8 + store::kHostEntryOverhead));
  expect_error(
      [&] {
        tier.apply(3, {update(0, {1}, {1, 2})});
      },
      {"update version 3", "expected version 2", "versions in between are missing"});
  expect_error([&] { tier.apply(2, {update(5, {1}, {1, 2})}); }, {"table index 5 of 2"});
  expect_error(
      [&] {
        tier.apply(2, {update(0, {1}, {1, 2, 3})});
      },
      {"table 'emb.0.weight'", "3 floats for 1 rows of dim 2"});
  expect_error(
      [&] {
        tier.apply(2, {update(1, {0, 5}, {1, 2, 3, 4, 5, 6})});
      },
      {"id 5 is beyond table 'emb.1.weight' (5 rows)"});
  expect_error(
      [&] {
        tier.apply(2, {update(0, {0, 1, 2, 3}, {1, 2, 3, 4, 5, 6, 7, 8})});
      },
      {"beyond its bound updates.max_bytes"});
  EXPECT_EQ(tier.version(), 1u);
  tier.apply(2, {update(0, {0}, {1, 2})});
  expect_error([&] { tier.apply(2, {update(0, {0}, {1, 2})}); }, {"already applied"});
  EXPECT_EQ(tier.version(), 2u);
}

TEST(HostTier, LfuEvictsTheLeastFrequentlyUsedLruTheLeastRecent) {
  const std::vector<store::TableInfo> tables{{"emb.0.weight", 0, 100, 4}};
  const int64_t entry = 16 + store::kHostEntryOverhead;
  for (const std::string policy : {"lru", "lfu"}) {
    auto tier = store::make_host_tier(tables, 2 * entry, 1, policy);
    const float row[4] = {1, 2, 3, 4};
    const int64_t a = 1, b = 2, c = 3;
    tier->fill(0, &a, 1, row);
    tier->fill(0, &b, 1, row);
    float out[4];
    for (int k = 0; k < 3; ++k) {  // a used often...
      uint8_t f = 0;
      tier->lookup(0, &a, 1, out, &f);
      ASSERT_EQ(f, 1);
    }
    uint8_t f = 0;
    tier->lookup(0, &b, 1, out, &f);  // ...b last
    tier->fill(0, &c, 1, row);        // one of them goes
    EXPECT_EQ(tier->stats.evictions, 1) << policy;
    uint8_t fa = 0, fb = 0;
    tier->lookup(0, &a, 1, out, &fa);
    tier->lookup(0, &b, 1, out, &fb);
    if (policy == "lru") {
      EXPECT_EQ(fa, 0) << "LRU keeps the most recent (b)";
      EXPECT_EQ(fb, 1);
    } else {
      EXPECT_EQ(fa, 1) << "LFU keeps the most used (a)";
      EXPECT_EQ(fb, 0);
    }
  }
  expect_error([&] { store::make_host_tier(tables, 1000, 1, "fifo"); }, {"eviction 'fifo'"});
  expect_error(
      [&] {
        store::StoreConfig::from_json(json::parse(R"({"host": {"bytes": 10, "eviction": "mru"},
                                                      "rocksdb": {"path": "x"}})"),
                                      "", "t");
      },
      {"eviction"});
}

namespace {

// A model exported twice from one initialisation (all in memory, and with its tables in
// RocksDB), a copy of the in-memory one with some table rows changed, and a redis-server.
struct UpdateSetup {
  TempDir dir{"store_update"};
  std::string full, tiered, changed;
  std::vector<std::string> lines;
  std::vector<store::TableInfo> tables;
  std::unique_ptr<dlrec::testing::RedisServer> redis;
  int port = 0;  // redis's

  UpdateSetup() {
    io::DatagenConfig gen;
    gen.rows = 800;
    gen.seed = 4;
    gen.num_dense = 2;
    gen.num_cat = 3;
    gen.cardinalities = {20, 300};
    io::generate_file(gen, dir.path + "/logs.tsv");
    etl::EtlOptions o;
    o.inputs = {dir.path + "/logs.tsv"};
    o.schema = gen.schema();
    o.workflow = json::parse(R"({"pipeline": [
        {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}]},
        {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
    o.output_dir = dir.path + "/data";
    etl::run_etl(o);
    const std::string cfg = dlrec::testing::write_file(dir.path, "cfg.json", R"({"model":
        {"arch": "dlrm", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]}})");
    full = dir.path + "/full";
    tiered = dir.path + "/tiered";
    changed = dir.path + "/changed";
    train::export_initialized(cfg, o.output_dir, full, 5);
    train::TierExport t;
    t.add("rocksdb=" + dir.path + "/db");
    train::export_initialized(cfg, o.output_dir, tiered, 5, false, train::OnnxExport::None, t);
    tables = train::model_store_tables(full);
    write_changed(full, changed, 1.f);
    std::ifstream f(dir.path + "/logs.tsv");
    for (std::string l; std::getline(f, l);) lines.push_back(l);
    if (store::redis_available() && !dlrec::testing::find_redis_server().empty()) {
      redis = dlrec::testing::RedisServer::start(dlrec::testing::find_redis_server(), dir.path);
      if (redis) port = redis->port();
    }
  }
  // A copy of model `from` whose tables have every third row shifted by `delta`.
  void write_changed(const std::string& from, const std::string& to, float delta) {
    fs::create_directories(to);
    for (const char* f : {"model.json", "workflow.json"})
      fs::copy_file(from + "/" + f, to + "/" + f, fs::copy_options::overwrite_existing);
    const json meta = read_json_file(from + "/model.json");
    const auto cfg = model::RunConfig::from_json(meta.at("config"));
    auto m =
        model::build_model(cfg.model, cfg.optimizer, io::ShardLayout::from_json(meta.at("layout")),
                           Device::cpu(), 0, "fp32");
    std::vector<io::NamedTensor> all = m->parameters();
    io::load_tensors(from + "/weights.dlrec", all);
    for (auto& [name, tensor] : all)
      for (const store::TableInfo& t : tables)
        if (t.name == name)
          for (int64_t r = 0; r < t.rows; r += 3)
            for (int64_t k = 0; k < t.dim; ++k) tensor.data<float>()[r * t.dim + k] += delta;
    io::save_tensors(to + "/weights.dlrec", all, io::read_tensor_meta(from + "/weights.dlrec"));
  }
  store::StreamAddress stream() const { return {"127.0.0.1", port, "updates:m", 1000}; }
  store::StoreConfig store_config() const {
    return store::StoreConfig::from_json(
        json::parse(R"({"host": {"bytes": 100000, "eviction": "lfu"},
                        "updates": {"address": "127.0.0.1:)" +
                    std::to_string(port) + R"(", "stream": "updates:m", "block_ms": 20},
                        "rocksdb": {"path": "db"}})"),
        dir.path, "test");
  }
  std::vector<float> predict(const std::string& model) {
    train::Predictor p(model);
    return p.predict_lines(lines, "logs");
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Waits (up to `seconds`) until the store holds `version`; returns the seconds it took.
double wait_for_version(store::EmbeddingStore& s, uint64_t version, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s.updates()->version() >= version || dt > seconds) return dt;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

#define REQUIRE_REDIS_AND_ROCKSDB(setup)                                                \
  if (!store::rocksdb_available()) GTEST_SKIP() << "this build has no RocksDB tier";    \
  if (!store::redis_available() || dlrec::testing::find_redis_server().empty())         \
    GTEST_SKIP() << "no Redis tier in this build or no redis-server installed: online " \
                    "updates are not checked";                                          \
  ASSERT_TRUE(setup.redis) << "redis-server did not start (20 ports tried)"

}  // namespace

TEST(OnlineUpdates, APushIsServedBitForBitWithinOneSecond) {
  UpdateSetup s;
  REQUIRE_REDIS_AND_ROCKSDB(s);
  ASSERT_TRUE(s.redis->up());
  const std::vector<float> old_p = s.predict(s.full), new_p = s.predict(s.changed);
  ASSERT_FALSE(same_bits(old_p, new_p)) << "the changed rows must change predictions";
  const store::StoreConfig c = s.store_config();
  train::Predictor served(s.tiered, Device::cpu(), "fp32", &c);
  ASSERT_TRUE(same_bits(served.predict_lines(s.lines, "logs"), old_p));
  const train::PushResult r = train::push_update(s.tables, s.full + "/weights.dlrec",
                                                 s.changed + "/weights.dlrec", s.stream(), 7);
  EXPECT_EQ(r.version, 2u);
  EXPECT_GT(r.rows, 0);
  const double took = wait_for_version(*served.store(), 2, 5.0);
  EXPECT_LT(took, 1.0) << "the update took " << took << " s to be applied";
  EXPECT_TRUE(same_bits(served.predict_lines(s.lines, "logs"), new_p))
      << "after the push the predictions are those of the model exported with the new rows";
  store::UpdateTier& u = *served.store()->updates();
  EXPECT_EQ(u.updates.rows_applied, r.rows);
  EXPECT_GE(u.updates.lag_ms, 0);
  EXPECT_EQ(u.updates.error(), "");
  // A second store opened now replays the stream from its start before it opens: it serves
  // version 2 from its first lookup.
  train::Predictor late(s.tiered, Device::cpu(), "fp32", &c);
  EXPECT_EQ(late.store()->updates()->version(), 2u);
  EXPECT_TRUE(same_bits(late.predict_lines(s.lines, "logs"), new_p));
  // Nothing changed: nothing published.
  EXPECT_EQ(train::push_update(s.tables, s.changed + "/weights.dlrec", s.changed + "/weights.dlrec",
                               s.stream(), 7)
                .version,
            0u);
}

TEST(OnlineUpdates, BadEntriesAndGapsAreRejectedAndTheLastGoodVersionServed) {
  UpdateSetup s;
  REQUIRE_REDIS_AND_ROCKSDB(s);
  const std::vector<float> old_p = s.predict(s.full), new_p = s.predict(s.changed);
  const store::StoreConfig c = s.store_config();
  train::Predictor served(s.tiered, Device::cpu(), "fp32", &c);
  store::UpdateTier& u = *served.store()->updates();
  const store::TableInfo& t0 = s.tables[0];
  auto bytes = [](const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); };
  const int64_t id = 1, far = t0.rows;
  const std::vector<float> row(static_cast<size_t>(t0.dim), 0.5f);
  struct Case {
    std::string what;
    std::vector<std::pair<std::string, std::string>> rows_entry;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"unknown table",
       {{"table", "emb.99.weight"},
        {"dim", std::to_string(t0.dim)},
        {"ids", bytes(&id, 8)},
        {"rows", bytes(row.data(), row.size() * 4)}},
       "unknown table 'emb.99.weight'"},
      {"wrong dim",
       {{"table", t0.name},
        {"dim", std::to_string(t0.dim + 1)},
        {"ids", bytes(&id, 8)},
        {"rows", bytes(row.data(), row.size() * 4)}},
       "has dim " + std::to_string(t0.dim)},
      {"rows of the wrong size",
       {{"table", t0.name},
        {"dim", std::to_string(t0.dim)},
        {"ids", bytes(&id, 8)},
        {"rows", bytes(row.data(), 4)}},
       "'rows' holds 4 bytes"},
      {"id out of range",
       {{"table", t0.name},
        {"dim", std::to_string(t0.dim)},
        {"ids", bytes(&far, 8)},
        {"rows", bytes(row.data(), row.size() * 4)}},
       "id " + std::to_string(far) + " is beyond table '" + t0.name + "'"},
  };
  int64_t rejected = 0;
  for (const Case& k : cases) {
    store::append_stream_entry(s.stream(), {{"type", "begin"}, {"version", "2"}});
    auto e = k.rows_entry;
    e.insert(e.begin(), {{"type", "rows"}, {"version", "2"}});
    store::append_stream_entry(s.stream(), e);
    store::append_stream_entry(s.stream(), {{"type", "commit"}, {"version", "2"}});
    ++rejected;
    for (int w = 0; w < 500 && u.updates.versions_rejected < rejected; ++w)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(u.updates.versions_rejected, rejected) << k.what;
    const std::string err = u.updates.error();
    EXPECT_NE(err.find("version 2 rejected"), std::string::npos) << k.what << ": " << err;
    EXPECT_NE(err.find(k.error), std::string::npos) << k.what << ": " << err;
    EXPECT_NE(err.find("serving version 1"), std::string::npos) << k.what << ": " << err;
    EXPECT_EQ(u.version(), 1u);
    EXPECT_TRUE(same_bits(served.predict_lines(s.lines, "logs"), old_p)) << k.what;
  }
  // A version gap: version 4 while the store holds 1.
  train::push_update(s.tables, s.full + "/weights.dlrec", s.changed + "/weights.dlrec", s.stream(),
                     50, 4);
  for (int w = 0; w < 500 && u.updates.versions_rejected <= rejected; ++w)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_NE(u.updates.error().find("versions in between are missing"), std::string::npos)
      << u.updates.error();
  EXPECT_EQ(u.version(), 1u);
  EXPECT_TRUE(same_bits(served.predict_lines(s.lines, "logs"), old_p));
  // Version 2 published again, corrected: applied, and the rows are served.
  train::push_update(s.tables, s.full + "/weights.dlrec", s.changed + "/weights.dlrec", s.stream(),
                     50, 2);
  EXPECT_LT(wait_for_version(*served.store(), 2, 5.0), 1.0);
  EXPECT_TRUE(same_bits(served.predict_lines(s.lines, "logs"), new_p));
  // An entry without a type, and an unfinished version (its rows, no commit), change nothing.
  store::append_stream_entry(s.stream(), {{"version", "3"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(u.version(), 2u);
}

TEST(OnlineUpdates, StoreConfigUpdatesSection) {
  auto parse = [](const std::string& text) {
    return store::StoreConfig::from_json(json::parse(text), "/base", "t");
  };
  const auto c = parse(R"({"redis": {"address": "h:1"}, "updates": {"stream": "s"},
                           "rocksdb": {"path": "d"}})");
  EXPECT_TRUE(c.updates);
  EXPECT_EQ(c.updates_host, "h");
  EXPECT_EQ(c.updates_port, 1);
  EXPECT_EQ(c.updates_block_ms, 100);
  expect_error([&] { parse(R"({"updates": {"stream": "s"}, "rocksdb": {"path": "d"}})"); },
               {"t.updates.address", "required"});
  expect_error([&] { parse(R"({"updates": {"address": "h:1"}, "rocksdb": {"path": "d"}})"); },
               {"t.updates.stream", "required"});
  expect_error(
      [&] {
        parse(
            R"({"updates": {"address": "h:1", "stream": "s", "block": 1}, "rocksdb": {"path": "d"}})");
      },
      {"block"});
}

#ifdef DLREC_WITH_SERVER
#include <atomic>

#include "dlrec/serve/model_repository.h"
#include "dlrec/serve/stats.h"
#include "dlrec/train/onnx_export.h"

using dlrec::testing::request_of;

// Client threads ask a served model all through an online update: no request fails, each
// answer is the old model's or the new one's (bit for bit, never a mix), a client that saw the
// new answer never sees the old one again, and the new rows are served within 1 s of the push.
TEST(OnlineUpdates, ServedModelUpdatesUnderConcurrentRequests) {
  UpdateSetup s;
  REQUIRE_REDIS_AND_ROCKSDB(s);
  const std::string repo = s.dir.path + "/repo";
  fs::create_directories(repo + "/m/1");
  for (const char* f : {"model.json", "workflow.json", "weights.dlrec"})
    fs::copy_file(s.tiered + "/" + f, repo + "/m/1/" + f);
  dlrec::testing::write_file(repo + "/m", "config.json",
                             R"({"embedding_store": {"host": {"bytes": 20000, "shards": 4},
                                 "updates": {"address": "127.0.0.1:)" +
                                 std::to_string(s.port) + R"(", "stream": "updates:m",
                                             "block_ms": 20},
                                 "rocksdb": {"path": ")" +
                                 s.dir.path + R"(/db"}}})");
  train::Predictor full(s.full), changed(s.changed);
  const std::vector<std::string> lines(s.lines.begin(), s.lines.begin() + 300);
  const io::Batch batch = train::encode_lines(full.workflow(), lines, "logs");
  const std::vector<float> want_old = full.predict(batch), want_new = changed.predict(batch);
  ASSERT_FALSE(same_bits(want_old, want_new));
  auto stats = std::make_shared<serve::StatsRegistry>();
  // One request per execution: the answers are compared bit for bit with 300-row predictions,
  // and a merged batch of several requests may round differently (a BLAS may sum a row's
  // products in another order at another batch size: OpenBLAS on AMD EPYC does).
  serve::BatchingConfig one_request;
  one_request.max_batch_size = static_cast<int64_t>(lines.size());
  serve::ModelRepository models(repo, one_request, stats);
  models.load("m");
  auto served = models.get("m", "");
  const serve::InferRequest request = request_of(batch);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> old_answers{0}, new_answers{0}, mixed{0}, failed{0}, went_back{0};
  std::atomic<int64_t> first_new_ns{0};
  std::string first_failure;
  std::mutex failure_mu;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c)
    clients.emplace_back([&] {
      bool seen_new = false;
      while (!stop) {
        try {
          const serve::InferResponse r = served->infer(request);
          if (same_bits(r.probability, want_new)) {
            ++new_answers;
            seen_new = true;
            int64_t none = 0;
            first_new_ns.compare_exchange_strong(
                none, std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count());
          } else if (same_bits(r.probability, want_old)) {
            ++old_answers;
            if (seen_new) ++went_back;
          } else {
            ++mixed;
          }
        } catch (const std::exception& e) {
          ++failed;
          std::lock_guard<std::mutex> lock(failure_mu);
          if (first_failure.empty()) first_failure = e.what();
        }
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto pushed_at = std::chrono::steady_clock::now();
  const train::PushResult r = train::push_update(s.tables, s.full + "/weights.dlrec",
                                                 s.changed + "/weights.dlrec", s.stream(), 5);
  ASSERT_EQ(r.version, 2u);
  for (int w = 0; w < 500 && first_new_ns == 0; ++w)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(failed, 0) << first_failure;
  EXPECT_EQ(mixed, 0) << "answers that are neither the old model's nor the new one's";
  EXPECT_EQ(went_back, 0);
  EXPECT_GT(old_answers, 0);
  EXPECT_GT(new_answers, 0);
  const double pushed_s = std::chrono::duration<double>(pushed_at - t0).count();
  EXPECT_LT(first_new_ns / 1e9 - pushed_s, 1.0) << "the new rows took over 1 s to be served";
  const std::string metrics = stats->prometheus();
  for (const char* part :
       {"dlrec_embedding_store_update_version{model=\"m\",version=\"1\",tier=\"updates\"} 2",
        "dlrec_embedding_store_updates_applied{model=\"m\",version=\"1\",tier=\"updates\"} 1",
        "dlrec_embedding_store_updates_rejected{model=\"m\",version=\"1\",tier=\"updates\"} 0",
        "# TYPE dlrec_embedding_store_update_lag_ms gauge"})
    EXPECT_NE(metrics.find(part), std::string::npos) << part << " not in:\n" << metrics;
  EXPECT_EQ(
      metrics.find("dlrec_embedding_store_update_version{model=\"m\",version=\"1\",tier=\"host\""),
      std::string::npos);
  std::printf("[  NOTE    ] %lld old answers, %lld new, the first new %.0f ms after the push\n",
              static_cast<long long>(old_answers.load()),
              static_cast<long long>(new_answers.load()), (first_new_ns / 1e9 - pushed_s) * 1e3);
}
#endif
