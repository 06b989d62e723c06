// 2:4 masks: the pattern, the config section, the optimizer hook, the schedule.
#include "dlrec/compress/sparsity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "dlrec/nn/optimizer.h"
#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::expect_error;

namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::F32, Device::cpu());
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (int64_t k = 0; k < t.numel(); ++k) t.data<float>()[k] = d(gen);
  return t;
}

// Counts zeros per group of 4; checks every group has at most `max_zeros`.
int64_t check_groups(const Tensor& mask, int max_zeros) {
  const int64_t cols = mask.dim(1);
  const float* m = mask.data<float>();
  int64_t zeros = 0;
  for (int64_t g = 0; g < mask.numel(); g += 4) {
    int z = 0;
    for (int k = 0; k < 4; ++k) {
      EXPECT_TRUE(m[g + k] == 0.f || m[g + k] == 1.f);
      z += m[g + k] == 0.f;
    }
    EXPECT_LE(z, max_zeros) << "group at " << g << " (cols " << cols << ")";
    zeros += z;
  }
  return zeros;
}

model::RunConfig with_compress(const char* section) {
  model::RunConfig c;
  c.compress = parse_json(section, "test");
  return c;
}

}  // namespace

TEST(Mask24, ExactlyTwoOfEveryFourZeroAndTheLargestKept) {
  const Tensor w = random_matrix(16, 32, 1);
  Tensor mask = Tensor::empty(w.shape(), DType::F32, Device::cpu());
  EXPECT_EQ(compress::compute_mask_2_4(w, 0.5, mask), w.numel() / 2);
  const float* v = w.data<float>();
  const float* m = mask.data<float>();
  for (int64_t g = 0; g < w.numel(); g += 4) {
    int zeros = 0;
    float min_kept = INFINITY, max_pruned = 0;
    for (int k = 0; k < 4; ++k) {
      if (m[g + k] == 0.f) {
        zeros++;
        max_pruned = std::max(max_pruned, std::fabs(v[g + k]));
      } else {
        EXPECT_EQ(m[g + k], 1.f);
        min_kept = std::min(min_kept, std::fabs(v[g + k]));
      }
    }
    EXPECT_EQ(zeros, 2) << "group at " << g;
    EXPECT_GE(min_kept, max_pruned) << "group at " << g << ": a smaller weight was kept";
  }
}

TEST(Mask24, PartialSparsityPrunesTheSmallestCandidates) {
  const Tensor w = random_matrix(8, 64, 2);
  Tensor mask = Tensor::empty(w.shape(), DType::F32, Device::cpu());
  const int64_t want = std::llround(0.3 * w.numel());
  EXPECT_EQ(compress::compute_mask_2_4(w, 0.3, mask), want);
  EXPECT_EQ(check_groups(mask, 2), want);
  EXPECT_EQ(compress::compute_mask_2_4(w, 0.0, mask), 0);
  EXPECT_EQ(check_groups(mask, 0), 0);
}

TEST(Mask24, BadShapesAndSparsitiesAreErrors) {
  Tensor w = random_matrix(4, 6, 3);
  Tensor mask = Tensor::empty(w.shape(), DType::F32, Device::cpu());
  expect_error([&] { compress::compute_mask_2_4(w, 0.5, mask); },
               {"input size 6", "multiple of 4"});
  Tensor w8 = random_matrix(4, 8, 3);
  Tensor m8 = Tensor::empty(w8.shape(), DType::F32, Device::cpu());
  expect_error([&] { compress::compute_mask_2_4(w8, 0.6, m8); }, {"sparsity", "[0, 0.5]"});
  expect_error([&] { compress::compute_mask_2_4(w8, 0.5, mask); }, {"weight's shape"});
}

TEST(OptimizerMask, MaskedWeightsStayZeroThroughEveryOptimizer) {
  for (const char* kind : {"sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"}) {
    SCOPED_TRACE(kind);
    nn::OptimizerOptions o;
    o.kind = nn::parse_optimizer(kind);
    o.momentum = o.kind == nn::OptimizerKind::SGD ? 0.9f : 0.f;
    o.weight_decay = 0.01f;
    nn::Optimizer opt(o);
    nn::Param p;
    p.value = random_matrix(4, 8, 4);
    p.grad = random_matrix(4, 8, 5);
    opt.init_state(p);
    p.mask = Tensor::empty(p.value.shape(), DType::F32, Device::cpu());
    compress::compute_mask_2_4(p.value, 0.5, p.mask);
    for (int s = 0; s < 10; ++s) {
      for (int64_t k = 0; k < p.grad.numel(); ++k) p.grad.data<float>()[k] = std::sin(s + k);
      opt.step(p, 0.1f);
    }
    int64_t nonzero_kept = 0;
    for (int64_t k = 0; k < p.value.numel(); ++k) {
      if (p.mask.data<float>()[k] == 0.f)
        EXPECT_EQ(p.value.data<float>()[k], 0.f) << "value " << k;
      else
        nonzero_kept += p.value.data<float>()[k] != 0.f;
    }
    EXPECT_GT(nonzero_kept, 0);
  }
}

TEST(CompressConfig, ParsesAndRoundTrips) {
  const auto c = compress::CompressConfig::from_json(parse_json(
      R"({"sparsity": {"pattern": "2:4", "layers": ["top"], "skip_incompatible": true,
          "schedule": {"start_step": 10, "end_step": 110, "every": 20}}})",
      "test"));
  EXPECT_TRUE(c.sparsity.on);
  EXPECT_FALSE(c.sparsity.all_dense);
  EXPECT_EQ(c.sparsity.layers, std::vector<std::string>{"top"});
  EXPECT_TRUE(c.sparsity.skip_incompatible);
  EXPECT_EQ(c.sparsity.schedule.every, 20);
  const auto back = compress::CompressConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_FALSE(compress::CompressConfig::from_json(json()).sparsity.on);
}

TEST(CompressConfig, BadSectionsAreClearErrors) {
  auto bad = [](const char* text, std::vector<std::string> parts) {
    expect_error([&] { compress::CompressConfig::from_json(parse_json(text, "test")); }, parts);
  };
  bad(R"({"sparsity": {"pattern": "1:4"}})", {"compress.sparsity.pattern", "1:4"});
  bad(R"({"sparsity": {"layers": "all"}})", {"compress.sparsity.layers", "all_dense"});
  bad(R"({"sparsity": {"layers": []}})", {"compress.sparsity.layers", "non-empty"});
  bad(R"({"sparsity": {"layers": ["top", "top"]}})", {"'top' is listed twice"});
  bad(R"({"sparsity": {"layerz": ["top"]}})", {"layerz"});
  bad(R"({"sparsity": {"schedule": {"start_step": 5, "end_step": 5}}})",
      {"compress.sparsity.schedule.end_step", "> start_step"});
  bad(R"({"sparsity": {"schedule": {"start_step": 5}}})", {"end_step", "required"});
  bad(R"({"sparsity": {"schedule": {"end_step": 5, "every": 0}}})", {"every"});
  bad(R"({"quant": {}})", {"quant"});
  expect_error([] { model::RunConfig::from_json(parse_json(R"({"compress": 3})", "t")); },
               {"compress", "object"});
}

TEST(SparsitySchedule, RampsToHalfAndUpdatesEveryK) {
  compress::SparsitySchedule s;
  s.on = true;
  s.start_step = 10;
  s.end_step = 50;
  s.every = 10;
  EXPECT_EQ(s.target(0), 0.0);
  EXPECT_EQ(s.target(10), 0.0);
  EXPECT_NEAR(s.target(30), 0.5 * (1 - 0.125), 1e-12);
  EXPECT_EQ(s.target(50), 0.5);
  EXPECT_EQ(s.target(1000), 0.5);
  for (int64_t step = 0; step < 60; ++step)
    EXPECT_EQ(s.update_at(step), step == 10 || step == 20 || step == 30 || step == 40 || step == 50)
        << step;
  double last = 0;
  for (int64_t step = 0; step <= 50; ++step) {
    EXPECT_GE(s.target(step), last);
    last = s.target(step);
  }
}

TEST(Pruner, LayerSelectionErrors) {
  io::ShardLayout layout;
  layout.num_dense = 3;  // bottom.0.weight is [8, 3]: 2:4 cannot prune it
  layout.cardinalities = {10, 20, 30};
  layout.multi_hot = {false, false, false};
  model::ModelConfig mc;
  mc.embedding_dim = 4;
  mc.bottom_mlp = {8, 4};
  mc.top_mlp = {8, 1};
  mc.interaction = "cat";
  auto m = model::build_model(mc, model::OptimizerConfig(), layout, Device::cpu(), 1);
  auto cfg = [](const char* s) {
    return compress::CompressConfig::from_json(parse_json(s, "test")).sparsity;
  };
  expect_error([&] { compress::Pruner(cfg(R"({"sparsity": {}})"), *m); },
               {"layer 'bottom'", "bottom.0.weight", "input size 3", "multiple of 4"});
  expect_error([&] { compress::Pruner(cfg(R"({"sparsity": {"layers": ["emb"]}})"), *m); },
               {"'emb'", "not an mlp or cross layer", "bottom, top"});
  compress::Pruner skip(cfg(R"({"sparsity": {"skip_incompatible": true}})"), *m);
  ASSERT_EQ(skip.skipped().size(), 1u);
  EXPECT_EQ(skip.skipped()[0].weight, "bottom.0.weight");
  const auto report = skip.prune(0.5);
  ASSERT_EQ(report.size(), 3u);  // bottom.1 [4, 8], top.0 [8, 16], top.1 [1, 8]
  for (const auto& r : report) EXPECT_EQ(r.zeroed * 2, r.numel) << r.weight;
  EXPECT_EQ(m->masks().size(), 3u);
  compress::Pruner top(cfg(R"({"sparsity": {"layers": ["top"]}})"), *m);
  EXPECT_EQ(top.prune(0.5).size(), 2u);
  EXPECT_EQ(compress::make_pruner(with_compress("{}"), *m), nullptr);
  expect_error([&] { m->set_mask("emb.0.weight", Tensor()); }, {"not a prunable weight"});
  // A model without mlp or cross layers (embeddings and a factorization machine).
  model::ModelConfig fm;
  fm.arch = "graph";
  fm.layers = parse_json(R"([{"name": "emb", "type": "embedding", "dim": 4},
                            {"name": "fm", "type": "fm", "inputs": ["emb"]},
                            {"name": "logit", "type": "output", "input": "fm"}])",
                         "test");
  auto none = model::build_model(fm, model::OptimizerConfig(), layout, Device::cpu(), 1);
  expect_error([&] { compress::Pruner(cfg(R"({"sparsity": {}})"), *none); },
               {"compress.sparsity", "no prunable weights"});
}
