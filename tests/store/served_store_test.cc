// The served model through the tiered store: a repository model whose config.json has an
// "embedding_store" section answers exactly what the all-in-memory model answers; a bad section
// is a clear load error. (Built with the inference server only.)
#ifdef DLREC_WITH_SERVER
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/serve/model_repository.h"
#include "dlrec/serve/stats.h"
#include "dlrec/train/export.h"
#include "dlrec/train/onnx_export.h"
#include "store/store_helpers.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::request_of;
using dlrec::testing::TempDir;
namespace fs = std::filesystem;

TEST(ServedStore, ConfigJsonStoreAnswersLikeTheModelInMemory) {
  if (!store::rocksdb_available()) GTEST_SKIP() << "this build has no RocksDB tier";
  TempDir dir("served_store");
  io::DatagenConfig gen;
  gen.rows = 1500;
  gen.num_dense = 2;
  gen.num_cat = 3;
  gen.cardinalities = {30, 400};
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
  make_dirs(dir.path + "/repo/m");
  train::TierExport tiers;
  tiers.add("rocksdb=" + dir.path + "/repo/m/tables");
  train::export_initialized(cfg, o.output_dir, dir.path + "/repo/m/1", 5, false,
                            train::OnnxExport::None, tiers);
  train::export_initialized(cfg, o.output_dir, dir.path + "/full", 5);
  dlrec::testing::write_file(dir.path + "/repo/m", "config.json",
                             R"({"embedding_store": {"host": {"bytes": 3000, "shards": 2},
                                 "rocksdb": {"path": "tables"}}})");
  train::Predictor reference(dir.path + "/full");
  std::vector<std::string> lines;
  {
    std::ifstream f(dir.path + "/logs.tsv");
    for (std::string l; std::getline(f, l) && lines.size() < 700;) lines.push_back(l);
  }
  const io::Batch batch = train::encode_lines(reference.workflow(), lines, "logs");
  const std::vector<float> want = reference.predict(batch);

  auto stats = std::make_shared<serve::StatsRegistry>();
  serve::ModelRepository repo(dir.path + "/repo", serve::BatchingConfig(), stats);
  repo.load("m");
  auto served = repo.get("m", "");
  for (int pass = 0; pass < 2; ++pass) {
    const serve::InferResponse r = served->infer(request_of(batch));
    ASSERT_EQ(r.probability.size(), want.size());
    EXPECT_EQ(std::memcmp(r.probability.data(), want.data(), want.size() * 4), 0)
        << "pass " << pass;
  }
  // The tiers' counters on the metrics endpoint: every row came from RocksDB once at most.
  const std::string metrics = stats->prometheus();
  for (const char* part : {"# TYPE dlrec_embedding_store_hits counter",
                           "dlrec_embedding_store_hits{model=\"m\",version=\"1\",tier=\"host\"}",
                           "dlrec_embedding_store_misses{model=\"m\",version=\"1\",tier=\"rocksdb\"} 0",
                           "dlrec_embedding_store_evictions{model=\"m\",version=\"1\",tier=\"host\"}",
                           "# TYPE dlrec_embedding_store_bytes gauge"})
    EXPECT_NE(metrics.find(part), std::string::npos) << part << " not in:\n" << metrics;
  // The model statistics' hit rates: per tier, the instances' hits and misses.
  const auto hm = stats->list("m", "1").at(0)->store_hits_misses();
  ASSERT_EQ(hm.count("host"), 1u);
  EXPECT_GT(hm.at("host").first + hm.at("host").second, 0);
  EXPECT_EQ(hm.at("rocksdb").first, hm.at("host").second);  // the host's misses went down
  EXPECT_EQ(hm.at("rocksdb").second, 0);
  // A bad section: the load fails naming the key.
  dlrec::testing::write_file(dir.path + "/repo/m", "config.json",
                             R"({"embedding_store": {"host": {"bytes": 3000}}})");
  dlrec::testing::expect_error([&] { repo.load("m"); },
                               {"model 'm': config.json", "\"rocksdb\" is required"});
}
#endif
