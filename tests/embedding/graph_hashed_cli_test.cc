// Hashed tables in a graph model through the whole pipeline: ETL emitting raw hashed ids
// (configs/etl_criteo_raw_ids.json), `dlrec train` with configs/dlrm_hashed.json, checkpoints
// (an interrupted run resumed equals an uninterrupted one), export and the Predictor (the same
// probabilities, bit for bit, as the trained model), and a checkpoint of another capacity
// refused with the tensor's name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "dlrec/etl/workflow.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/text_reader.h"
#include "dlrec/model/model.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"

namespace dlrec {
namespace {

namespace fs = std::filesystem;

class GraphHashedCli : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = std::string(DLREC_BIN_DIR) + "/dlrec";
    if (!fs::exists(bin_)) GTEST_SKIP() << bin_ << " not built";
    bin_ += " --quiet";  // no progress lines in the outputs the tests compare
    dir_ =
        (fs::temp_directory_path() / ("dlrec_hashed_cli_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    run(bin_ + " datagen --rows 4000 --seed 5 --out " + dir_ + "/logs.tsv");
    run(bin_ + " etl --input " + dir_ + "/logs.tsv --workflow " +
        src("configs/etl_criteo_raw_ids.json") + " --valid-ratio 0.2 --out " + dir_ + "/data");
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  static std::string src(const std::string& rel) {
    return std::string(DLREC_SOURCE_DIR) + "/" + rel;
  }
  std::string run(const std::string& cmd, bool ok = true) {
    const std::string full = cmd + " > " + dir_ + "/out.txt 2>&1";
    const int rc = std::system(full.c_str());
    std::ifstream in(dir_ + "/out.txt");
    std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (ok)
      EXPECT_EQ(rc, 0) << cmd << "\n" << out;
    else
      EXPECT_NE(rc, 0) << cmd << "\n" << out;
    return out;
  }
  // configs/dlrm_hashed.json with a small capacity (evictions on 3,200 training rows).
  model::RunConfig config(int64_t capacity, int64_t max_steps) {
    model::RunConfig c = model::RunConfig::load(src("configs/dlrm_hashed.json"));
    c.model.layers[2]["hashed"]["capacity"] = capacity;
    c.train.batch_size = 100;
    c.train.max_steps = max_steps;
    c.train.log_every = 8;
    return c;
  }
  std::string train(const model::RunConfig& c, const std::string& name, bool resume = false) {
    std::ofstream(dir_ + "/" + name + ".json") << c.to_json().dump(2);
    return run(bin_ + " train --config " + dir_ + "/" + name + ".json --data " + dir_ +
               "/data --run " + dir_ + "/" + name + (resume ? " --resume" : ""));
  }
  std::string bin_, dir_;
};

std::string last_auc(const std::string& out) {
  const size_t at = out.rfind("AUC=");
  return at == std::string::npos ? std::string("none") : out.substr(at, 12);
}

TEST_F(GraphHashedCli, TrainResumeExportPredict) {
  // The ETL output declares ids far beyond any table: only hashed tables can take them.
  const io::DatasetInfo data = io::DatasetInfo::load(dir_ + "/data");
  EXPECT_EQ(data.layout.cardinalities.at(0), int64_t{2305843009213693951} + 1);

  const std::string whole = train(config(300, 24), "whole");
  EXPECT_NE(last_auc(whole), "none") << whole;
  // The counters reach the training log.
  EXPECT_NE(whole.find("[hashed] emb.0: "), std::string::npos) << whole;
  EXPECT_NE(whole.find(" evictions"), std::string::npos) << whole;

  // Interrupted at step 12 and resumed: the same final model as the uninterrupted run.
  train(config(300, 12), "split");
  const std::string resumed = train(config(300, 24), "split", /*resume=*/true);
  EXPECT_EQ(last_auc(whole), last_auc(resumed)) << whole << "\n---\n" << resumed;
  // The eval lines agree except for the elapsed time each prints, e.g. "(0.1s)".
  const std::regex elapsed(R"(\([0-9.]+s\))");
  EXPECT_EQ(std::regex_replace(run(bin_ + " eval --run " + dir_ + "/whole"), elapsed, "(t)"),
            std::regex_replace(run(bin_ + " eval --run " + dir_ + "/split"), elapsed, "(t)"));

  // Export, then the Predictor scores raw rows exactly as the trained model does.
  run(bin_ + " export --run " + dir_ + "/whole --out " + dir_ + "/model");
  model::RunConfig c = config(300, 24);
  auto m = model::build_model(c.model, c.optimizer, data.layout, Device::cpu(), c.train.seed);
  train::load_checkpoint(dir_ + "/whole/checkpoint.dlrec", *m);
  etl::Workflow wf = etl::Workflow::load(dir_ + "/data/workflow.json");
  std::ifstream in(dir_ + "/logs.tsv");
  std::vector<std::string> lines;
  for (std::string l; lines.size() < 500 && std::getline(in, l);) lines.push_back(l);
  train::Predictor p(dir_ + "/model");
  const std::vector<float> served = p.predict_lines(lines, "logs.tsv", 128);
  ASSERT_EQ(served.size(), lines.size());
  io::RawChunk chunk;
  chunk.reset(wf.schema().num_dense(), wf.schema().num_cat());
  const std::vector<int> mapping = io::field_mapping(wf.schema(), "", "logs.tsv");
  for (const auto& l : lines)
    io::parse_line(l.data(), l.data() + l.size(), wf.schema(), mapping, chunk, "logs.tsv");
  io::Batch b;
  wf.transform(chunk, b);
  // Prepared for serving as the Predictor prepares its model (Model::prepare_cpu_inference: its
  // fp32 layers on packed weights), and in the Predictor's batches of 128 rows: where the CPU
  // lacks AVX2, OpenBLAS serves, and it may sum a row's products in another order at another
  // batch size (on AMD EPYC it does).
  m->prepare_cpu_inference();
  std::vector<float> logits;
  for (int64_t r0 = 0; r0 < b.rows; r0 += 128) {
    io::Batch part;
    part.reset(b.num_dense, b.num_cat());
    part.append_rows(b, r0, std::min<int64_t>(r0 + 128, b.rows));
    const std::vector<float> l = m->forward(part, false).to_vector<float>();
    logits.insert(logits.end(), l.begin(), l.end());
  }
  ASSERT_EQ(logits.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(served[i], 1.f / (1.f + std::exp(-logits[i]))) << "row " << i;
  }
  // Some served rows have keys the table evicted or never saw: they pool as zeros, the same
  // on both sides (checked above); the predictions are not all equal.
  float lo = served[0], hi = served[0];
  for (float v : served) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_LT(lo, hi);

  // A checkpoint written with another capacity is refused, naming the tensor.
  train(config(200, 4), "small");
  auto big = model::build_model(c.model, c.optimizer, data.layout, Device::cpu(), c.train.seed);
  try {
    train::load_checkpoint(dir_ + "/small/checkpoint.dlrec", *big);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("emb.0."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[200"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dlrec
