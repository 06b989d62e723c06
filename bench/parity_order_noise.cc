// The noise floor of a parity comparison: how far two fp32 CPU runs of the same model drift
// apart when the only difference is the order in which each batch's rows are summed.
//
//   parity_order_noise [steps=300] [shuffle seeds=1,2,...,8] [wide_deep|dcn|deepfm] [sgd|adagrad]
//
// Builds the CPU graph model twice from one seed (the tiny models and batches of
// tests/model/graph_cuda_test.cc: 5 tables of 3..100 rows, multi-hot bags, batch 64) and trains
// both on the same batches; the second model sees every batch with its rows shuffled (the same
// samples, so the same mathematical loss and gradients, another fp32 summation order). Prints
// the first step where the loss difference jumps and the final parameter difference, per seed.
// A GPU-vs-CPU difference no larger than this is rounding order, not a bug (docs/PARITY.md).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../tests/model/graph_cases.h"
#include "../tests/model/test_batches.h"
#include "dlrec/core/config.h"
#include "dlrec/core/device.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"

using namespace dlrec;

namespace {

const char* layers_of(const std::string& name) {
  if (name == "wide_deep") return model::testing::kWideDeep;
  if (name == "dcn") return model::testing::kDcnStacked;
  if (name == "deepfm") return model::testing::kDeepFm;
  return nullptr;
}

// The same rows in another order (a seeded Fisher-Yates shuffle).
io::Batch shuffled(const io::Batch& b, nn::Rng& rng) {
  std::vector<int64_t> order(b.rows);
  for (int64_t i = 0; i < b.rows; ++i) order[i] = i;
  for (int64_t i = b.rows - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  io::Batch s;
  s.rows = b.rows;
  s.num_dense = b.num_dense;
  s.cat_offsets.assign(b.num_cat(), {});
  s.cat_indices.assign(b.num_cat(), {});
  for (int64_t r : order) {
    s.labels.push_back(b.labels[r]);
    s.dense.insert(s.dense.end(), b.dense.begin() + r * b.num_dense,
                   b.dense.begin() + (r + 1) * b.num_dense);
    for (int t = 0; t < b.num_cat(); ++t) {
      s.cat_offsets[t].push_back(static_cast<int64_t>(s.cat_indices[t].size()));
      s.cat_indices[t].insert(s.cat_indices[t].end(),
                              b.cat_indices[t].begin() + b.cat_offsets[t][r],
                              b.cat_indices[t].begin() + b.cat_offsets[t][r + 1]);
    }
  }
  for (int t = 0; t < b.num_cat(); ++t)
    s.cat_offsets[t].push_back(static_cast<int64_t>(s.cat_indices[t].size()));
  return s;
}

// max |a - b| / max |a| over the parameter tensors; the worst tensor's name in *worst.
double param_diff(model::Model& a, model::Model& b, std::string* worst) {
  auto pa = a.parameters(), pb = b.parameters();
  double w = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const double d = model::testing::tensor_rel_diff(pb[i].second, pa[i].second);
    if (d > w) {
      w = d;
      *worst = pa[i].first;
    }
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const int seeds = argc > 2 ? std::atoi(argv[2]) : 8;
  const std::string arch = argc > 3 ? argv[3] : "wide_deep";
  const std::string opt_name = argc > 4 ? argv[4] : "adagrad";
  const char* layers = layers_of(arch);
  if (!layers || steps < 1 || seeds < 1 || (opt_name != "sgd" && opt_name != "adagrad")) {
    std::fprintf(stderr,
                 "usage: parity_order_noise [steps>=1] [seeds>=1] [wide_deep|dcn|deepfm] "
                 "[sgd|adagrad]\n");
    return 2;
  }
  const std::string opt = opt_name == "sgd" ? model::testing::kSgd : model::testing::kAdagrad;
  const auto cfg = model::RunConfig::from_json(json::parse(
      std::string(R"({"model": {"arch": "graph", "layers": [)") + layers + "]}, \"optimizer\": " +
      opt + "}"));
  const auto layout = model::testing::make_layout(4, {50, 7, 100, 3, 20});
  std::printf("%s, %s, %d steps, batch 64: CPU vs CPU with each batch's rows shuffled\n",
              arch.c_str(), opt_name.c_str(), steps);
  for (int seed = 1; seed <= seeds; ++seed) {
    auto a = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 7);
    auto b = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 7);
    nn::Rng rng(seed);
    double worst = 0;
    int jump_step = -1;
    for (int i = 0; i < steps; ++i) {
      const io::Batch x = model::testing::make_batch(layout, 64, 1000 + i, true, 0.3);
      const io::Batch y = shuffled(x, rng);
      Tensor da, db;
      const double la = nn::bce_with_logits(a->forward(x, true), x.labels.data(), &da);
      a->backward_and_update(da, 1.0);
      const double lb = nn::bce_with_logits(b->forward(y, true), y.labels.data(), &db);
      b->backward_and_update(db, 1.0);
      const double r = model::testing::rel(lb, la);
      if (jump_step < 0 && r > 1e-6) jump_step = i;
      worst = std::max(worst, r);
    }
    std::string name;
    const double pd = param_diff(*a, *b, &name);
    std::printf("seed %d: worst loss rel diff %.3g, first step > 1e-6: %d, final params rel "
                "diff %.3g (%s)\n",
                seed, worst, jump_step, pd, name.c_str());
  }
  return 0;
}
