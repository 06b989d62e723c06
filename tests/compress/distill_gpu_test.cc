// Distillation on one GPU (the CUDA graph engine, fp32): a dense CPU run exported as the
// teacher, then the same fine-tune (resumed from the dense checkpoint, masks and the
// distillation loss) on the CPU and on the GPU; the two runs end with the same masks and weights
// within fp32 summation order, every pruned weight zero. And the GPU's distillation step (the
// loss kernel inside the captured step) against the CPU's host loss, step by step. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "compress/compress_test_util.h"
#include "dlrec/compress/qat.h"
#include "dlrec/core/device.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "model/test_batches.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
namespace fs = std::filesystem;

namespace {

json base_config() {
  return parse_json(R"({
      "model": {"arch": "dcnv2", "embedding_dim": 8, "bottom_mlp": [16, 8],
                "top_mlp": [16, 8, 1], "cross_layers": 2, "cross_low_rank": 8},
      "optimizer": {"type": "sgd", "lr": 0.1},
      "train": {"batch_size": 128, "epochs": 1, "log_every": 0}})",
                    "test config");
}

std::map<std::string, std::vector<float>> tensors(model::Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : m.parameters()) out[name] = t.to(Device::cpu()).to_vector<float>();
  for (auto& [name, t] : m.masks()) out[name] = t.to(Device::cpu()).to_vector<float>();
  return out;
}

}  // namespace

TEST(GpuDistill, SparseDistillationOnTheGpuFollowsTheCpuRun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU distillation not run";
  dlrec::testing::TempDir dir("distill_gpu");
  const std::string data = dlrec::testing::make_compress_data(dir.path + "/d", 4, 6000, 5);
  const std::string dense = dir.path + "/dense", teacher = dir.path + "/teacher";
  {
    train::TrainerOptions opt;
    opt.data_dir = data;
    opt.run_dir = dense;
    train::Trainer(model::RunConfig::from_json(base_config()), opt).train();
    train::export_model(dense, teacher);
  }
  json cfg = base_config();
  cfg["train"]["epochs"] = 2;
  cfg["compress"] = {{"sparsity", {{"pattern", "2:4"}, {"skip_incompatible", true}}},
                     {"distill", {{"teacher", teacher}, {"alpha", 0.5}, {"temperature", 2.0}}}};
  std::map<std::string, std::map<std::string, std::vector<float>>> end;
  std::map<std::string, double> auc;
  for (const char* device : {"cpu", "cuda:0"}) {
    const std::string run = dir.path + (std::string(device) == "cpu" ? "/run_cpu" : "/run_gpu");
    fs::create_directories(run);
    fs::copy_file(dense + "/checkpoint.dlrec", run + "/checkpoint.dlrec");
    json c = cfg;
    c["train"]["device"] = device;
    train::TrainerOptions opt;
    opt.data_dir = data;
    opt.run_dir = run;
    opt.resume = true;
    train::Trainer t(model::RunConfig::from_json(c), opt);
    const int64_t start = t.step();
    const train::TrainResult r = t.train();
    EXPECT_GT(t.step(), start) << device;
    EXPECT_TRUE(std::isfinite(r.last_loss)) << device;
    auc[device] = r.eval.auc;
    end[device] = tensors(t.model());
  }
  const auto& c = end["cpu"];
  const auto& g = end["cuda:0"];
  ASSERT_EQ(c.size(), g.size());
  double worst = 0;
  std::string at;
  int64_t masks = 0;
  for (const auto& [name, v] : c) {
    ASSERT_TRUE(g.count(name)) << name;
    const std::vector<float>& w = g.at(name);
    ASSERT_EQ(v.size(), w.size()) << name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".mask") == 0) {
      ++masks;
      EXPECT_EQ(v, w) << name << ": the masks differ";
      const std::vector<float>& gw = g.at(name.substr(0, name.size() - 5));
      for (size_t k = 0; k < w.size(); ++k)
        ASSERT_TRUE(w[k] != 0.f || gw[k] == 0.f) << name << " value " << k << " not zero";
      continue;
    }
    for (size_t k = 0; k < v.size(); ++k)
      if (std::fabs(double(w[k]) - v[k]) > worst) worst = std::fabs(double(w[k]) - v[k]), at = name;
  }
  EXPECT_GT(masks, 0);
  std::printf("[gpu distill] max |w_gpu - w_cpu| %.2e (%s); AUC cpu %.5f gpu %.5f\n", worst,
              at.c_str(), auc["cpu"], auc["cuda:0"]);
  EXPECT_LT(worst, 1e-3) << at;
  EXPECT_NEAR(auc["cpu"], auc["cuda:0"], 2e-3);
}

// The CUDA engine's distillation step (Model::train_step_distill: the loss kernel in the
// captured step) against the CPU engine's forward, compress::distill_loss on the host and
// backward_and_update: the same weights after distillation steps (captured from the second
// on), then BCE steps (the captured distillation steps dropped), then distillation with
// another temperature; bad arguments are clear errors.
TEST(GpuDistill, StepInTheGraphFollowsTheHostLoss) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU distillation not run";
  const io::ShardLayout layout = model::testing::make_layout(5, {40, 300, 9});
  const json mj = base_config();
  const model::RunConfig cfg = model::RunConfig::from_json(json{{"model", mj["model"]},
                                                                {"optimizer", mj["optimizer"]}});
  auto cpu = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 21);
  auto gpu = model::build_model(cfg.model, cfg.optimizer, layout, Device::cuda(0), 21, "fp32");
  ASSERT_TRUE(gpu->distills_in_step());
  EXPECT_FALSE(cpu->distills_in_step());
  double worst_loss = 0;
  for (int step = 0; step < 9; ++step) {
    const io::Batch b = model::testing::make_batch(layout, 64, 300 + step, false);
    const bool bce = step >= 3 && step < 6;
    const double T = step < 6 ? 2.0 : 0.7;
    std::vector<float> t(64);
    for (int i = 0; i < 64; ++i) t[i] = static_cast<float>(std::sin(step * 64 + i) * 3);
    Tensor z = cpu->forward(b, true);
    Tensor dl = Tensor::empty(z.shape(), DType::F32);
    double lc = 0, lg = 0;
    if (bce) {
      lc = nn::bce_with_logits(z, b.labels.data(), &dl);
      lg = gpu->train_step(b, 1.0, true);
    } else {
      lc = compress::distill_loss(z.data<float>(), b.labels.data(), t.data(), 64, 0.3, T,
                                  dl.data<float>());
      lg = gpu->train_step_distill(b, t.data(), 0.3, T, 1.0, true);
    }
    cpu->backward_and_update(dl, 1.0);
    worst_loss = std::max(worst_loss, std::fabs(lg - lc) / std::fabs(lc));
  }
  const auto c = tensors(*cpu), g = tensors(*gpu);
  double worst = 0;
  for (const auto& [name, v] : c)
    for (size_t k = 0; k < v.size(); ++k)
      worst = std::max(worst, std::fabs(double(g.at(name)[k]) - v[k]));
  std::printf("[gpu distill] in-step loss: max rel loss diff %.2e, max |w_gpu - w_cpu| %.2e\n",
              worst_loss, worst);
  EXPECT_LT(worst_loss, 1e-5);
  EXPECT_LT(worst, 1e-4);
  const io::Batch b = model::testing::make_batch(layout, 8, 1, false);
  const std::vector<float> t(8, 0.f);
  dlrec::testing::expect_error([&] { gpu->train_step_distill(b, t.data(), 1.5, 1.0, 1.0, false); },
                               {"alpha 1.5", "[0, 1]"});
  dlrec::testing::expect_error([&] { gpu->train_step_distill(b, t.data(), 0.5, 0.0, 1.0, false); },
                               {"temperature 0"});
}
