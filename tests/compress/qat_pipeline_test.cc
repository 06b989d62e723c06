// QAT and distillation end to end on the CPU engine: a dense run, its export as the teacher,
// QAT (with 2:4 masks and distillation) resumed from the dense checkpoint, the QAT ranges in
// the checkpoint, the INT8 export serving what the QAT model computes, and the teacher whose
// data layout differs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "dlrec/compress/qat.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "test_errors.h"
#include "compress/compress_test_util.h"
#include "test_files.h"

using namespace dlrec;
namespace fs = std::filesystem;
using dlrec::testing::expect_error;

namespace {

const std::string& root() {
  static dlrec::testing::TempDir dir("qat_it");
  return dir.path;
}

std::string make_data(const std::string& dir, int num_dense, int64_t rows) {
  return dlrec::testing::make_compress_data(dir, num_dense, rows, 5);
}

json base_config() {
  return parse_json(R"({
      "model": {"arch": "dlrm", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1]},
      "optimizer": {"type": "adam", "lr": 0.01},
      "train": {"batch_size": 128, "epochs": 1, "log_every": 0}})",
                    "test config");
}

}  // namespace

TEST(QatRun, SparseQatWithDistillationExportsTheInt8ModelItTrained) {
  const std::string data = make_data(root() + "/d", 4, 6000);
  const std::string dense = root() + "/dense", teacher = root() + "/teacher";
  double dense_auc = 0;
  {
    train::TrainerOptions opt;
    opt.data_dir = data;
    opt.run_dir = dense;
    dense_auc = train::Trainer(model::RunConfig::from_json(base_config()), opt).train().eval.auc;
    train::export_model(dense, teacher);
  }
  // Fine-tune a copy of the dense run with 2:4 masks, QAT and the dense model as teacher.
  const std::string qat = root() + "/qat";
  fs::create_directories(qat);
  fs::copy_file(dense + "/checkpoint.dlrec", qat + "/checkpoint.dlrec");
  json cfg = base_config();
  cfg["train"]["epochs"] = 2;
  cfg["compress"] = {{"sparsity", {{"pattern", "2:4"}, {"skip_incompatible", true}}},
                     {"qat", {{"skip", {"top.1"}}, {"ema_decay", 0.9}}},
                     {"distill", {{"teacher", teacher}, {"alpha", 0.5}, {"temperature", 2.0}}}};
  train::TrainerOptions opt;
  opt.data_dir = data;
  opt.run_dir = qat;
  opt.resume = true;
  std::vector<float> qat_probs;
  {
    train::Trainer t(model::RunConfig::from_json(cfg), opt);
    const int64_t start = t.step();
    EXPECT_GT(start, 0);
    const train::TrainResult r = t.train();
    EXPECT_GT(t.step(), start);
    EXPECT_TRUE(std::isfinite(r.last_loss));
    EXPECT_GT(r.eval.auc, 0.55);
    EXPECT_GT(r.eval.auc, dense_auc - 0.03);  // a tiny model on 5k rows: a loose bound
    t.evaluate(&qat_probs);
  }
  // The checkpoint holds the running input ranges of the 3 QAT weights (top.1 opted out).
  const json meta = io::read_tensor_meta(qat + "/checkpoint.dlrec");
  ASSERT_TRUE(meta.contains("qat")) << meta.dump();
  EXPECT_EQ(meta.at("qat").size(), 3u);
  ASSERT_TRUE(meta.contains("masks"));

  // The export is INT8 (version 2) and serves what the QAT model computed.
  const std::string out = root() + "/qat_model";
  train::export_model(qat, out);
  EXPECT_EQ(read_json_file(out + "/model.json").at("version"), train::kModelFormatMasks);
  const json wm = io::read_tensor_meta(out + "/weights.dlrec");
  ASSERT_TRUE(wm.contains("quant")) << wm.dump();
  EXPECT_EQ(wm.at("quant").at("weights").size(), 3u);
  train::Predictor p(out);
  const io::Batch b = dlrec::testing::first_valid_batch(data);
  const std::vector<float> served = p.predict(b);
  ASSERT_LE(served.size(), qat_probs.size());
  double max_diff = 0;
  for (size_t i = 0; i < served.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(double(served[i]) - qat_probs[i]));
  EXPECT_LT(max_diff, 1e-4);

  // A teacher trained on another layout is refused, naming both layouts.
  const std::string other = make_data(root() + "/d5", 5, 1200);
  train::TrainerOptions o2;
  o2.data_dir = other;
  o2.run_dir = root() + "/bad";
  expect_error([&] { train::Trainer(model::RunConfig::from_json(cfg), o2); },
               {"compress.distill.teacher", "takes the layout", "the training data"});
}
