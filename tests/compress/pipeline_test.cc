// 2:4 pruning end to end: one-shot through `dlrec compress`, fine-tuning with fixed masks,
// checkpoints and exports carrying the masks, progressive pruning during training.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "dlrec/compress/sparsity.h"
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
  static dlrec::testing::TempDir dir("compress_it");
  return dir.path;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = root() + "/" + name;
  fs::remove_all(d);
  make_dirs(d);
  return d;
}

// Every weight of DLRM with 4 dense features and the "cat" interaction has an input size that
// is a multiple of 4: bottom [8, 4], [4, 8]; top [8, 16], [1, 8].
model::RunConfig base_config(const char* compress_section = nullptr) {
  json j = parse_json(R"({
    "model": {"embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1], "interaction": "cat"},
    "optimizer": {"type": "adam", "lr": 0.01},
    "train": {"batch_size": 128, "epochs": 1, "log_every": 0}})",
                      "test config");
  if (compress_section) j["compress"] = parse_json(compress_section, "test compress");
  return model::RunConfig::from_json(j);
}

struct World {
  std::string data, run;
};

// An ETL output and a dense trained run (built once).
const World& world() {
  static World w = [] {
    World x;
    const std::string dir = fresh_dir("world");
    x.data = dlrec::testing::make_compress_data(dir, 4, 3000, 11);
    x.run = dir + "/run";
    train::TrainerOptions opt;
    opt.data_dir = x.data;
    opt.run_dir = x.run;
    train::Trainer(base_config(), opt).train();
    return x;
  }();
  return w;
}

using dlrec::testing::dlrec_bin;
using dlrec::testing::run_cli;

std::map<std::string, std::vector<float>> copy_of(const std::vector<model::NamedTensor>& ts) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : ts)
    if (t.dtype() == DType::F32) out[name] = t.to_vector<float>();
  return out;
}

// Every prunable weight of the model has a mask with exactly 2 zeros per group of 4, and the
// weight is zero there.
void expect_2_4(model::Model& m) {
  std::map<std::string, Tensor> masks;
  for (auto& [name, t] : m.masks()) masks[name] = t;
  for (const auto& w : m.prunable_weights()) {
    ASSERT_TRUE(masks.count(w.name + ".mask")) << w.name;
    const float* mk = masks[w.name + ".mask"].data<float>();
    const float* v = w.weight.data<float>();
    for (int64_t g = 0; g < w.weight.numel(); g += 4) {
      int zeros = 0;
      for (int k = 0; k < 4; ++k) {
        zeros += mk[g + k] == 0.f;
        if (mk[g + k] == 0.f) {
          EXPECT_EQ(v[g + k], 0.f) << w.name << " value " << g + k;
        }
      }
      EXPECT_EQ(zeros, 2) << w.name << " group " << g;
    }
  }
}

}  // namespace

TEST(CompressRun, OneShotFineTuneExportAndPredict) {
  if (!file_exists(dlrec_bin()))
    GTEST_SKIP() << "the dlrec binary is not built (" << dlrec_bin() << ")";
  const World& w = world();
  const std::string out = fresh_dir("pruned") + "/run";
  std::string text;
  ASSERT_EQ(run_cli("compress --run " + w.run + " --out " + out + " --sparsity 2:4", &text), 0)
      << text;
  // The per-layer report: every weight half zeroed.
  for (const char* line : {"bottom.0.weight", "bottom.1.weight", "top.0.weight", "top.1.weight"})
    EXPECT_NE(text.find(line), std::string::npos) << text;
  EXPECT_NE(text.find("50.00%"), std::string::npos) << text;
  EXPECT_NE(text.find("2:4 pruned 100 of 200 weights"), std::string::npos) << text;
  // Refuses to overwrite, and another pattern.
  EXPECT_EQ(run_cli("compress --run " + w.run + " --out " + out, &text), 1);
  EXPECT_NE(text.find("already exists"), std::string::npos) << text;
  EXPECT_EQ(run_cli("compress --run " + w.run + " --out " + out + "x --sparsity 1:4", &text), 1);
  EXPECT_NE(text.find("only \"2:4\""), std::string::npos) << text;

  // Fine-tune 20 more steps from the pruned checkpoint: the masks hold.
  const model::RunConfig cfg = model::RunConfig::load(out + "/config.json");
  train::TrainerOptions opt;
  opt.data_dir = w.data;
  opt.run_dir = out;
  opt.resume = true;
  model::RunConfig tune = cfg;
  train::Trainer t0(tune, opt);
  const int64_t start = t0.step();
  ASSERT_GT(start, 0);
  expect_2_4(t0.model());
  const auto before = copy_of(t0.model().parameters());
  tune.train.epochs = 3;
  tune.train.max_steps = start + 20;
  train::Trainer trainer(tune, opt);
  const train::TrainResult res = trainer.train();
  EXPECT_EQ(res.steps, start + 20);
  expect_2_4(trainer.model());
  const auto after = copy_of(trainer.model().parameters());
  int64_t changed = 0;
  for (const auto& [name, v] : after)
    for (size_t k = 0; k < v.size(); ++k) changed += v[k] != before.at(name)[k];
  EXPECT_GT(changed, 0) << "fine-tuning changed nothing";

  // Checkpoint round trip into a fresh model: the same masks and weights.
  auto fresh = model::build_model(tune.model, tune.optimizer, io::DatasetInfo::load(w.data).layout,
                                  Device::cpu(), 99);
  train::load_checkpoint(out + "/checkpoint.dlrec", *fresh);
  EXPECT_EQ(copy_of(fresh->masks()), copy_of(trainer.model().masks()));
  EXPECT_EQ(copy_of(fresh->parameters()), after);

  // Export and predict: the masks travel, the predictions are the CPU engine's.
  const std::string model_dir = root() + "/pruned/model";
  train::export_model(out, model_dir);
  const json meta = io::read_tensor_meta(model_dir + "/weights.dlrec");
  EXPECT_EQ(meta.at("masks").size(), 4u);
  train::Predictor pred(model_dir);
  std::vector<float> engine;
  trainer.model().prepare_cpu_inference();  // as the Predictor's model: packed fp32 layers
  trainer.evaluate(&engine);
  io::ShardLoader loader({w.data + "/" + io::DatasetInfo::load(w.data).valid_shards[0]}, 1 << 20);
  io::Batch batch;
  ASSERT_TRUE(loader.next(batch));
  const std::vector<float> served = pred.predict(batch);
  ASSERT_LE(served.size(), engine.size());
  for (size_t k = 0; k < served.size(); ++k) EXPECT_EQ(served[k], engine[k]) << "row " << k;
}

TEST(CompressRun, OldCheckpointsWithoutMasksStillLoad) {
  const World& w = world();
  const model::RunConfig cfg = base_config();
  auto m = model::build_model(cfg.model, cfg.optimizer, io::DatasetInfo::load(w.data).layout,
                              Device::cpu(), 5);
  train::load_checkpoint(w.run + "/checkpoint.dlrec", *m);
  EXPECT_TRUE(m->masks().empty());
}

TEST(CompressRun, ACheckpointMaskThatIsNotZeroOrOneIsRefused) {
  const World& w = world();
  const model::RunConfig cfg = base_config();
  const io::ShardLayout layout = io::DatasetInfo::load(w.data).layout;
  auto m = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 5);
  const auto pw = m->prunable_weights();
  Tensor mask = Tensor::empty(pw[0].weight.shape(), DType::F32, Device::cpu());
  for (int64_t k = 0; k < mask.numel(); ++k) mask.data<float>()[k] = 1.f;
  m->set_mask(pw[0].name, mask);
  mask.data<float>()[3] = 0.5f;
  const std::string path = fresh_dir("badmask") + "/checkpoint.dlrec";
  train::save_checkpoint(path, *m, cfg, layout, {});
  auto again = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 5);
  expect_error([&] { train::load_checkpoint(path, *again); },
               {path, "bottom.0.weight.mask", "element 3", "only 0 and 1"});
}

TEST(CompressRun, ProgressivePruningReachesHalfAndStaysThere) {
  const World& w = world();
  const model::RunConfig cfg =
      base_config(R"({"sparsity": {"schedule": {"start_step": 2, "end_step": 12, "every": 2}}})");
  train::TrainerOptions opt;
  opt.data_dir = w.data;
  auto sparsity = [](model::Model& m) {
    int64_t zeros = 0, total = 0;
    for (auto& [name, t] : m.masks()) {
      for (float x : t.to_vector<float>()) zeros += x == 0.f;
      total += t.numel();
    }
    return total ? static_cast<double>(zeros) / total : 0.0;
  };
  {
    opt.stop_after_steps = 6;  // masks updated before steps 2 and 4: mid-ramp
    train::Trainer t(cfg, opt);
    t.train();
    const double s = sparsity(t.model());
    EXPECT_GT(s, 0.1);
    EXPECT_LT(s, 0.45);
  }
  opt.stop_after_steps = -1;
  model::RunConfig full = cfg;
  full.train.max_steps = 18;
  train::Trainer t(full, opt);
  t.train();
  EXPECT_EQ(sparsity(t.model()), 0.5);
  expect_2_4(t.model());
}
