// The MLPerf DLRM-DCNv2 multi-hot schema of `dlrec datagen` (issue 19): the generated file has
// the benchmark's hotness per column and ids within its cardinalities, the CLI writes it and its
// schema, bad hotness settings are clear errors, and the DCNv2 config trains on it (CPU, small).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "cli_test_util.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/synthetic_batch.h"
#include "dlrec/io/text_reader.h"
#include "dlrec/train/trainer.h"
#include "etl_test_util.h"

using namespace dlrec;
namespace fs = std::filesystem;
using ::testing::HasSubstr;

namespace {

std::string work_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "dlrec_dcnv2_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  make_dirs(d);
  return d;
}

// Removes the directory when the test ends, passing or not.
struct DirGuard {
  std::string dir;
  ~DirGuard() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

io::RawChunk read_back(const std::string& path, const io::Schema& schema) {
  io::TextReader reader({path}, schema);
  io::RawChunk all, chunk;
  all.reset(schema.num_dense(), schema.num_cat());
  while (reader.next(chunk)) all.append(chunk);
  return all;
}

int run_cli(const std::string& args, std::string* output) {
  return dlrec::testing::run_dlrec(args, output);
}

std::string datagen_error(const char* json_text) {
  try {
    io::DatagenConfig c = io::DatagenConfig::from_json(json::parse(json_text));
    std::ostringstream os;
    io::generate(c, os);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(MlperfDcnv2, DatagenWritesTheBenchmarksHotnessAndCardinalities) {
  const std::vector<int64_t>& cards = io::mlperf_dcnv2_cardinalities();
  const std::vector<int>& hot = io::mlperf_dcnv2_hotness();
  ASSERT_EQ(cards.size(), 26u);
  ASSERT_EQ(hot.size(), 26u);
  int64_t rows_total = 0, ids_per_row = 0;
  for (size_t t = 0; t < cards.size(); ++t) {
    rows_total += cards[t];
    ids_per_row += hot[t];
  }
  EXPECT_EQ(rows_total, 204184588);  // the issue's "204M rows"
  EXPECT_EQ(ids_per_row, 214);
  EXPECT_EQ(hot[20], 100);
  EXPECT_EQ(cards[20], 40000000);

  io::DatagenConfig c = io::DatagenConfig::mlperf_dcnv2();
  c.rows = 3000;
  const io::Schema s = c.schema();
  ASSERT_EQ(s.num_dense(), 13);
  ASSERT_EQ(s.num_cat(), 26);
  for (int t = 0; t < 26; ++t) EXPECT_EQ(s.cat_multi_hot()[t], hot[t] > 1) << "column " << t;
  DirGuard g{work_dir("gen")};
  io::generate_file(c, g.dir + "/d.tsv");
  const io::RawChunk ch = read_back(g.dir + "/d.tsv", s);
  ASSERT_EQ(ch.rows, c.rows);
  for (int t = 0; t < 26; ++t) {
    std::set<uint64_t> distinct;
    for (int64_t r = 0; r < ch.rows; ++r) {
      const int64_t len = ch.cat_offsets[t][r + 1] - ch.cat_offsets[t][r];
      ASSERT_EQ(len, hot[t]) << "column " << t << " row " << r;  // fixed, never missing
      for (int64_t o = ch.cat_offsets[t][r]; o < ch.cat_offsets[t][r + 1]; ++o)
        distinct.insert(ch.cat_values[t][o]);
    }
    EXPECT_LE(static_cast<int64_t>(distinct.size()), cards[t]) << "column " << t;
    // The small columns show every value (3000+ power-law draws over at most 63).
    if (cards[t] <= 63)
      EXPECT_EQ(static_cast<int64_t>(distinct.size()), cards[t]) << "column " << t;
    // A power law: the huge columns repeat their frequent ids (far fewer distinct than draws).
    if (cards[t] == 40000000)
      EXPECT_LT(static_cast<double>(distinct.size()), 0.8 * ch.rows * hot[t]) << "column " << t;
  }
}

TEST(MlperfDcnv2, HotnessConfigErrors) {
  EXPECT_THAT(datagen_error(R"({"num_cat": 2, "hotness": [1, 2, 3]})"),
              HasSubstr("hotness has 3 values for 2 categorical columns"));
  EXPECT_THAT(datagen_error(R"({"num_cat": 2, "hotness": [1, 0]})"), HasSubstr("hotness"));
  EXPECT_THAT(datagen_error(R"({"num_cat": 2, "hotness": [1, 5000]})"), HasSubstr("[1, 1024]"));
  EXPECT_THAT(datagen_error(R"({"num_cat": 2, "hotness": "3"})"), HasSubstr("array"));
  EXPECT_THAT(datagen_error(R"({"num_cat": 2, "hotness": [1, 2], "num_multi_hot": 1})"),
              HasSubstr("hotness and num_multi_hot both given"));
  // A JSON round trip keeps the hotness.
  io::DatagenConfig c = io::DatagenConfig::mlperf_dcnv2();
  EXPECT_EQ(io::DatagenConfig::from_json(c.to_json()).hotness, c.hotness);
}

TEST(MlperfDcnv2, CliWritesDataAndSchema) {
  DirGuard g{work_dir("cli")};
  std::string out;
  ASSERT_EQ(run_cli("datagen --schema mlperf_dcnv2 --rows 200 --seed 3 --out " + g.dir +
                        "/d.tsv --schema-out " + g.dir + "/schema.json",
                    &out),
            0)
      << out;
  const io::Schema s = io::Schema::from_json(read_json_file(g.dir + "/schema.json"));
  EXPECT_EQ(s.cat_multi_hot(), io::DatagenConfig::mlperf_dcnv2().schema().cat_multi_hot());
  EXPECT_EQ(read_back(g.dir + "/d.tsv", s).rows, 200);
  // Its columns are fixed: options that would change them are refused.
  EXPECT_NE(
      run_cli("datagen --schema mlperf_dcnv2 --rows 10 --multi-hot 2 --out " + g.dir + "/x.tsv",
              &out),
      0);
  EXPECT_THAT(out, HasSubstr("--schema mlperf_dcnv2 takes --rows, --seed and --schema-out"));
  EXPECT_FALSE(file_exists(g.dir + "/x.tsv"));
}

// configs/mlperf_dcnv2_multihot.json's model (low-rank cross layers, Adagrad) trains on the
// schema's data after the ETL: on the CPU, fp32, unsharded, a few hundred rows (the model's
// 16M dense parameters make each row cost ~20 ms on a 2-core CI machine).
TEST(MlperfDcnv2, ConfigTrainsOnTheSchemasData) {
  DirGuard g{work_dir("train")};
  io::DatagenConfig gen = io::DatagenConfig::mlperf_dcnv2();
  gen.rows = 400;
  gen.seed = 7;
  dlrec::testing::TestEtl etl;
  etl.workflow = R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]})";
  etl.train_rows = 300;
  const std::string data = g.dir + "/data";
  dlrec::testing::generate_and_etl(gen, g.dir + "/logs.tsv", data, etl);
  const io::DatasetInfo info = io::DatasetInfo::load(data);
  for (int t = 0; t < 26; ++t)
    EXPECT_EQ(info.layout.multi_hot[t], io::mlperf_dcnv2_hotness()[t] > 1) << "table " << t;

  model::RunConfig cfg =
      model::RunConfig::load(std::string(DLREC_SOURCE_DIR) + "/configs/mlperf_dcnv2_multihot.json");
  ASSERT_EQ(cfg.optimizer.type, "adagrad");
  cfg.sharding = json();  // one process: no plan
  cfg.override_train(
      json::parse(R"({"device": "cpu", "precision": "fp32", "batch_size": 100, "epochs": 1})"));
  cfg.train.log_every = 1;
  train::TrainerOptions opt;
  opt.data_dir = data;
  opt.run_dir = g.dir + "/run";
  train::Trainer t(cfg, opt);
  const train::TrainResult r = t.train();
  EXPECT_EQ(r.steps, 3);
  EXPECT_EQ(r.eval.rows, 100);
  ASSERT_FALSE(r.logged_losses.empty());
  for (const auto& [step, loss] : r.logged_losses) EXPECT_TRUE(std::isfinite(loss)) << step;
  EXPECT_TRUE(std::isfinite(r.eval.logloss));
  EXPECT_GT(r.eval.logloss, 0);
  EXPECT_TRUE(file_exists(opt.run_dir + "/checkpoint.dlrec"));
}

// `bench train|infer --cardinalities mlperf_dcnv2 --max-rows 5000`'s batches: the built-in
// layout (io::builtin_layout) caps the tables and marks the multi-hot ones; every row has the
// fixed hotness of each table, ids inside the table; a hotness list that does not fit the layout
// and an unknown built-in name are clear errors.
TEST(MlperfDcnv2, RandomBatchHasTheFixedHotness) {
  std::vector<int> hot;
  const io::ShardLayout l = io::builtin_layout("mlperf_dcnv2", 5000, hot);
  ASSERT_EQ(hot, io::mlperf_dcnv2_hotness());
  ASSERT_EQ(l.num_dense, 13);
  ASSERT_EQ(l.cardinalities.size(), 26u);
  for (size_t t = 0; t < hot.size(); ++t) {
    EXPECT_EQ(l.cardinalities[t], std::min<int64_t>(io::mlperf_dcnv2_cardinalities()[t], 5000));
    EXPECT_EQ(l.multi_hot[t], hot[t] > 1) << "table " << t;
  }
  std::vector<int> none = {7};
  const io::ShardLayout k = io::builtin_layout("kaggle", -1, none);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(k.cardinalities, io::criteo_kaggle_cardinalities());
  EXPECT_THAT(
      [&] {
        try {
          io::builtin_layout("criteo", -1, none);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string("(no error)");
      }(),
      HasSubstr("unknown built-in tables 'criteo' (kaggle, criteo_1tb or mlperf_dcnv2)"));
  const io::Batch b = io::random_batch(l, 300, /*zipf=*/true, 9, hot);
  ASSERT_EQ(b.rows, 300);
  ASSERT_EQ(b.num_cat(), 26);
  for (int t = 0; t < 26; ++t) {
    ASSERT_EQ(b.cat_indices[t].size(), static_cast<size_t>(300 * hot[t])) << "table " << t;
    for (int64_t r = 0; r <= 300; ++r) ASSERT_EQ(b.cat_offsets[t][r], r * hot[t]);
    for (int64_t id : b.cat_indices[t]) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, l.cardinalities[t]);
    }
  }
  auto err = [&](const io::ShardLayout& layout, const std::vector<int>& h) {
    try {
      io::random_batch(layout, 4, false, 1, h);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_THAT(err(l, {1, 2}), HasSubstr("2 hotness values for 26 categorical features"));
  io::ShardLayout one_hot = l;
  one_hot.multi_hot.assign(26, false);
  EXPECT_THAT(err(one_hot, hot), HasSubstr("feature 0 has hotness 3"));
  std::vector<int> zero = hot;
  zero[5] = 0;
  EXPECT_THAT(err(l, zero), HasSubstr("feature 5 has hotness 0"));
}
