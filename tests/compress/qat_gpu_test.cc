// Quantization-aware training on the CUDA graph engine (src/model/graph_cuda_compress.cu,
// nn/qat_cuda.h): the same records, batches and steps as on the CPU engine (the reference,
// src/compress/qat.cc) give the same running input ranges, logits and weights within the
// engines' summation order (fp32) or 16-bit rounding (bf16, and fp16 with its loss scaling
// around the gated gradients); the ranges travel through checkpoints to either engine; a
// non-QAT record and a diverged weight are clear errors; and the trainer's Sparse-QAT fine-tune
// with distillation on the GPU follows the same run on the CPU. Skips without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
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

io::ShardLayout layout() { return model::testing::make_layout(5, {40, 300, 9}); }

json model_json() {
  return parse_json(R"({
    "model": {"arch": "dcnv2", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 8, 1],
              "cross_layers": 2, "cross_low_rank": 8},
    "optimizer": {"type": "sgd", "lr": 0.1}})",
                    "test config");
}

compress::QatConfig qat(double decay) {
  compress::QatConfig c;
  c.on = true;
  c.select.on = true;
  c.ema_decay = decay;
  return c;
}

std::map<std::string, double> ranges(model::Model& m) {
  std::map<std::string, double> out;
  for (const auto& w : m.prunable_weights())
    if (w.param && w.param->quant) out[w.name] = w.param->quant->qat_range().amax;
  return out;
}

std::map<std::string, std::vector<float>> params(model::Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : m.parameters()) out[name] = t.to(Device::cpu()).to_vector<float>();
  return out;
}

double worst_diff(const std::map<std::string, std::vector<float>>& a,
                  const std::map<std::string, std::vector<float>>& b, std::string* at) {
  double worst = 0;
  for (const auto& [name, v] : a) {
    const std::vector<float>& w = b.at(name);
    EXPECT_EQ(v.size(), w.size()) << name;
    for (size_t k = 0; k < v.size() && k < w.size(); ++k)
      if (std::fabs(double(w[k]) - v[k]) > worst) {
        worst = std::fabs(double(w[k]) - v[k]);
        *at = name;
      }
  }
  return worst;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to(Device::cpu()).to_vector<float>(), y = b.to(Device::cpu()).to_vector<float>();
  EXPECT_EQ(x.size(), y.size());
  double d = 0;
  for (size_t k = 0; k < x.size() && k < y.size(); ++k)
    d = std::max(d, std::fabs(double(x[k]) - y[k]));
  return d;
}

}  // namespace

TEST(GpuQat, StepsFollowTheCpuQat) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU QAT not run";
  const model::RunConfig cfg = model::RunConfig::from_json(model_json());
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    const bool fp32 = std::string(precision) == "fp32";
    auto cpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cpu(), 21);
    auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21,
                                  precision);
    auto plain = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21,
                                    precision);  // the same GPU model without QAT
    const int64_t n = compress::install_qat(qat(0.9), *cpu);
    EXPECT_EQ(compress::install_qat(qat(0.9), *gpu), n);
    EXPECT_GT(n, 4);
    // Before any step each forward takes its own batch's range.
    const io::Batch b0 = model::testing::make_batch(layout(), 64, 600, false);
    const Tensor zc = cpu->forward(b0, false), zg = gpu->forward(b0, false);
    const double d_first = max_abs_diff(zg, zc);
    EXPECT_LT(d_first, fp32 ? 1e-4 : 5e-2);
    // An evaluation forward leaves the ranges unset, as on the CPU.
    for (const auto& [name, a] : ranges(*gpu)) EXPECT_EQ(a, -1.0) << name;
    for (int step = 0; step < 8; ++step) {
      const io::Batch b = model::testing::make_batch(layout(), 64, 700 + step, false);
      Tensor dl;
      nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
      cpu->backward_and_update(dl, 1.0);
      gpu->train_step(b, 1.0, false);
      plain->train_step(b, 1.0, false);
    }
    const auto rc = ranges(*cpu), rg = ranges(*gpu);
    ASSERT_EQ(rc.size(), static_cast<size_t>(n));
    ASSERT_EQ(rg.size(), rc.size());
    double worst_range = 0;
    for (const auto& [name, a] : rc) {
      ASSERT_GT(a, 0) << name;
      worst_range = std::max(worst_range, std::fabs(rg.at(name) - a) / a);
    }
    EXPECT_LT(worst_range, fp32 ? 1e-5 : 3e-2);
    std::string at;
    const double dw = worst_diff(params(*cpu), params(*gpu), &at);
    EXPECT_LT(dw, fp32 ? 1e-4 : 5e-2) << at;
    const io::Batch b1 = model::testing::make_batch(layout(), 256, 800, false);
    const double d_qat = max_abs_diff(gpu->forward(b1, false), cpu->forward(b1, false));
    const double d_plain = max_abs_diff(plain->forward(b1, false), cpu->forward(b1, false));
    EXPECT_LT(d_qat, fp32 ? 1e-4 : 5e-2);
    // The GPU's QAT is not the fp32 model: without it the logits are farther from the CPU's
    // (in fp32, where the engines agree to rounding; bf16's own rounding is of QAT's size).
    if (fp32) {
      EXPECT_GT(d_plain, 100 * d_qat);
    }
    std::printf("[gpu qat] %s: first logits |dz| %.2e; after 8 steps: ranges rel %.2e, weights "
                "%.2e (%s), logits %.2e (fp32 model's %.2e)\n",
                precision, d_first, worst_range, dw, at.c_str(), d_qat, d_plain);
  }
}

TEST(GpuQat, RangesTravelThroughACheckpoint) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU QAT not run";
  const model::RunConfig cfg = model::RunConfig::from_json(model_json());
  auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21, "bf16");
  compress::install_qat(qat(0.5), *gpu);
  for (int step = 0; step < 3; ++step)
    gpu->train_step(model::testing::make_batch(layout(), 64, 40 + step, false), 1.0, false);
  const auto want = ranges(*gpu);
  const std::string path =
      ::testing::TempDir() + "gpu_qat_" + std::to_string(::getpid()) + ".dlrec";
  train::save_checkpoint(path, *gpu, cfg, layout(), {});
  for (const Device dev : {Device::cuda(0), Device::cpu()}) {
    SCOPED_TRACE(dev.str());
    auto fresh = model::build_model(cfg.model, cfg.optimizer, layout(), dev, 99,
                                    dev.is_cuda() ? "bf16" : "fp32");
    train::load_checkpoint(path, *fresh);
    const auto got = ranges(*fresh);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, a] : want) {
      ASSERT_GT(a, 0) << name;
      EXPECT_EQ(got.at(name), static_cast<double>(static_cast<float>(a))) << name;  // F32 on file
    }
    // The loaded records train on: one step moves the ranges by the decay's rule.
    fresh->train_step(model::testing::make_batch(layout(), 64, 50, false), 1.0, false);
    for (const auto& [name, a] : ranges(*fresh)) EXPECT_TRUE(std::isfinite(a) && a > 0) << name;
  }
  std::filesystem::remove(path);
}

TEST(GpuQat, NonQatRecordsAndDivergedWeightsAreClearErrors) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU QAT not run";
  const model::RunConfig cfg = model::RunConfig::from_json(model_json());
  const io::Batch b = model::testing::make_batch(layout(), 32, 3, false);
  {
    auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21, "fp32");
    const auto ws = gpu->prunable_weights();
    ASSERT_FALSE(ws.empty());
    ws[0].param->quant = std::make_shared<compress::Int8Linear>(
        compress::quantize_weight(ws[0].weight), 0.01f);
    dlrec::testing::expect_error([&] { gpu->forward(b, false); },
                                 {"'" + ws[0].name + "'", "QAT records only"});
  }
  {
    auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21, "fp32");
    compress::install_qat(qat(0.9), *gpu);
    gpu->train_step(b, 1.0, true);
    for (auto& [name, t] : gpu->parameters()) {
      if (name != "top.1.weight") continue;
      Tensor h = t.to(Device::cpu());
      h.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
      t.copy_from(h);
    }
    dlrec::testing::expect_error([&] { gpu->train_step(b, 1.0, true); },
                                 {"QAT", "'top.1.weight'", "non-finite"});
  }
}

// The trainer on one GPU: Sparse-QAT (2:4 masks and QAT) with distillation, resumed from a dense
// checkpoint, follows the same fine-tune on the CPU; the QAT ranges land in the checkpoint and
// the export serves the INT8 model on either engine.
TEST(GpuQat, SparseQatWithDistillationFollowsTheCpuRun) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU QAT not run";
  dlrec::testing::TempDir dir("qat_gpu");
  const std::string data = dlrec::testing::make_compress_data(dir.path + "/d", 4, 6000, 5);
  const std::string dense = dir.path + "/dense", teacher = dir.path + "/teacher";
  json base = model_json();
  base["train"] = {{"batch_size", 128}, {"epochs", 1}, {"log_every", 0}};
  {
    train::TrainerOptions opt;
    opt.data_dir = data;
    opt.run_dir = dense;
    train::Trainer(model::RunConfig::from_json(base), opt).train();
    train::export_model(dense, teacher);
  }
  json cfg = base;
  cfg["train"]["epochs"] = 2;
  cfg["compress"] = {{"sparsity", {{"pattern", "2:4"}, {"skip_incompatible", true}}},
                     {"qat", {{"ema_decay", 0.9}}},
                     {"distill", {{"teacher", teacher}, {"alpha", 0.5}, {"temperature", 2.0}}}};
  std::map<std::string, std::map<std::string, std::vector<float>>> end;
  std::map<std::string, std::map<std::string, double>> rng;
  std::map<std::string, double> auc;
  for (const char* device : {"cpu", "cuda:0"}) {
    const bool cpu = std::string(device) == "cpu";
    const std::string run = dir.path + (cpu ? "/run_cpu" : "/run_gpu");
    fs::create_directories(run);
    fs::copy_file(dense + "/checkpoint.dlrec", run + "/checkpoint.dlrec");
    json c = cfg;
    c["train"]["device"] = device;
    train::TrainerOptions opt;
    opt.data_dir = data;
    opt.run_dir = run;
    opt.resume = true;
    train::Trainer t(model::RunConfig::from_json(c), opt);
    const train::TrainResult r = t.train();
    EXPECT_TRUE(std::isfinite(r.last_loss)) << device;
    auc[device] = r.eval.auc;
    end[device] = params(t.model());
    rng[device] = ranges(t.model());
  }
  std::string at;
  const double dw = worst_diff(end["cpu"], end["cuda:0"], &at);
  double dr = 0;
  ASSERT_FALSE(rng["cpu"].empty());
  for (const auto& [name, a] : rng["cpu"])
    dr = std::max(dr, std::fabs(rng["cuda:0"].at(name) - a) / a);
  std::printf("[gpu qat] trainer: max |w_gpu - w_cpu| %.2e (%s), ranges rel %.2e; AUC cpu %.5f "
              "gpu %.5f\n", dw, at.c_str(), dr, auc["cpu"], auc["cuda:0"]);
  EXPECT_LT(dw, 1e-3) << at;
  EXPECT_LT(dr, 1e-4);
  EXPECT_NEAR(auc["cpu"], auc["cuda:0"], 2e-3);
  // The GPU run's export is the INT8 model of its ranges: the CPU and a GPU serve it alike.
  const std::string out = dir.path + "/export_gpu";
  train::export_model(dir.path + "/run_gpu", out);
  train::Predictor pc(out, Device::cpu()), pg(out, Device::cuda(0), "fp32");
  pg.set_kernel_policy("compressed");  // the quantized arithmetic on every layer, as the CPU's
  const io::Batch b = model::testing::make_batch(pc.workflow().output_layout(), 128, 77, false);
  const std::vector<float> a = pc.predict(b), g = pg.predict(b);
  ASSERT_EQ(a.size(), g.size());
  double dp = 0;
  for (size_t k = 0; k < a.size(); ++k) dp = std::max(dp, std::fabs(double(a[k]) - g[k]));
  std::printf("[gpu qat] the GPU run's export: max |p_gpu - p_cpu| %.2e\n", dp);
  EXPECT_LT(dp, 1e-3);
}
