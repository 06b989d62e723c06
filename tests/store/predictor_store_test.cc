// The predictor through the tiered embedding store: predictions bit for bit those of the
// all-in-memory model for several tier configurations (RocksDB only, a host tier so small that
// it evicts, a large one, staging that must grow), DLRM and Wide&Deep (two tables on a feature),
// one-hot and multi-hot; export --tiers; the refusals (a store of another model, a missing
// store); the CLI's --store and --plan.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "dlrec/core/device.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/store/gpu_cache.h"
#include "dlrec/train/export.h"
#include "store/redis_server.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::expect_error;
using dlrec::testing::TempDir;
namespace fs = std::filesystem;

namespace {

#define REQUIRE_ROCKSDB()          \
  if (!store::rocksdb_available()) \
  GTEST_SKIP() << "this build has no RocksDB tier (librocksdb-dev not found at configure)"

// Logs with one-hot and multi-hot features, their ETL output (built once per test).
struct Data {
  TempDir dir{"store_pred"};
  std::string logs, data;
  std::vector<std::string> lines;
  Data() {
    io::DatagenConfig gen;
    gen.rows = 3000;
    gen.seed = 9;
    gen.num_dense = 3;
    gen.num_cat = 4;
    gen.num_multi_hot = 1;
    gen.cardinalities = {40, 300, 2000};
    logs = dir.path + "/logs.tsv";
    data = dir.path + "/data";
    io::generate_file(gen, logs);
    etl::EtlOptions o;
    o.inputs = {logs};
    o.schema = gen.schema();
    o.workflow = json::parse(R"({"pipeline": [
      {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"}]},
      {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
    o.output_dir = data;
    etl::run_etl(o);
    std::ifstream f(logs);
    for (std::string l; std::getline(f, l);) lines.push_back(l);
  }
  // Exports an untrained model of `model_json` (the "model" section), with or without tiers.
  std::string export_model(const std::string& name, const std::string& model_json,
                           const std::string& rocksdb_dir = "") {
    const std::string cfg = dlrec::testing::write_file(
        dir.path, name + ".json",
        R"({"model": )" + model_json + R"(, "optimizer": {"type": "sgd", "lr": 0.1}})");
    train::TierExport tiers;
    if (!rocksdb_dir.empty()) tiers.add("rocksdb=" + rocksdb_dir);
    const std::string out = dir.path + "/" + name;
    train::export_initialized(cfg, data, out, 77, false, train::OnnxExport::None, tiers);
    return out;
  }
};

store::StoreConfig config(const std::string& text, const std::string& base) {
  return store::StoreConfig::from_json(json::parse(text), base, "test");
}

void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got,
                      const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(std::memcmp(&want[i], &got[i], 4), 0)
        << what << ": row " << i << ": " << want[i] << " vs " << got[i];
}

constexpr const char* kDlrm =
    R"({"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]})";
constexpr const char* kWideDeep = R"({"arch": "wide_deep", "embedding_dim": 4, "top_mlp": [8, 1]})";

void check_tier_configurations(const char* model_json) {
  Data d;
  const std::string full = d.export_model("full", model_json);
  const std::string tiered = d.export_model("tiered", model_json, d.dir.path + "/db");
  // The tables live in RocksDB only: weights.dlrec holds the dense parameters.
  EXPECT_LT(fs::file_size(tiered + "/weights.dlrec"), fs::file_size(full + "/weights.dlrec") / 4);
  // With the Redis tier built and redis-server installed, a configuration with Redis too.
  std::unique_ptr<dlrec::testing::RedisServer> redis;
  int redis_port = 0;
  if (store::redis_available() && !dlrec::testing::find_redis_server().empty()) {
    redis = dlrec::testing::RedisServer::start(dlrec::testing::find_redis_server(), d.dir.path);
    ASSERT_TRUE(redis) << "redis-server did not start (20 ports tried)";
    redis_port = redis->port();
  } else {
    std::printf(
        "[  NOTE    ] no Redis tier or redis-server here: the Redis configuration is "
        "not checked\n");
  }
  for (const int64_t batch_rows : {int64_t{4096}, int64_t{97}}) {
    train::Predictor reference(full);
    const std::vector<float> want = reference.predict_lines(d.lines, "logs", batch_rows);
    ASSERT_EQ(want.size(), 3000u);
    const std::string at = " (batches of " + std::to_string(batch_rows) + ")";
    {  // model.json's store: RocksDB only
      train::Predictor p(tiered);
      ASSERT_NE(p.store(), nullptr);
      ASSERT_EQ(p.store()->tiers().size(), 1u);
      expect_same_bits(want, p.predict_lines(d.lines, "logs", batch_rows), "rocksdb only" + at);
    }
    {  // a host tier of a few rows (it evicts) over RocksDB, staging that must grow
      const auto c = config(R"({"host": {"bytes": 2048, "shards": 2}, "rocksdb": {"path": "db"},
                                "staging_rows": 4})",
                            d.dir.path);
      train::Predictor p(tiered, Device::cpu(), "fp32", &c);
      expect_same_bits(want, p.predict_lines(d.lines, "logs", batch_rows), "tiny host" + at);
      const store::Tier& host = *p.store()->tiers()[0];
      EXPECT_GT(host.stats.evictions, 0);
      EXPECT_LE(host.stats.bytes, 2048);
    }
    if (redis) {  // a tiny host tier over a Redis shared by two predictors, over RocksDB
      const auto c = config(R"({"host": {"bytes": 2048}, "redis": {"address": "127.0.0.1:)" +
                                std::to_string(redis_port) + R"(", "key_prefix": "p)" +
                                std::to_string(batch_rows) + R"("}, "rocksdb": {"path": "db"}})",
                            d.dir.path);
      train::Predictor first(tiered, Device::cpu(), "fp32", &c);
      expect_same_bits(want, first.predict_lines(d.lines, "logs", batch_rows), "redis" + at);
      train::Predictor second(tiered, Device::cpu(), "fp32", &c);
      expect_same_bits(want, second.predict_lines(d.lines, "logs", batch_rows),
                       "redis, filled by another" + at);
      EXPECT_EQ(second.store()->tiers()[2]->stats.hits, 0);  // every row came from Redis
      EXPECT_GT(second.store()->tiers()[1]->stats.hits, 0);
    }
    {  // a host tier holding everything, over RocksDB; the full model's dir (tables ignored)
      const auto c =
          config(R"({"host": {"bytes": 100000000}, "rocksdb": {"path": "db"}})", d.dir.path);
      train::Predictor p(full, Device::cpu(), "fp32", &c);
      expect_same_bits(want, p.predict_lines(d.lines, "logs", batch_rows), "large host" + at);
      expect_same_bits(want, p.predict_lines(d.lines, "logs", batch_rows), "large host, again");
      const store::Tier& host = *p.store()->tiers()[0];
      EXPECT_EQ(host.stats.evictions, 0);
      EXPECT_GT(host.stats.hits, 0);
      // The second pass found every row in the host tier: RocksDB saw each row once.
      EXPECT_EQ(p.store()->tiers()[1]->stats.hits, host.stats.misses);
    }
  }
}

// The GPU cache tier (include/dlrec/store/gpu_cache.h) against the all-in-GPU model: bit for
// bit with sync inserts, async inserts, a staging area that must grow, a cache holding every
// row, and the default size; cold and warm.
void check_gpu_cache(const char* model_json) {
  Data d;
  const std::string full = d.export_model("full", model_json);
  const std::string tiered = d.export_model("tiered", model_json, d.dir.path + "/db");
  const char* configs[] = {
      R"({"gpu_cache": {"fraction": 0.05, "insert_threshold": 1}, "rocksdb": {"path": "db"}})",
      R"({"gpu_cache": {"fraction": 0.05, "eviction": "lru", "insert_threshold": 0},
          "rocksdb": {"path": "db"}, "staging_rows": 4})",
      R"({"gpu_cache": {"fraction": 0.3, "insert_threshold": 0.5},
          "host": {"bytes": 4096}, "rocksdb": {"path": "db"}})",
      R"({"gpu_cache": {"bytes": 100000000}, "rocksdb": {"path": "db"}})",
      R"({"rocksdb": {"path": "db"}})"};
  for (const int64_t batch_rows : {int64_t{4096}, int64_t{97}, int64_t{3}}) {
    train::Predictor reference(full, Device::cuda(0));
    const std::vector<float> want = reference.predict_lines(d.lines, "logs", batch_rows);
    for (const char* text : configs) {
      const std::string what =
          std::string(text) + " (batches of " + std::to_string(batch_rows) + ")";
      const auto c = config(text, d.dir.path);
      train::Predictor p(tiered, Device::cuda(0), "fp32", &c);
      ASSERT_NE(p.gpu_cache(), nullptr) << what;
      expect_same_bits(want, p.predict_lines(d.lines, "logs", batch_rows), "cold: " + what);
      p.gpu_cache()->drain();
      expect_same_bits(want, p.predict_lines(d.lines, "logs", batch_rows), "warm: " + what);
      const store::TierStats& s = p.gpu_cache()->stats;
      EXPECT_GT(s.hits.load(), 0) << what;
      EXPECT_GT(s.misses.load(), 0) << what;
      EXPECT_NE(p.memory_plan().find("tier gpu: "), std::string::npos) << p.memory_plan();
    }
  }
}

}  // namespace

TEST(PredictorStore, DlrmPredictsBitForBitThroughEveryTierConfiguration) {
  REQUIRE_ROCKSDB();
  check_tier_configurations(kDlrm);
}

TEST(PredictorStore, WideDeepWithTwoTablesPerFeaturePredictsBitForBit) {
  REQUIRE_ROCKSDB();
  check_tier_configurations(kWideDeep);
}

TEST(PredictorStore, GpuCacheDlrmPredictsBitForBitLikeTheAllInGpuModel) {
  REQUIRE_ROCKSDB();
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device here: the GPU cache is not run";
  check_gpu_cache(kDlrm);
}

TEST(PredictorStore, GpuCacheWideDeepPredictsBitForBitLikeTheAllInGpuModel) {
  REQUIRE_ROCKSDB();
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device here: the GPU cache is not run";
  check_gpu_cache(kWideDeep);
}

TEST(PredictorStore, GpuCacheOnACpuInstanceIsAClearError) {
  REQUIRE_ROCKSDB();
  Data d;
  const std::string tiered = d.export_model("tiered", kDlrm, d.dir.path + "/db");
  const auto c =
      config(R"({"gpu_cache": {"fraction": 0.1}, "rocksdb": {"path": "db"}})", d.dir.path);
  expect_error([&] { train::Predictor p(tiered, Device::cpu(), "fp32", &c); },
               {"embedding_store.gpu_cache is for GPU instances", "cpu"});
  if (cuda::device_count() > 0) {  // a cache larger than the device
    const auto big = config(
        R"({"gpu_cache": {"bytes": 1125899906842624}, "rocksdb": {"path": "db"}})", d.dir.path);
    expect_error([&] { train::Predictor p(tiered, Device::cuda(0), "fp32", &big); },
                 {"gpu_cache.bytes 1125899906842624", "larger than the device"});
    const auto staging =
        config(R"({"rocksdb": {"path": "db"}, "staging_rows": 2147483648})", d.dir.path);
    expect_error([&] { train::Predictor p(tiered, Device::cuda(0), "fp32", &staging); },
                 {"gpu_cache", "do not fit", "free on the device"});
  }
}

TEST(PredictorStore, RefusesAStoreOfAnotherModelAndAMissingStore) {
  REQUIRE_ROCKSDB();
  Data d;
  const std::string tiered = d.export_model("tiered", kDlrm, d.dir.path + "/db");
  // Same data, wider tables: the store's dims differ.
  const std::string wider = d.export_model(
      "wider", R"({"arch": "dlrm", "embedding_dim": 16, "bottom_mlp": [16, 16], "top_mlp": [1]})");
  const auto c = config(R"({"rocksdb": {"path": "db"}})", d.dir.path);
  expect_error([&] { train::Predictor p(wider, Device::cpu(), "fp32", &c); },
               {"written for another model", "has dim 8 in the store, 16 in the model"});
  // An export into an existing store directory is refused; the model dir is not written.
  expect_error([&] { d.export_model("again", kDlrm, d.dir.path + "/db"); }, {"already exists"});
  EXPECT_FALSE(fs::exists(d.dir.path + "/again"));
  // The store a model names is gone.
  fs::remove_all(d.dir.path + "/db");
  expect_error([&] { train::Predictor p(tiered); }, {"no store at", "/db"});
  expect_error(
      [&] {
        train::TierExport t;
        t.add("redis=x");
      },
      {"unknown tier 'redis'"});
  expect_error(
      [&] {
        train::TierExport t;
        t.add("rocksdb=");
      },
      {"rocksdb=DIR"});
}

TEST(PredictorStore, CliPredictsThroughAStoreFileAndPrintsThePlan) {
  REQUIRE_ROCKSDB();
  Data d;
  const std::string full = d.export_model("full", kDlrm);
  const std::string bin = std::string(DLREC_BIN_DIR) + "/dlrec";
  if (!fs::exists(bin)) GTEST_SKIP() << "no dlrec binary at " << bin << " (build target dlrec)";
  auto run = [&](const std::string& args, std::string* out) {
    FILE* p = popen((bin + " " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  std::string out;
  ASSERT_EQ(run("export --init " + d.dir.path + "/full.json --data " + d.data + " --seed 77" +
                    " --out " + d.dir.path + "/cli --tiers rocksdb=" + d.dir.path + "/clidb",
                &out),
            0)
      << out;
  dlrec::testing::write_file(
      d.dir.path, "store.json",
      R"({"embedding_store": {"host": {"bytes": 65536}, "rocksdb": {"path": "clidb"}}})");
  out.clear();
  ASSERT_EQ(
      run("predict --model " + d.dir.path + "/cli --store " + d.dir.path + "/store.json --plan",
          &out),
      0)
      << out;
  for (const char* part : {"tables: 4 in the store", "tier host: at most 0.1 MiB", "tier rocksdb",
                           "on disk", "total in memory"})
    EXPECT_NE(out.find(part), std::string::npos) << part << " not in:\n" << out;
  out.clear();
  const std::string probs = d.dir.path + "/p_store.txt", ref = d.dir.path + "/p_full.txt";
  ASSERT_EQ(run("predict --model " + d.dir.path + "/cli --store " + d.dir.path +
                    "/store.json --input " + d.logs + " --output " + probs,
                &out),
            0)
      << out;
  EXPECT_NE(out.find("host: hits"), std::string::npos) << out;
  ASSERT_EQ(run("predict --model " + full + " --input " + d.logs + " --output " + ref, &out), 0);
  EXPECT_EQ(dlrec::testing::read_all(probs), dlrec::testing::read_all(ref));
  out.clear();
  // --device cuda: the plan has the GPU cache's line; without a GPU, a clear error.
  const int gpu_rc = run("predict --model " + d.dir.path + "/cli --store " + d.dir.path +
                             "/store.json --device cuda --plan",
                         &out);
  if (cuda::device_count() > 0) {
    EXPECT_EQ(gpu_rc, 0) << out;
    EXPECT_NE(out.find("tier gpu: "), std::string::npos) << out;
  } else {
    EXPECT_NE(gpu_rc, 0) << out;
    EXPECT_NE(out.find("CUDA"), std::string::npos) << out;
  }
  out.clear();
  dlrec::testing::write_file(d.dir.path, "bad.json",
                             R"({"embedding_store": {"rocksdb": {"path": "clidb", "x": 1}}})");
  EXPECT_NE(run("predict --model " + full + " --store " + d.dir.path + "/bad.json --plan", &out),
            0);
  EXPECT_NE(out.find("embedding_store.rocksdb"), std::string::npos) << out;
#ifdef DLREC_WITH_SERVER
  // serve --dry-run: each model's plan (its config.json store: a host tier with LFU), a model
  // that would not load named with its error (exit status 1); no port is bound.
  fs::create_directories(d.dir.path + "/repo/m/1");
  fs::create_directories(d.dir.path + "/repo/bad/1");
  fs::copy(d.dir.path + "/cli", d.dir.path + "/repo/m/1", fs::copy_options::recursive);
  dlrec::testing::write_file(d.dir.path + "/repo/m", "config.json",
                             R"({"embedding_store": {"host": {"bytes": 131072, "eviction": "lfu"},
                                 "rocksdb": {"path": ")" +
                                 d.dir.path + R"(/clidb"}}})");
  dlrec::testing::write_file(d.dir.path + "/repo/bad", "config.json",
                             R"({"embedding_store": {"host": {"bytes": 10}}})");
  out.clear();
  EXPECT_EQ(run("serve --model-repository " + d.dir.path + "/repo --dry-run", &out), 1) << out;
  for (const char* part : {"model m version 1: 1 CPU instance(s)", "tier host: at most 0.1 MiB",
                           "tier rocksdb", "total in memory", "model bad: would not load",
                           "\"rocksdb\" is required", "2 model(s), 1 would not load"})
    EXPECT_NE(out.find(part), std::string::npos) << part << " not in:\n" << out;
#endif
}

// Staging grows with a larger batch by rebuilding the model and reading weights.dlrec again. A
// weights file replaced since the load (a new export over the directory) is refused, and the
// model that served before keeps serving: never initial weights, never a mix of two exports.
TEST(PredictorStore, AFailedStagingRebuildKeepsTheLoadedModel) {
  REQUIRE_ROCKSDB();
  Data d;
  const std::string tiered = d.export_model("tiered", kDlrm, d.dir.path + "/db");
  const auto c = config(R"({"rocksdb": {"path": "db"}, "staging_rows": 4})", d.dir.path);
  train::Predictor p(tiered, Device::cpu(), "fp32", &c);
  const std::vector<std::string> few(d.lines.begin(), d.lines.begin() + 2);
  const std::vector<float> want = p.predict_lines(few, "logs", 2);
  // Replace weights.dlrec by a copy (a new file at the same path, as an export's rename makes).
  const std::string w = tiered + "/weights.dlrec";
  fs::copy_file(w, w + ".new");
  fs::rename(w + ".new", w);
  expect_error([&] { p.predict_lines(d.lines, "logs", 3000); },
               {"weights.dlrec", "changed since this model was loaded"});
  expect_same_bits(want, p.predict_lines(few, "logs", 2), "after the refused rebuild");
}

// The model and its store name one export id: a store another export wrote over the model's
// path (an export that failed after its store, a store of another run) is refused, through
// model.json and through a serving config naming the same path. A store inside the model
// directory (which an export replaces whole) is refused at export.
TEST(PredictorStore, AStoreOfAnotherExportIsRefused) {
  REQUIRE_ROCKSDB();
  Data d;
  const std::string one = d.export_model("one", kDlrm, d.dir.path + "/db1");
  d.export_model("two", kDlrm, d.dir.path + "/db2");  // same model and seed, another export
  train::Predictor ok(one);
  fs::remove_all(d.dir.path + "/db1");
  fs::copy(d.dir.path + "/db2", d.dir.path + "/db1", fs::copy_options::recursive);
  expect_error([&] { train::Predictor p(one); }, {"written by another export", "db1"});
  const auto c = config(R"({"host": {"bytes": 4096}, "rocksdb": {"path": "db1"}})", d.dir.path);
  expect_error([&] { train::Predictor p(one, Device::cpu(), "fp32", &c); },
               {"written by another export"});
  expect_error([&] { d.export_model("three", kDlrm, d.dir.path + "/three/tables"); },
               {"is inside the model directory"});
  EXPECT_FALSE(fs::exists(d.dir.path + "/three"));
  expect_error(
      [&] {
        config(R"({"redis": {"address": "127.0.0.1:1", "key_prefix": "a{b"},
                                "rocksdb": {"path": "db1"}})",
               d.dir.path);
      },
      {"key_prefix", "'{' and '}' are not allowed"});
}
