// test_parity: the parity harness (docs/PARITY.md).
//
// One table of layer cases (kCases), each a minimal model built through the public API
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
//   GpuParity/*     for each case and each precision fp32, tf32, bf16, with sgd and adagrad:
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

namespace dlrec::parity {
namespace {

using model::Model;
using model::RunConfig;

// ---------------------------------------------------------------------------------------------
// The cases.

struct Size {
  int64_t dim;    // the width under test: substituted for $D in the case's model JSON
  int64_t batch;  // rows per batch
};

struct LayerCase {
  std::string name;   // gtest name part
  std::string model;  // the "model" section, $D standing for Size::dim
  bool multi_hot;     // bags of 0..3 ids (empty bags too) in every other feature, else one id
  std::vector<Size> sizes;
  // The registered layer types (model::graph_layer_types) this case is about; "preset:<arch>"
  // for a preset. Registry.EveryLayerTypeHasACase fails for a type no case names.
  std::vector<std::string> layers;
};

// Data layout of every case: 5 dense features, 3 small tables (duplicate ids in a batch are the
// rule).
io::ShardLayout layout() { return model::testing::make_layout(5, {11, 4, 23}); }

std::string graph(const std::string& layers) {
  return R"({"arch": "graph", "layers": [)" + layers + "]}";
}

const std::vector<Size> kOdd = {{4, 1}, {5, 7}, {8, 33}};

const std::vector<LayerCase>& cases() {
  static const std::vector<LayerCase> c = {
      {"embedding_onehot_sum",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       false, kOdd, {"embedding", "output"}},
      {"embedding_multihot_sum",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"embedding"}},
      {"embedding_multihot_mean",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D, "pooling": "mean"},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"embedding"}},
      // Per-table widths and a subset of the features: CPU only.
      {"embedding_dims_subset",
       graph(R"({"name": "emb", "type": "embedding", "features": [2, 0], "dims": [3, $D]},
                {"name": "top", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"embedding"}},
      {"linear",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "lin", "type": "mlp", "input": "dense", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "lin"})"),
       false, kOdd, {"dense", "mlp"}},
      {"mlp_relu",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "deep", "type": "mlp", "input": "dense", "sizes": [$D, 3, 1]},
                {"name": "logit", "type": "output", "input": "deep"})"),
       false, kOdd, {"mlp"}},
      {"mlp_relu_last",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [7, $D],
                 "relu_last": true},
                {"name": "top", "type": "mlp", "input": "bottom", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       false, kOdd, {"mlp"}},
      {"dot",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "bottom", "type": "mlp", "input": "dense", "sizes": [7, $D],
                 "relu_last": true},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "inter", "type": "dot", "inputs": ["bottom", "emb"]},
                {"name": "top", "type": "mlp", "input": "inter", "sizes": [5, 1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"dot"}},
      {"concat",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x", "type": "concat", "inputs": ["emb", "dense"]},
                {"name": "top", "type": "mlp", "input": "x", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"concat"}},
      {"add",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "a", "type": "mlp", "input": "dense", "sizes": [3, 1]},
                {"name": "b", "type": "mlp", "input": "emb", "sizes": [1]},
                {"name": "sum", "type": "add", "inputs": ["a", "b"]},
                {"name": "logit", "type": "output", "input": "sum"})"),
       true, kOdd, {"add"}},
      {"cross_full_stacked",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
                {"name": "top", "type": "mlp", "input": "cross", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"cross"}},
      {"cross_lowrank_stacked",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2,
                 "low_rank": 3},
                {"name": "top", "type": "mlp", "input": "cross", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "top"})"),
       true, kOdd, {"cross"}},
      {"cross_full_parallel",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D, "pooling": "mean"},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 2},
                {"name": "deep", "type": "mlp", "input": "x0", "sizes": [7], "relu_last": true},
                {"name": "both", "type": "concat", "inputs": ["cross", "deep"]},
                {"name": "head", "type": "mlp", "input": "both", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "head"})"),
       true, kOdd, {"cross"}},
      {"cross_lowrank_parallel",
       graph(R"({"name": "dense", "type": "dense"},
                {"name": "emb", "type": "embedding", "dim": $D},
                {"name": "x0", "type": "concat", "inputs": ["dense", "emb"]},
                {"name": "cross", "type": "cross", "input": "x0", "num_layers": 3,
                 "low_rank": 2},
                {"name": "deep", "type": "mlp", "input": "x0", "sizes": [7], "relu_last": true},
                {"name": "both", "type": "concat", "inputs": ["cross", "deep"]},
                {"name": "head", "type": "mlp", "input": "both", "sizes": [1]},
                {"name": "logit", "type": "output", "input": "head"})"),
       true, kOdd, {"cross"}},
      {"fm",
       graph(R"({"name": "emb", "type": "embedding", "dim": $D},
                {"name": "fm", "type": "fm", "inputs": ["emb"]},
                {"name": "logit", "type": "output", "input": "fm"})"),
       true, kOdd, {"fm"}},
      {"wide",
       graph(R"({"name": "wide", "type": "wide"},
                {"name": "logit", "type": "output", "input": "wide"})"),
       true, kOdd, {"wide"}},
      // arch "dlrm": the preset graph (src/model/presets.cc) on the CPU and the CUDA graph
      // engine (the CUDA DLRM class that CUDA ran before needed 16-bit MLP sizes that are
      // multiples of 8, hence the widths 8 and 16).
      {"dlrm_preset",
       R"({"arch": "dlrm", "embedding_dim": $D, "bottom_mlp": [16, $D], "top_mlp": [8, 1]})",
       true, {{8, 1}, {8, 7}, {16, 33}}, {"preset:dlrm"}},
  };
  return c;
}

std::string substitute(std::string s, int64_t dim) {
  const std::string d = std::to_string(dim);
  for (size_t p; (p = s.find("$D")) != std::string::npos;) s.replace(p, 2, d);
  return s;
}

RunConfig config(const LayerCase& c, int64_t dim, const std::string& optimizer) {
  return RunConfig::from_json(json::parse(R"({"model": )" + substitute(c.model, dim) +
                                          R"(, "optimizer": )" + optimizer + "}"));
}

io::Batch batch_of(const LayerCase& c, int64_t rows, uint64_t seed) {
  return model::testing::make_batch(layout(), rows, seed, c.multi_hot);
}

std::unique_ptr<Model> build(const RunConfig& cfg, Device dev, uint64_t seed,
                             const std::string& precision = "fp32") {
  return model::build_model(cfg.model, cfg.optimizer, layout(), dev, seed, precision);
}

// SGD with learning rate 1 for every parameter: one step subtracts the gradient.
const char* kUnitSgd = R"({"type": "sgd", "lr": 1.0})";

std::vector<std::vector<float>> values(Model& m) {
  std::vector<std::vector<float>> v;
  for (auto& [name, t] : m.parameters()) v.push_back(t.to_vector<float>());
  return v;
}

// dL/dw of every parameter for dlogits `r`, at the model's current parameters, read out of one
// SGD step (lr 1) of `twin` (a model of the same config with kUnitSgd) after copying the
// parameters of `m` into it.
std::vector<std::vector<double>> gradients(Model& twin, Model& m, const io::Batch& b,
                                           const Tensor& r) {
  auto pt = twin.parameters(), pm = m.parameters();
  EXPECT_EQ(pt.size(), pm.size());
  for (size_t i = 0; i < pt.size(); ++i) pt[i].second.copy_from(pm[i].second);
  auto before = values(twin);
  twin.forward(b, true);
  twin.backward_and_update(r, 1.0);
  auto after = values(twin);
  std::vector<std::vector<double>> g(before.size());
  for (size_t i = 0; i < before.size(); ++i)
    for (size_t k = 0; k < before[i].size(); ++k)
      g[i].push_back(double(before[i][k]) - double(after[i][k]));
  return g;
}

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

struct OptCase {
  const char* name;
  const char* json;
};

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

// ---------------------------------------------------------------------------------------------
// GPU against the CPU.
//
// Errors (docs/PARITY.md):
//   forward:  max_i |z_gpu - z_cpu| / max(max_i |z_cpu|, RMS of the CPU logits over 64 rows)
//             over the logits of a batch;
//   update:   per parameter tensor, max |(w1 - w0)_gpu - (w1 - w0)_cpu| / max |(w1 - w0)_cpu|
//             after one training step from identical parameters (the device's BCE and its
//             backward included); tensors the CPU step leaves unchanged must stay unchanged;
//   update L2: per parameter tensor, ||u_gpu - u_cpu|| / ||u_cpu|| with u = w1 - w0 (16-bit
//             precisions bound this norm tightly and single elements more loosely: a ReLU
//             input near 0 that 16-bit rounding flips moves a few elements a lot — measured:
//             dlrm_class bf16 dim 16 batch 33, one table row whose update is a near-cancelling
//             sum of 3 samples' gradients, 0.157 of the largest update with the weights rounded
//             to bf16 in both models; fp16's 4x finer rounding stays at 8e-4 there). Measured
//             on an H100 (docs/PARITY.md): bf16 worst L2 0.081 (mlp_relu_last, the 8 values of
//             bottom.1.bias at dim 8 batch 33), 0.067 (dlrm_class emb.2.weight), worst element
//             0.157; fp16 worst 1.0e-3 and 1.1e-3;
//   loss:     |loss_gpu - loss_cpu| / loss_cpu at each of kSteps steps (the device's loss from
//             train_step against the CPU's BCE of its own forward).
struct Tol {
  const char* precision;
  double forward, update, update_l2, loss;
};

// fp32: no TF32; cuBLAS/cuBLASLt and the CUDA kernels sum in other orders than the CPU.
// tf32: GEMM inputs rounded to 10-bit mantissas (2^-11 relative).
// bf16: activations, GEMM inputs and gradients in bf16 (8-bit mantissas, 2^-9 relative),
//       f32 accumulation and f32 master weights and tables.
// fp16: the same in fp16 (11-bit mantissas, 2^-11 relative, but 5-bit exponents: dynamic loss
//       scaling keeps the gradients in range), bounds as bf16's.
const Tol kGpuTol[] = {
    {"fp32", 1e-5, 1e-3, 1e-3, 1e-4},
    {"tf32", 5e-3, 2e-2, 2e-2, 1e-2},
    {"bf16", 5e-2, 2.5e-1, 1e-1, 5e-2},
    {"fp16", 5e-2, 2.5e-1, 1e-1, 5e-2},  // dynamic loss scaling on (every model)
};
// bf16 compares from parameters that bf16 represents exactly (rounded once, the same values
// in both models): the device computes with bf16 copies of its f32 master weights, so from
// unrounded weights the CPU reference would differ by the weight rounding itself, which moved
// one update element of dlrm_class at dim 16 batch 33 by 0.161 of the largest update (a ReLU
// input near 0 flipped; measured on the CPU alone).
constexpr int kSteps = 5;

const OptCase kGpuOpts[] = {
    {"sgd", R"({"type": "sgd", "lr": 0.5})"},
    {"adagrad", R"({"type": "adagrad", "lr": 0.05, "embedding_lr": 0.1, "adagrad_init": 0.1})"},
};

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

// The nearest bf16 value (ties to even) of a finite float.
float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

// DLREC_PARITY_SIZES="16x33,8x7" (dim x batch) replaces every case's sizes in the GPU part;
// DLREC_PARITY_OPT=sgd|adagrad runs one optimizer only (short runs under compute-sanitizer,
// reproducing one shape).
std::vector<Size> gpu_sizes(const LayerCase& c) {
  const char* e = std::getenv("DLREC_PARITY_SIZES");
  if (!e || !*e) return c.sizes;
  std::vector<Size> out;
  std::string list = e;
  for (size_t pos = 0; pos <= list.size();) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(pos, end - pos);
    const size_t x = item.find('x');
    if (x == std::string::npos) throw Error("DLREC_PARITY_SIZES: '" + item + "' is not DxB");
    out.push_back({std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1))});
    pos = end + 1;
  }
  return out;
}

bool gpu_opt_selected(const OptCase& o) {
  const char* e = std::getenv("DLREC_PARITY_OPT");
  return !e || !*e || std::string(e) == o.name;
}

// Up to 6 elements of parameter `name` whose GPU update differs from the CPU's by more than
// `limit`, with, for an embedding table "<layer>.<f>.weight", the batch rows whose bag of
// feature f holds that table row.
std::string offenders(const std::string& name, const std::vector<float>& w0,
                      const std::vector<float>& w1c, const std::vector<float>& w1g,
                      const Tensor& t, const io::Batch& b, double limit) {
  std::string out;
  int shown = 0, total = 0;
  const int64_t cols = t.ndim() > 1 ? t.numel() / t.dim(0) : 1;
  int64_t feature = -1;
  const size_t d1 = name.find('.'), d2 = name.find('.', d1 + 1);
  if (d1 != std::string::npos && d2 != std::string::npos && t.ndim() == 2 &&
      name.substr(d2) == ".weight" &&
      name.find_first_not_of("0123456789", d1 + 1) == d2)
    feature = std::stoll(name.substr(d1 + 1, d2 - d1 - 1));
  for (size_t k = 0; k < w0.size(); ++k) {
    const double uc = double(w1c[k]) - w0[k], ug = double(w1g[k]) - w0[k];
    if (std::fabs(ug - uc) <= limit) continue;
    ++total;
    if (shown++ >= 6) continue;
    const int64_t row = static_cast<int64_t>(k) / cols, col = static_cast<int64_t>(k) % cols;
    out += "\n  [" + std::to_string(row) + "," + std::to_string(col) + "] gpu " +
           std::to_string(ug) + " cpu " + std::to_string(uc);
    if (feature >= 0 && feature < static_cast<int64_t>(b.cat_offsets.size())) {
      std::string in;
      const auto& off = b.cat_offsets[feature];
      for (int64_t r = 0; r + 1 < static_cast<int64_t>(off.size()); ++r)
        for (int64_t j = off[r]; j < off[r + 1]; ++j)
          if (b.cat_indices[feature][j] == row)
            in += " " + std::to_string(r) + "(bag of " + std::to_string(off[r + 1] - off[r]) + ")";
      out += "; in batch rows:" + (in.empty() ? std::string(" none") : in);
    }
  }
  return std::to_string(total) + " elements over the tolerance:" + out;
}

// fp16 models: the steps that dynamic loss scaling skipped so far (the optimizer state
// "amp.loss_scale": {scale, 1/scale, overflow, good steps (4 bytes each), skipped (int64)}).
int64_t skipped_steps(Model& m) {
  for (auto& [name, t] : m.optimizer_state())
    if (name == "amp.loss_scale") {
      const Tensor v = t.to(Device::cpu());
      int64_t n = 0;
      std::memcpy(&n, static_cast<const char*>(v.raw()) + 16, sizeof n);
      return n;
    }
  ADD_FAILURE() << "an fp16 model without amp.loss_scale in its optimizer state";
  return 0;
}

// What the CUDA backend declares it does not support in the case's model ("" when it runs it).
std::string gpu_unsupported(const RunConfig& cfg, const char* precision) {
  if (cfg.model.arch != "graph") return "";
  const auto spec = model::GraphSpec::parse(cfg.model.layers, "model.layers");
  return model::graph_cuda_unsupported(spec, cfg.optimizer, layout(), precision);
}

class GpuParity : public ::testing::TestWithParam<std::tuple<size_t, size_t>> {};

TEST_P(GpuParity, MatchesCpu) {
  const LayerCase& c = cases()[std::get<0>(GetParam())];
  const Tol& tol = kGpuTol[std::get<1>(GetParam())];
  const std::string id = c.name + "/" + tol.precision;
  // Whether the CUDA backend runs the case is what it declares (graph_cuda_unsupported: the
  // engine's and each layer type's support predicates); arch "dlrm" is the CUDA DLRM, which
  // runs every precision.
  const std::string why = gpu_unsupported(config(c, c.sizes[0].dim, kGpuOpts[0].json),
                                          tol.precision);
  if (!why.empty()) {
    // The backend must refuse the model with that error (checked where a device exists).
    if (cuda::device_count() > 0) {
      std::string msg;
      try {
        build(config(c, c.sizes[0].dim, kGpuOpts[0].json), Device::cuda(0), 1, tol.precision);
      } catch (const Error& e) {
        msg = e.what();
      }
      ASSERT_EQ(msg, why) << id << ": the CUDA backend does not refuse the model as its "
                             "support predicate says";
    }
    GTEST_SKIP() << id << ": not supported on cuda (" << why << ")";
  }
  if (cuda::device_count() == 0)
    GTEST_SKIP() << id << ": no CUDA device" << (cuda::built_with_cuda() ? "" : " (built without "
                                                 "CUDA)") << "; GPU parity not run";
  for (const OptCase& opt : kGpuOpts) {
    if (!gpu_opt_selected(opt)) continue;
    for (const Size& s : gpu_sizes(c)) {
      const std::string what = id + " " + opt.name + " dim " + std::to_string(s.dim) +
                               " batch " + std::to_string(s.batch);
      SCOPED_TRACE(what);
      const RunConfig cfg = config(c, s.dim, opt.json);
      auto cpu = build(cfg, Device::cpu(), 21);
      std::unique_ptr<Model> gpu = build(cfg, Device::cuda(0), 21, tol.precision);
      ASSERT_TRUE(gpu->device().is_cuda());
      // Identical initial parameters (names, shapes, values).
      auto pc = cpu->parameters(), pg = gpu->parameters();
      ASSERT_EQ(pc.size(), pg.size());
      if (std::string(tol.precision) == "bf16")
        for (size_t i = 0; i < pc.size(); ++i) {
          std::vector<float> v = pc[i].second.to_vector<float>();
          for (float& x : v) x = round_to_bf16(x);
          Tensor r = Tensor::from_vector(v, pc[i].second.shape());
          pc[i].second.copy_from(r);
          pg[i].second.copy_from(r);
        }
      for (size_t i = 0; i < pc.size(); ++i) {
        ASSERT_EQ(pc[i].first, pg[i].first);
        ASSERT_EQ(pc[i].second.shape(), pg[i].second.shape()) << pc[i].first;
        ASSERT_EQ(pc[i].second.to_vector<float>(), pg[i].second.to_vector<float>())
            << pc[i].first << ": initial values differ";
      }
      // Forward.
      io::Batch fb = batch_of(c, s.batch, 300);
      auto zc = cpu->forward(fb, false).to_vector<float>();
      auto zg = gpu->forward(fb, false).to_vector<float>();
      ASSERT_EQ(zc.size(), zg.size());
      // The scale: the largest CPU logit of this batch or the RMS logit of the model over 64
      // rows, whichever is larger (a batch of one row may hold a logit near 0 made of
      // cancelling terms of the typical size).
      double zmax = 0, dmax = 0, rms = 0;
      int64_t zat = 0;
      for (float z : cpu->forward(batch_of(c, 64, 299), false).to_vector<float>())
        rms += double(z) * z / 64;
      zmax = std::max(std::sqrt(rms), 1e-6);
      for (size_t i = 0; i < zc.size(); ++i) zmax = std::max(zmax, double(std::fabs(zc[i])));
      for (size_t i = 0; i < zc.size(); ++i)
        if (std::fabs(double(zg[i]) - zc[i]) > dmax) {
          dmax = std::fabs(double(zg[i]) - zc[i]);
          zat = static_cast<int64_t>(i);
        }
      const double fwd = dmax / zmax;
      EXPECT_LE(fwd, tol.forward) << "forward: logit " << zat << " gpu " << zg[zat] << " cpu "
                                  << zc[zat] << " (max |z| " << zmax << ", abs err " << dmax << ")";
      // One training step from identical parameters: the updates.
      auto w0 = values(*cpu);
      double worst_loss = 0, worst_upd = 0, worst_l2 = 0;
      std::string worst_upd_name;
      const bool fp16 = std::string(tol.precision) == "fp16";
      int64_t skipped = 0;
      for (int step = 0; step < kSteps; ++step) {
        io::Batch b = batch_of(c, s.batch, 400 + step);
        Tensor dl;
        const double lc = nn::bce_with_logits(cpu->forward(b, true), b.labels.data(), &dl);
        const double lg = gpu->train_step(b, 1.0, true);
        ASSERT_TRUE(std::isfinite(lg)) << "step " << step;
        // fp16: a step whose loss-scaled gradients overflow changes nothing on the GPU (dynamic
        // loss scaling; its semantics are tested in graph_cuda_fp16_test.cc and
        // dlrm_cuda_test.cc). The CPU has no loss scaling, so the reference skips that step too
        // and the models compared stay the same (seen: full-rank cross stacks at batch 1).
        if (fp16 && skipped_steps(*gpu) > skipped) ++skipped;
        else cpu->backward_and_update(dl, 1.0);
        const double lr = rel(lg, lc);
        worst_loss = std::max(worst_loss, lr);
        EXPECT_LE(lr, tol.loss) << "step " << step << ": loss gpu " << lg << " cpu " << lc;
        if (step != 0) continue;
        auto w1c = values(*cpu), w1g = values(*gpu);
        auto names = cpu->parameters();
        for (size_t i = 0; i < w0.size(); ++i) {
          double scale = 0, err = 0, d2 = 0, n2 = 0;
          size_t at = 0;
          for (size_t k = 0; k < w0[i].size(); ++k) {
            const double uc = double(w1c[i][k]) - w0[i][k], ug = double(w1g[i][k]) - w0[i][k];
            scale = std::max(scale, std::fabs(uc));
            d2 += (ug - uc) * (ug - uc);
            n2 += uc * uc;
            if (std::fabs(ug - uc) > err) {
              err = std::fabs(ug - uc);
              at = k;
            }
          }
          const double e = scale > 0 ? err / scale : err;
          const double l2 = n2 > 0 ? std::sqrt(d2 / n2) : 0.0;
          if (e > worst_upd) {
            worst_upd = e;
            worst_upd_name = names[i].first;
          }
          worst_l2 = std::max(worst_l2, l2);
          EXPECT_LE(l2, tol.update_l2) << "update of " << names[i].first << ": relative L2 error";
          EXPECT_LE(e, scale > 0 ? tol.update : 0.0)
              << "update of " << names[i].first << "[" << at << "]: gpu "
              << double(w1g[i][at]) - w0[i][at] << " cpu " << double(w1c[i][at]) - w0[i][at]
              << " (max |update| " << scale << ", abs err " << err << "); "
              << offenders(names[i].first, w0[i], w1c[i], w1g[i], names[i].second, b,
                           (scale > 0 ? tol.update : 0.0) * scale);
        }
      }
      EXPECT_LT(skipped, kSteps) << "every step overflowed in fp16: no update was compared";
      std::printf("[gpu] %-30s %-7s dim %2lld batch %2lld: forward %.2e, update %.2e (%s), "
                  "update L2 %.2e, loss %.2e over %d steps%s\n",
                  id.c_str(), opt.name, (long long)s.dim, (long long)s.batch, fwd, worst_upd,
                  worst_upd_name.c_str(), worst_l2, worst_loss, kSteps,
                  skipped ? (" (" + std::to_string(skipped) + " skipped by fp16 loss scaling, "
                             "the reference too)").c_str() : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layers, GpuParity,
    ::testing::Combine(::testing::Range<size_t>(0, cases().size()),
                       ::testing::Range<size_t>(0, std::size(kGpuTol))),
    [](const ::testing::TestParamInfo<std::tuple<size_t, size_t>>& i) {
      return cases()[std::get<0>(i.param)].name + "_" + kGpuTol[std::get<1>(i.param)].precision;
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
                                     "cases() in tests/parity/parity_test.cc";
}

}  // namespace
}  // namespace dlrec::parity
