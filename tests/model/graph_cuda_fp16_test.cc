// fp16 with dynamic loss scaling in the CUDA graph engine (every model: DCNv2, DLRM as a graph,
// DeepFM, Wide&Deep): training tracks the f32 CPU reference as bf16 does; an overflowed step
// (a loss scale so large that the fp16 gradients overflow) changes no parameter and no
// optimizer state, halves the scale and counts the skip, and training goes on once the scale
// fits; good steps grow the scale after optimizer.loss_scale_growth_interval of them; options
// and unsupported combinations are clear errors.
//
// Without a GPU the device tests skip visibly. DLREC_PARITY_STEPS overrides the step counts
// (short runs under compute-sanitizer).
#include <gtest/gtest.h>

#include "test_errors.h"

#include "model/graph_cases.h"
#include "model/test_batches.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"

namespace dlrec::model {
namespace {

using namespace testing;  // the graph cases (graph_cases.h) and the batch helpers
using dlrec::testing::expect_error;

#define SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                    \
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: graph fp16 not run"; \
  } while (0)

int steps_or(int dflt) {
  const char* e = std::getenv("DLREC_PARITY_STEPS");
  return e ? std::max(1, std::atoi(e)) : dflt;
}

RunConfig graph_config(const std::string& layers, const std::string& opt) {
  return RunConfig::from_json(json::parse(R"({"model": {"arch": "graph", "layers": [)" + layers +
                                          R"(]}, "optimizer": )" + opt + "}"));
}

struct Case {
  RunConfig cfg;
  io::ShardLayout layout = make_layout(4, {50, 7, 100, 3, 20});
  int64_t batch = 64;
  Case(const char* layers, const char* opt) : cfg(graph_config(layers, opt)) {}
};

io::Batch batch_of(const Case& c, int64_t rows, uint64_t seed) {
  return make_batch(c.layout, rows, seed, true, 0.3);
}

double param_diff(Model& gpu, Model& cpu) {
  auto pg = gpu.parameters(), pc = cpu.parameters();
  EXPECT_EQ(pg.size(), pc.size());
  double w = 0;
  for (size_t i = 0; i < std::min(pg.size(), pc.size()); ++i) {
    EXPECT_EQ(pg[i].first, pc[i].first);
    if (pg[i].second.numel() != pc[i].second.numel()) continue;
    w = std::max(w, tensor_rel_diff(pg[i].second, pc[i].second));
  }
  return w;
}

// fp16 GEMMs and activations (loss-scaled gradients) with f32 master weights follow the f32 CPU
// as bf16 does (graph_cuda_test.cc's bound), and learn where the CPU learns.
void fp16_tracks_cpu(const Case& c, int steps, double max_param_diff = 0.1) {
  auto cpu = build_model(c.cfg.model, c.cfg.optimizer, c.layout, Device::cpu(), 5);
  auto gpu = build_model(c.cfg.model, c.cfg.optimizer, c.layout, Device::cuda(0), 5, "fp16");
  double worst = 0, first = 0, last = 0, cpu_first = 0, cpu_last = 0;
  for (int i = 0; i < steps; ++i) {
    io::Batch b = batch_of(c, c.batch, 2000 + i);
    Tensor dl;
    const double lc = nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
    cpu->backward_and_update(dl, 1.0);
    const double lg = gpu->train_step(b, 1.0, true);
    ASSERT_TRUE(std::isfinite(lg)) << "step " << i;
    worst = std::max(worst, rel(lg, lc));
    if (i < 10) {
      first += lg / 10;
      cpu_first += lc / 10;
    }
    if (i >= steps - 10) {
      last += lg / 10;
      cpu_last += lc / 10;
    }
  }
  const double pd = param_diff(*gpu, *cpu);
  std::printf("[graph fp16] %d steps: loss %.4f -> %.4f (f32 CPU %.4f -> %.4f), worst loss rel "
              "diff vs f32 CPU %.3g, params %.3g\n",
              steps, first, last, cpu_first, cpu_last, worst, pd);
  EXPECT_LE(worst, 0.05);
  if (steps >= 20 && cpu_last < cpu_first) {
    EXPECT_LT(last, first);
  }
  EXPECT_LE(pd, max_param_diff);
}

TEST(GraphCudaFp16, DcnTracksCpu) {
  SKIP_WITHOUT_GPU();
  fp16_tracks_cpu(Case(kDcnStacked, kAdagrad), steps_or(200), 0.15);
  fp16_tracks_cpu(Case(kDcnParallel, kSgd), steps_or(200));
}

TEST(GraphCudaFp16, DlrmAndMixedTrackCpu) {
  SKIP_WITHOUT_GPU();
  fp16_tracks_cpu(Case(kDlrm, kSgd), steps_or(200));
  fp16_tracks_cpu(Case(kMixed, kSgd), steps_or(200));
}

TEST(GraphCudaFp16, DeepFmAndWideDeepTrackCpu) {
  SKIP_WITHOUT_GPU();
  fp16_tracks_cpu(Case(kDeepFm, kSgd), steps_or(200));
  fp16_tracks_cpu(Case(kDeepFmGathered, kAdagrad), steps_or(200), 0.15);
  fp16_tracks_cpu(Case(kWideDeep, kAdagrad), steps_or(200), 0.15);
}

// The loss-scale state: {scale, 1/scale or 0, overflow, good steps, skipped} ("amp.loss_scale"
// in optimizer_state, laid out as the CUDA DLRM's).
struct LossScaleState {
  float scale = 0, gscale = 0;
  int32_t overflow = 0, good = 0;
  int64_t skipped = 0;
};
LossScaleState loss_scale_of(Model& m) {
  for (auto& [name, t] : m.optimizer_state())
    if (name == "amp.loss_scale") {
      const Tensor v = t.to(Device::cpu());
      const char* p = static_cast<const char*>(v.raw());
      LossScaleState s;
      std::memcpy(&s.scale, p, 4);
      std::memcpy(&s.gscale, p + 4, 4);
      std::memcpy(&s.overflow, p + 8, 4);
      std::memcpy(&s.good, p + 12, 4);
      std::memcpy(&s.skipped, p + 16, 8);
      return s;
    }
  ADD_FAILURE() << "no amp.loss_scale in the optimizer state";
  return {};
}

// Every parameter and optimizer state value (the loss-scale state left out).
std::vector<std::vector<float>> snapshot(Model& m) {
  std::vector<std::vector<float>> v;
  for (auto& [n, t] : m.parameters()) v.push_back(t.to_vector<float>());
  for (auto& [n, t] : m.optimizer_state())
    if (n != "amp.loss_scale") v.push_back(t.to_vector<float>());
  return v;
}

// An overflowing loss scale: the step changes nothing, the scale halves; once it fits, the
// model trains. Every kind of deferred update is covered: MLP and cross weights, the embedding
// tables (direct into a concat, and not), the wide tables and bias; eager first steps, then
// CUDA graph replays.
void overflow_skips(const char* layers) {
  Case c(layers, kAdagrad);
  c.cfg.optimizer.loss_scale_init = 1e30;  // optimizer.loss_scale_init
  auto gpu = build_model(c.cfg.model, c.cfg.optimizer, c.layout, Device::cuda(0), 5, "fp16");
  const auto before = snapshot(*gpu);
  const double l0 = gpu->train_step(batch_of(c, c.batch, 77), 1.0, true);
  EXPECT_TRUE(std::isfinite(l0)) << "the loss itself is computed in f32 and stays finite";
  EXPECT_EQ(snapshot(*gpu), before) << "an overflowed step must not touch weights or state";
  LossScaleState ls = loss_scale_of(*gpu);
  EXPECT_EQ(ls.skipped, 1);
  EXPECT_FLOAT_EQ(ls.scale, 5e29f);
  EXPECT_EQ(ls.gscale, 0.f);
  EXPECT_EQ(ls.overflow, 0) << "the flag is cleared for the next step";
  double first = 0, last = 0;
  const int steps = steps_or(300);
  for (int i = 0; i < steps; ++i) {
    const double l = gpu->train_step(batch_of(c, c.batch, 100 + i), 1.0, true);
    if (i == steps / 2) first = l;
    last = l;
  }
  ls = loss_scale_of(*gpu);
  std::printf("[graph fp16] after %d steps: scale %g, %lld skipped\n", steps + 1, ls.scale,
              static_cast<long long>(ls.skipped));
  EXPECT_LT(ls.scale, 1e30f);
  EXPECT_TRUE(std::isfinite(last));
  if (steps >= 200) {
    EXPECT_GT(ls.skipped, 10);
    EXPECT_LT(ls.skipped, 150);
    EXPECT_NE(snapshot(*gpu), before);
    EXPECT_LE(last, first * 1.2);
  }
}

TEST(GraphCudaFp16, OverflowSkipsTheStepAndHalvesTheScale) {
  SKIP_WITHOUT_GPU();
  for (const char* layers : {kDcnStacked, kDeepFm, kWideDeep, kDlrm}) {
    SCOPED_TRACE(layers);
    overflow_skips(layers);
  }
}

// Good steps double the scale every optimizer.loss_scale_growth_interval steps; the step's
// gradient factor is 1 / (the scale it ran with). The same through forward +
// backward_and_update (the Model interface's step).
TEST(GraphCudaFp16, GoodStepsGrowTheScale) {
  SKIP_WITHOUT_GPU();
  for (bool split : {false, true}) {
    Case c(kDcnStacked, kSgd);
    c.cfg.optimizer.loss_scale_init = 1;
    c.cfg.optimizer.loss_scale_growth_interval = 2;
    auto gpu = build_model(c.cfg.model, c.cfg.optimizer, c.layout, Device::cuda(0), 5, "fp16");
    for (int i = 0; i < 6; ++i) {
      io::Batch b = batch_of(c, c.batch, 300 + i);
      if (!split) {
        gpu->train_step(b, 1.0, false);
        continue;
      }
      Tensor dl;
      nn::bce_with_logits(gpu->forward(b, true).to(Device::cpu()), b.labels.data(), &dl);
      gpu->backward_and_update(dl.to(Device::cuda(0)), 1.0);
    }
    const LossScaleState ls = loss_scale_of(*gpu);
    EXPECT_EQ(ls.skipped, 0) << "split " << split;
    EXPECT_FLOAT_EQ(ls.scale, 8.f) << "split " << split;  // 1 -> 2 -> 4 -> 8 after 6 steps
    EXPECT_FLOAT_EQ(ls.gscale, 0.25f) << "split " << split;
    EXPECT_EQ(ls.good, 0) << "split " << split;
  }
}

TEST(GraphCudaFp16, OptionsAndUnsupportedAreClearErrors) {
  if (!cuda::built_with_cuda()) GTEST_SKIP() << "built without CUDA";
  const io::ShardLayout l = make_layout(4, {50, 7, 100, 3, 20});
  auto build = [&](const RunConfig& c) {
    build_model(c.model, c.optimizer, l, Device::cuda(0), 1, "fp16");
  };
  for (double init : {0.5, std::nan(""), 1e39}) {
    RunConfig c = graph_config(kDcnStacked, kSgd);
    c.optimizer.loss_scale_init = init;
    expect_error([&] { build(c); }, {"optimizer.loss_scale_init"});
  }
  RunConfig g = graph_config(kDcnStacked, kSgd);
  g.optimizer.loss_scale_growth_interval = 0;
  expect_error([&] { build(g); }, {"optimizer.loss_scale_growth_interval"});
  const std::string hashed = R"(
    {"name": "emb", "type": "embedding", "dim": 4, "hashed": {"capacity": 10}},
    {"name": "c", "type": "concat", "inputs": ["emb"]},
    {"name": "m", "type": "mlp", "input": "c", "sizes": [1]},
    {"name": "o", "type": "output", "input": "m"})";
  expect_error([&] { build(graph_config(hashed, kSgd)); },
               {"layer 'emb'", "hashed", "fp16", "bf16"});
  const std::string thin = R"(
    {"name": "dense", "type": "dense"},
    {"name": "m", "type": "mlp", "input": "dense", "sizes": [1, 8, 1]},
    {"name": "o", "type": "output", "input": "m"})";
  expect_error([&] { build(graph_config(thin, kSgd)); }, {"'sizes'", "fp16"});
}

}  // namespace
}  // namespace dlrec::model
