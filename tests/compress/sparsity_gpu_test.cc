// 2:4 masks on the CUDA graph engine (graph_cuda_masks.cu): the pruner's masks equal the CPU
// engine's for the same weights, training keeps every pruned weight exactly zero (f32 master
// and the bf16 copy the forward reads) and follows the CPU's masked training, and the masks
// travel through a checkpoint. Skips without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dlrec/compress/sparsity.h"
#include "dlrec/core/device.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "dlrec/train/trainer.h"
#include "model/test_batches.h"
#include "test_errors.h"

using namespace dlrec;

namespace {

io::ShardLayout layout() { return model::testing::make_layout(5, {40, 300, 9}); }

model::RunConfig config() {
  return model::RunConfig::from_json(json::parse(R"({
    "model": {"arch": "dcnv2", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 8, 1],
              "cross_layers": 2, "cross_low_rank": 8},
    "optimizer": {"type": "sgd", "lr": 0.1}})"));
}

compress::SparsityConfig half() {
  compress::SparsityConfig s;
  s.on = true;
  s.skip_incompatible = true;  // bottom.0 reads 5 dense features
  return s;
}

std::map<std::string, std::vector<float>> by_name(const std::vector<model::NamedTensor>& v) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : v) out[name] = t.to(Device::cpu()).to_vector<float>();
  return out;
}

// Every weight value whose mask is 0 is exactly 0.
void expect_pruned_zero(model::Model& m, const char* when) {
  const auto masks = by_name(m.masks());
  const auto params = by_name(m.parameters());
  ASSERT_FALSE(masks.empty());
  for (const auto& [mname, mask] : masks) {
    const std::string w = mname.substr(0, mname.size() - 5);  // "<w>.mask"
    const std::vector<float>& v = params.at(w);
    ASSERT_EQ(v.size(), mask.size()) << w;
    int64_t bad = 0;
    for (size_t k = 0; k < v.size(); ++k) bad += mask[k] == 0.f && v[k] != 0.f;
    EXPECT_EQ(bad, 0) << w << ": pruned values not zero " << when;
  }
}

}  // namespace

TEST(GpuMasks, TrainingKeepsPrunedWeightsZeroAndFollowsTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU masks not run";
  const model::RunConfig cfg = config();
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    auto cpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cpu(), 21);
    auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21,
                                  precision);
    // The same initial weights (the parity harness's premise) give the same masks.
    compress::Pruner pc(half(), *cpu), pg(half(), *gpu);
    const auto rc = pc.prune(0.5), rg = pg.prune(0.5);
    ASSERT_EQ(rc.size(), rg.size());
    for (size_t i = 0; i < rc.size(); ++i) {
      EXPECT_EQ(rc[i].weight, rg[i].weight);
      EXPECT_EQ(rc[i].zeroed, rg[i].zeroed) << rc[i].weight;
    }
    EXPECT_EQ(by_name(cpu->masks()), by_name(gpu->masks()));
    expect_pruned_zero(*gpu, "after pruning");
    // Training: the same batches, SGD; the CPU's masked step is the reference.
    const bool fp32 = std::string(precision) == "fp32";
    for (int step = 0; step < 6; ++step) {
      const io::Batch b = model::testing::make_batch(layout(), 64, 700 + step, false);
      Tensor dl;
      nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
      cpu->backward_and_update(dl, 1.0);
      gpu->train_step(b, 1.0, false);
    }
    expect_pruned_zero(*gpu, "after 6 training steps");
    const auto wc = by_name(cpu->parameters()), wg = by_name(gpu->parameters());
    double worst = 0;
    std::string at;
    for (const auto& [name, v] : wc) {
      const std::vector<float>& g = wg.at(name);
      for (size_t k = 0; k < v.size(); ++k)
        if (std::fabs(double(g[k]) - v[k]) > worst) worst = std::fabs(double(g[k]) - v[k]), at = name;
    }
    // fp32: summation order only; bf16: bf16 activations and weights in the products.
    EXPECT_LT(worst, fp32 ? 1e-4 : 5e-2) << "largest weight difference in " << at;
    std::printf("[gpu masks] %s: max |w_gpu - w_cpu| after 6 steps %.2e (%s)\n", precision, worst,
                at.c_str());
  }
}

TEST(GpuMasks, MasksTravelThroughACheckpoint) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU masks not run";
  const model::RunConfig cfg = config();
  auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21, "bf16");
  compress::Pruner(half(), *gpu).prune(0.5);
  gpu->train_step(model::testing::make_batch(layout(), 64, 5, false), 1.0, false);
  const std::string path = ::testing::TempDir() + "gpu_masks_" + std::to_string(::getpid()) +
                           ".dlrec";
  train::save_checkpoint(path, *gpu, cfg, layout(), {});
  auto fresh = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 99, "bf16");
  train::load_checkpoint(path, *fresh);
  std::filesystem::remove(path);
  EXPECT_EQ(by_name(fresh->masks()), by_name(gpu->masks()));
  EXPECT_EQ(by_name(fresh->parameters()), by_name(gpu->parameters()));
  fresh->train_step(model::testing::make_batch(layout(), 64, 6, false), 1.0, false);
  expect_pruned_zero(*fresh, "after a step of the resumed model");
  // On the CPU engine the same checkpoint holds the same masks.
  auto cpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cpu(), 7);
  train::save_checkpoint(path, *gpu, cfg, layout(), {});
  train::load_checkpoint(path, *cpu);
  std::filesystem::remove(path);
  EXPECT_EQ(by_name(cpu->masks()), by_name(gpu->masks()));
}

TEST(GpuMasks, BadMasksAreClearErrors) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU masks not run";
  const model::RunConfig cfg = config();
  auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21, "fp32");
  dlrec::testing::expect_error(
      [&] { gpu->set_mask("emb.0.weight", Tensor::zeros({40, 8}, DType::F32)); },
      {"'emb.0.weight'", "not a prunable weight"});
  dlrec::testing::expect_error(
      [&] { gpu->set_mask("top.0.weight", Tensor::zeros({3, 4}, DType::F32)); },
      {"the mask of 'top.0.weight'", "F32 CPU tensor of the weight's shape"});
  EXPECT_TRUE(gpu->masks().empty());
}

// A schedule re-prunes from the weights as trained so far (the pruner reads them anew at each
// prune; a GPU model's prunable_weights() are host copies): after a partial prune and some
// steps, the 50 % masks are those of the current weights, not of the initial ones.
TEST(GpuMasks, AScheduleRePrunesFromTheCurrentWeights) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU masks not run";
  const model::RunConfig cfg = config();
  auto gpu = model::build_model(cfg.model, cfg.optimizer, layout(), Device::cuda(0), 21, "fp32");
  compress::Pruner pruner(half(), *gpu);
  std::map<std::string, Tensor> initial;
  for (const auto& w : gpu->prunable_weights()) initial[w.name] = w.weight;
  pruner.prune(0.25);
  for (int step = 0; step < 20; ++step)
    gpu->train_step(model::testing::make_batch(layout(), 64, 900 + step, false), 1.0, false);
  std::map<std::string, std::vector<float>> want, stale;
  for (const auto& w : gpu->prunable_weights()) {
    if (w.weight.dim(1) % 4 != 0) continue;  // skipped by the pruner (skip_incompatible)
    Tensor m = Tensor::zeros(w.weight.shape(), DType::F32);
    compress::compute_mask_2_4(w.weight, 0.5, m);
    want[w.name + ".mask"] = m.to_vector<float>();
    compress::compute_mask_2_4(initial.at(w.name), 0.5, m);
    stale[w.name + ".mask"] = m.to_vector<float>();
  }
  pruner.prune(0.5);
  const auto got = by_name(gpu->masks());
  EXPECT_EQ(got, want);
  EXPECT_NE(want, stale) << "training changed no mask choice: the test cannot tell the two apart";
  expect_pruned_zero(*gpu, "after the second prune");
}
