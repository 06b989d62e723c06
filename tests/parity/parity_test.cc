// test_parity: the parity harness (docs/PARITY.md).
//
// One table of layer cases (cases() in parity_common.cc), each a minimal model built through the public API
// (model::build_model on a graph or DLRM config), run at a few shapes (odd widths, batch 1,
// sizes that are not multiples of 8):
//
//   CpuGrad/*       (always runs) analytic gradients of every parameter against central
//                   finite differences of the CPU model. The analytic gradient is read out of
//                   one SGD step with lr = 1 (w_before - w_after = dL/dw); the loss is
//                   L = sum_i r_i z_i over the logits z with fixed random r (so dL/dz = r).
//                   Also the BCE loss against finite differences.
//   CpuOptimizer/*  (always runs) two steps of each optimizer kind through the model against an
//                   independent double-precision reference of its update rule, applied to the
//                   model's own gradient (read out of an SGD twin as above).
//   GpuParity/*     (parity_gpu_test.cc) for each case and each precision fp32, tf32, bf16,
//                   with sgd and adagrad:
//                   identical initial parameters, forward logits, the device loss (BCE) and the
//                   parameter updates of one training step, and the losses of 5 steps, all
//                   against the CPU model (the reference). Which cases run is what the CUDA
//                   backend declares (model::graph_cuda_unsupported: the engine's and each layer
//                   type's support predicates); a case it declares unsupported is skipped with
//                   that reason, after checking that building it fails with exactly that
//                   message; without a GPU (or built without CUDA) every GPU case is skipped
//                   with a message naming it.
//   Registry/*      every registered layer type (model::graph_layer_types) has a case.
//
// Tolerances: kFd* (finite differences) and kGpuTol (per precision) below; docs/PARITY.md
// gives the same table and the reasons.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "dlrec/core/device.h"
#include "dlrec/model/graph.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/loss.h"
#include "model/test_batches.h"
#include "nn/grad_check.h"
#include "parity/parity_common.h"

namespace dlrec::parity {
namespace {

using model::Model;
using model::RunConfig;

// ---------------------------------------------------------------------------------------------
// CPU: gradients against central finite differences.
//
// The CPU models compute in f32; the loss is summed in double. An element is perturbed by
// eps = kFdEps (the step actually taken, float(w +- eps) - w, is the denominator) and passes when
// |numeric - analytic| <= kFdAtol * S + kFdRtol * |numeric|, S = max(1, max |analytic| over the
// tensor). ReLU kinks: where the function is not smooth within +-eps (the left and right slopes
// differ by at least |numeric - analytic|) the element is counted as non-smooth instead of
// failed; at most kFdMaxNonSmooth of the checked elements may be.
constexpr double kFdEps = 1e-3;
constexpr double kFdAtol = 1e-3;
constexpr double kFdRtol = 1e-2;
constexpr double kFdMaxNonSmooth = 0.05;
constexpr int64_t kFdMaxPerTensor = 256;  // elements checked per tensor (evenly spread)

struct FdResult {
  int64_t checked = 0, nonsmooth = 0, bad = 0;
  double worst_abs = 0, worst_rel = 0;  // over the elements that passed or failed (not kinks)
};

void check_model_gradients(Model& m, const io::Batch& b, uint64_t seed, const std::string& what,
                           FdResult& res) {
  // dL/dz = r / B: gradients of order 1 whatever the batch.
  Tensor r = testing::random_tensor({b.rows}, seed);
  float* rp = r.data<float>();
  for (int64_t i = 0; i < b.rows; ++i) rp[i] /= static_cast<float>(b.rows);
  auto loss = [&] { return testing::dot_loss(m.forward(b, false), r); };
  auto params = m.parameters();
  const double base = loss();
  // Numeric first (the parameters are restored after each element), then the analytic step.
  std::vector<std::vector<std::pair<int64_t, std::array<double, 3>>>> num(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    float* p = params[i].second.data<float>();
    const int64_t n = params[i].second.numel();
    const int64_t stride = std::max<int64_t>(1, (n + kFdMaxPerTensor - 1) / kFdMaxPerTensor);
    for (int64_t k = 0; k < n; k += stride) {
      const float saved = p[k];
      const float up = static_cast<float>(saved + kFdEps), dn = static_cast<float>(saved - kFdEps);
      p[k] = up;
      const double lu = loss();
      p[k] = dn;
      const double ld = loss();
      p[k] = saved;
      num[i].push_back({k,
                        {(lu - ld) / (double(up) - double(dn)), (lu - base) / (double(up) - saved),
                         (base - ld) / (double(saved) - dn)}});
    }
  }
  std::vector<std::vector<float>> before = values(m);
  m.forward(b, true);
  m.backward_and_update(r, 1.0);
  std::vector<std::vector<float>> after = values(m);
  for (size_t i = 0; i < params.size(); ++i) {
    double scale = 1;
    for (size_t k = 0; k < before[i].size(); ++k)
      scale = std::max(scale, std::fabs(double(before[i][k]) - after[i][k]));
    int shown = 0;
    for (auto& [k, d] : num[i]) {
      const double an = double(before[i][k]) - double(after[i][k]);
      const double central = d[0], right = d[1], left = d[2];
      const double err = std::fabs(central - an);
      ++res.checked;
      if (err <= kFdAtol * scale + kFdRtol * std::fabs(central)) {
        res.worst_abs = std::max(res.worst_abs, err / scale);
        res.worst_rel = std::max(res.worst_rel, err / std::max(std::fabs(central), 1e-3));
        continue;
      }
      if (std::fabs(right - left) >= err) {
        ++res.nonsmooth;
        continue;
      }
      ++res.bad;
      res.worst_abs = std::max(res.worst_abs, err / scale);
      if (shown++ < 5)
        ADD_FAILURE() << what << ": " << params[i].first << "[" << k << "]: numeric " << central
                      << " (left " << left << ", right " << right << ") analytic " << an;
    }
  }
}

class CpuGrad : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuGrad, FiniteDifferences) {
  const LayerCase& c = cases()[GetParam()];
  for (const Size& s : c.sizes) {
    const std::string what =
        c.name + " dim " + std::to_string(s.dim) + " batch " + std::to_string(s.batch);
    SCOPED_TRACE(what);
    const RunConfig cfg = config(c, s.dim, kUnitSgd);
    auto m = build(cfg, Device::cpu(), 7);
    // The wide part and the cross biases start at 0: move them off it so that every term of
    // the products is exercised.
    int pi = 0;
    for (auto& [name, t] : m->parameters()) {
      bool zero = true;
      for (float v : t.to_vector<float>()) zero = zero && v == 0.f;
      if (zero) t.copy_from(testing::random_tensor(t.shape(), 50 + pi, -0.3, 0.3));
      ++pi;
    }
    FdResult res;
    for (int rep = 0; rep < 2; ++rep)
      check_model_gradients(*m, batch_of(c, s.batch, 100 + rep), 200 + rep, what, res);
    std::printf("[fd] %-26s dim %2lld batch %2lld: %lld elements, %lld at kinks, worst "
                "|num-an|/S %.2e, rel %.2e\n",
                c.name.c_str(), (long long)s.dim, (long long)s.batch, (long long)res.checked,
                (long long)res.nonsmooth, res.worst_abs, res.worst_rel);
    EXPECT_EQ(res.bad, 0);
    EXPECT_LE(res.nonsmooth, kFdMaxNonSmooth * res.checked) << "too many elements at kinks";
    EXPECT_GT(res.checked, 0);
  }
}

std::string case_name(const ::testing::TestParamInfo<size_t>& i) { return cases()[i.param].name; }

INSTANTIATE_TEST_SUITE_P(Layers, CpuGrad, ::testing::Range<size_t>(0, cases().size()), case_name);

// BCE with logits: the loss against finite differences of itself, dlogits its gradient, for
// saturated and moderate logits and soft labels.
TEST(CpuGradBce, FiniteDifferences) {
  for (int64_t n : {1, 7, 33}) {
    std::vector<float> z(n), y(n), dl(n);
    nn::Rng rng(n);
    const float fixed[] = {-40.f, -3.2f, -0.5f, 0.f, 0.7f, 5.f, 40.f};
    for (int64_t i = 0; i < n; ++i) {
      z[i] = i < 7 ? fixed[i] : static_cast<float>(rng.uniform(-8, 8));
      y[i] = i % 3 == 0 ? 1.f : i % 3 == 1 ? 0.f : 0.25f;
    }
    nn::bce_with_logits(z.data(), y.data(), n, dl.data());
    for (int64_t i = 0; i < n; ++i) {
      const float saved = z[i];
      const float up = saved + 1e-2f, dn = saved - 1e-2f;
      z[i] = up;
      const double lu = nn::bce_with_logits(z.data(), y.data(), n, nullptr);
      z[i] = dn;
      const double ld = nn::bce_with_logits(z.data(), y.data(), n, nullptr);
      z[i] = saved;
      const double num = (lu - ld) / (double(up) - double(dn));
      // The loss is smooth with |d3L/dz3| <= 0.1 / n: truncation error < 2e-6 / n.
      EXPECT_NEAR(dl[i], num, 1e-5 / n + 1e-5 * std::fabs(num)) << "n " << n << " z " << saved;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CPU: every optimizer kind through a model (dense layers, cross, embedding tables and the wide
// part's tables and bias), two steps, against a double-precision reference of the update rules
// in include/dlrec/nn/optimizer.h applied to the model's gradient. Tables update only the rows
// of the batch (lazy); dense parameters every row.
//
// Tolerance: max |w_model - w_ref| <= 1e-3 * max |w_ref - w_before| + 1e-6 per tensor (the
// gradient read out of an f32 step carries ~1e-7 absolute error).
const char* kOptModel = R"({"arch": "graph", "layers": [
  {"name": "dense", "type": "dense"},
  {"name": "emb", "type": "embedding", "dim": 4, "pooling": "mean"},
  {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
  {"name": "cross", "type": "cross", "input": "x0", "low_rank": 2},
  {"name": "deep", "type": "mlp", "input": "cross", "sizes": [6, 1]},
  {"name": "wide", "type": "wide"},
  {"name": "sum", "type": "add", "inputs": ["deep", "wide"]},
  {"name": "logit", "type": "output", "input": "sum"}]})";

const std::vector<OptCase> kOptCases = {
    {"sgd", R"({"type": "sgd", "lr": 0.3, "embedding_lr": 0.5})"},
    {"sgd_momentum", R"({"type": "sgd", "lr": 0.3, "momentum": 0.9})"},
    {"sgd_nesterov", R"({"type": "sgd", "lr": 0.3, "momentum": 0.9, "nesterov": true})"},
    {"adagrad", R"({"type": "adagrad", "lr": 0.05, "embedding_lr": 0.1, "adagrad_init": 0.1})"},
    {"rowwise_adagrad", R"({"type": "rowwise_adagrad", "lr": 0.05, "adagrad_init": 0.1})"},
    {"adam", R"({"type": "adam", "lr": 0.01, "adam_eps": 1e-3})"},
    {"ftrl", R"({"type": "ftrl", "lr": 0.1, "ftrl_l1": 0.001, "ftrl_l2": 0.01})"},
    {"adam_dense_ftrl_tables",
     R"({"type": "adam", "lr": 0.01, "adam_eps": 1e-3,
         "embedding": {"type": "ftrl", "lr": 0.1, "ftrl_l1": 0.001}})"},
};

// The reference state of one parameter tensor [rows, C].
struct RefState {
  std::vector<double> a, m, v, z, n, buf;  // per value
  std::vector<double> row_a, row_t;        // per row
};

// One reference update of the rows in `rows` (all rows when null) of w [rows, C].
void ref_step(const model::OptimizerConfig& o, double lr, std::vector<double>& w,
              const std::vector<double>& g, int64_t R, const std::set<int64_t>* rows,
              RefState& s) {
  const int64_t C = static_cast<int64_t>(w.size()) / R;
  const std::string& k = o.type;
  if (s.a.empty()) {
    s.a.assign(w.size(), o.adagrad_init);
    s.m.assign(w.size(), 0);
    s.v.assign(w.size(), 0);
    s.z.assign(w.size(), 0);
    s.n.assign(w.size(), 0);
    s.buf.assign(w.size(), 0);
    s.row_a.assign(R, o.adagrad_init);
    s.row_t.assign(R, 0);
  }
  for (int64_t r = 0; r < R; ++r) {
    if (rows && !rows->count(r)) continue;
    double mean_g2 = 0;
    for (int64_t c = 0; c < C; ++c) mean_g2 += g[r * C + c] * g[r * C + c] / C;
    s.row_a[r] += mean_g2;
    s.row_t[r] += 1;
    for (int64_t c = 0; c < C; ++c) {
      const size_t i = r * C + c;
      const double gi = g[i];
      if (k == "sgd") {
        if (o.momentum == 0) {
          w[i] -= lr * gi;
        } else {
          s.buf[i] = o.momentum * s.buf[i] + gi;
          w[i] -= lr * (o.nesterov ? gi + o.momentum * s.buf[i] : s.buf[i]);
        }
      } else if (k == "adagrad") {
        s.a[i] += gi * gi;
        w[i] -= lr * gi / (std::sqrt(s.a[i]) + o.adagrad_eps);
      } else if (k == "rowwise_adagrad") {
        w[i] -= lr * gi / (std::sqrt(s.row_a[r]) + o.adagrad_eps);
      } else if (k == "adam") {
        const double t = s.row_t[r];
        s.m[i] = o.beta1 * s.m[i] + (1 - o.beta1) * gi;
        s.v[i] = o.beta2 * s.v[i] + (1 - o.beta2) * gi * gi;
        const double mh = s.m[i] / (1 - std::pow(o.beta1, t));
        const double vh = s.v[i] / (1 - std::pow(o.beta2, t));
        w[i] -= lr * mh / (std::sqrt(vh) + o.adam_eps);
      } else if (k == "ftrl") {
        const double sig = (std::sqrt(s.n[i] + gi * gi) - std::sqrt(s.n[i])) / lr;
        s.z[i] += gi - sig * w[i];
        s.n[i] += gi * gi;
        w[i] = std::fabs(s.z[i]) <= o.ftrl_l1
                   ? 0
                   : -(s.z[i] - std::copysign(o.ftrl_l1, s.z[i])) /
                         ((o.ftrl_beta + std::sqrt(s.n[i])) / lr + o.ftrl_l2);
      } else {
        FAIL() << "no reference for optimizer " << k;
      }
    }
  }
}

class CpuOptimizer : public ::testing::TestWithParam<size_t> {};

TEST_P(CpuOptimizer, TwoStepsMatchReference) {
  const OptCase& oc = kOptCases[GetParam()];
  auto cfg = RunConfig::from_json(json::parse(std::string(R"({"model": )") + kOptModel +
                                              R"(, "optimizer": )" + oc.json + "}"));
  auto unit = RunConfig::from_json(json::parse(std::string(R"({"model": )") + kOptModel +
                                               R"(, "optimizer": )" + kUnitSgd + "}"));
  const io::ShardLayout l = layout();
  auto m = build(cfg, Device::cpu(), 3);
  auto twin = build(unit, Device::cpu(), 3);
  const model::OptimizerConfig dense_oc = cfg.optimizer, emb_oc = cfg.optimizer.embedding_config();
  std::map<std::string, RefState> state;
  double worst = 0;
  for (int step = 0; step < 2; ++step) {
    io::Batch b = model::testing::make_batch(l, 9, 60 + step, true);
    Tensor r = testing::random_tensor({b.rows}, 70 + step, -0.2, 0.2);
    auto g = gradients(*twin, *m, b, r);
    auto before = values(*m);
    m->forward(b, true);
    m->backward_and_update(r, 1.0);
    auto after = values(*m);
    auto params = m->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].first;
      const Tensor& t = params[i].second;
      // Tables: "emb.<f>.weight" and "wide.<f>.weight" (the wide bias is dense).
      const bool table = (name.rfind("emb.", 0) == 0 || name.rfind("wide.", 0) == 0) &&
                         name != "wide.bias";
      std::set<int64_t> rows;
      if (table) {
        const int64_t f = std::stoll(name.substr(name.find('.') + 1));
        for (int64_t id : b.cat_indices[f]) rows.insert(id);
      }
      std::vector<double> w(before[i].begin(), before[i].end());
      const model::OptimizerConfig& o = table ? emb_oc : dense_oc;
      const double lr = table ? cfg.optimizer.embedding_lr_value() : cfg.optimizer.lr;
      ref_step(o, lr, w, g[i], t.ndim() ? t.dim(0) : 1, table ? &rows : nullptr, state[name]);
      double scale = 0, err = 0;
      int64_t at = 0;
      for (size_t k = 0; k < w.size(); ++k) {
        scale = std::max(scale, std::fabs(w[k] - before[i][k]));
        if (std::fabs(after[i][k] - w[k]) > err) {
          err = std::fabs(after[i][k] - w[k]);
          at = static_cast<int64_t>(k);
        }
      }
      EXPECT_LE(err, 1e-3 * scale + 1e-6)
          << oc.name << " step " << step << " " << name << "[" << at << "]: model "
          << after[i][at] << " reference " << w[at] << " (update scale " << scale << ")";
      if (!table) {
        EXPECT_GT(scale, 0) << name << ": a dense parameter did not move";
      }
      worst = std::max(worst, err / (1e-3 * scale + 1e-6));
    }
  }
  std::printf("[opt] %-24s 2 steps: worst |w_model - w_ref| = %.2f of the tolerance\n", oc.name,
              worst);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CpuOptimizer, ::testing::Range<size_t>(0, kOptCases.size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::string(kOptCases[i.param].name);
                         });

// Parity by registry: every registered layer type has a case (the CPU gradient and optimizer
// checks run it; the GPU part runs it wherever the type's support predicate accepts it), and
// every case names types that exist and that its model uses.
TEST(Registry, EveryLayerTypeHasACase) {
  const std::vector<std::string>& types = model::graph_layer_types();
  ASSERT_FALSE(types.empty());
  std::set<std::string> covered;
  for (const LayerCase& c : cases())
    for (const std::string& t : c.layers) {
      covered.insert(t);
      if (t.rfind("preset:", 0) == 0) continue;
      EXPECT_NE(std::find(types.begin(), types.end(), t), types.end())
          << c.name << ": '" << t << "' is not a registered layer type";
      EXPECT_NE(c.model.find("\"type\": \"" + t + "\""), std::string::npos)
          << c.name << ": its model has no '" << t << "' layer";
    }
  for (const std::string& t : types)
    EXPECT_TRUE(covered.count(t)) << "layer type '" << t
                                  << "' is registered but has no parity case: add one to "
                                     "cases() in tests/parity/parity_common.cc";
}


}  // namespace
}  // namespace dlrec::parity
