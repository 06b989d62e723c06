#include "dlrec/nn/optimizer.h"

#include <algorithm>
#include <cmath>

#include "dlrec/core/thread_pool.h"

namespace dlrec::nn {

namespace {

// The row count and per-row size of a parameter (see optimizer.h).
void rows_cols(const Tensor& v, int64_t* rows, int64_t* cols) {
  const int64_t n = v.numel();
  const int64_t r = v.ndim() >= 1 ? v.dim(0) : 1;
  *rows = r;
  *cols = r > 0 ? n / r : 0;
}

// The transformed gradient of value k: scale, clip by value, L2 (wd_l2 = 0 unless wanted).
inline float grad_at(const float* g, const float* w, int64_t k, float scale, float clip,
                     float wd_l2) {
  float x = g[k];
  if (scale != 1.f) x *= scale;
  if (clip > 0.f) x = std::min(clip, std::max(-clip, x));
  if (wd_l2 != 0.f) x += wd_l2 * w[k];
  return x;
}

}  // namespace

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptimizerKind::SGD;
  if (s == "adagrad") return OptimizerKind::Adagrad;
  if (s == "rowwise_adagrad") return OptimizerKind::RowWiseAdagrad;
  if (s == "adam") return OptimizerKind::Adam;
  if (s == "ftrl") return OptimizerKind::FTRL;
  fail("unknown optimizer '", s, "' (expected sgd, adagrad, rowwise_adagrad, adam or ftrl)");
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::SGD: return "sgd";
    case OptimizerKind::Adagrad: return "adagrad";
    case OptimizerKind::RowWiseAdagrad: return "rowwise_adagrad";
    case OptimizerKind::Adam: return "adam";
    case OptimizerKind::FTRL: return "ftrl";
  }
  return "?";
}

void OptimizerOptions::validate() const {
  auto check = [](bool ok, const char* field, float v, const char* want) {
    if (!ok) fail("optimizer option '", field, "' must be ", want, ", got ", v);
  };
  check(momentum >= 0.f && momentum < 1.f, "momentum", momentum, "in [0, 1)");
  if (nesterov && !(momentum > 0.f))
    fail("optimizer option 'nesterov' needs momentum > 0, got momentum ", momentum);
  check(adagrad_eps >= 0.f, "adagrad_eps", adagrad_eps, ">= 0");
  check(initial_accumulator >= 0.f, "initial_accumulator", initial_accumulator, ">= 0");
  check(beta1 >= 0.f && beta1 < 1.f, "beta1", beta1, "in [0, 1)");
  check(beta2 >= 0.f && beta2 < 1.f, "beta2", beta2, "in [0, 1)");
  check(adam_eps > 0.f, "adam_eps", adam_eps, "> 0");
  check(ftrl_beta >= 0.f, "ftrl_beta", ftrl_beta, ">= 0");
  check(ftrl_l1 >= 0.f, "ftrl_l1", ftrl_l1, ">= 0");
  check(ftrl_l2 >= 0.f, "ftrl_l2", ftrl_l2, ">= 0");
  check(ftrl_init >= 0.f, "ftrl_init", ftrl_init, ">= 0");
  if (kind == OptimizerKind::FTRL && ftrl_beta == 0.f && ftrl_init == 0.f && ftrl_l2 == 0.f)
    fail("optimizer option 'ftrl_beta' must be > 0 when ftrl_init and ftrl_l2 are 0 (the first "
         "FTRL step would divide by zero)");
  check(weight_decay >= 0.f, "weight_decay", weight_decay, ">= 0");
  check(clip_value >= 0.f, "clip_value", clip_value, ">= 0");
  check(clip_norm >= 0.f, "clip_norm", clip_norm, ">= 0");
}

Optimizer::Optimizer(const OptimizerOptions& options) : o_(options) { o_.validate(); }

Optimizer::Optimizer(OptimizerKind kind, float eps, float initial_accumulator) {
  DLREC_CHECK(eps >= 0 && initial_accumulator >= 0,
              "Optimizer: eps and the initial accumulator must be >= 0");
  o_.kind = kind;
  o_.adagrad_eps = eps;
  o_.initial_accumulator = initial_accumulator;
  o_.validate();
}

int64_t Optimizer::state_row_size(int64_t dim) const {
  switch (o_.kind) {
    case OptimizerKind::SGD: return o_.momentum > 0.f ? dim : 0;
    case OptimizerKind::Adagrad: return dim;
    case OptimizerKind::RowWiseAdagrad: return 1;
    case OptimizerKind::Adam: return 2 * dim + 1;
    case OptimizerKind::FTRL: return 2 * dim;
  }
  return 0;
}

std::string Optimizer::state_suffix() const {
  if (!has_state()) return "";
  if (o_.kind == OptimizerKind::SGD) return ".momentum";
  return std::string(".") + optimizer_name(o_.kind);
}

void Optimizer::init_state_row(float* s, int64_t dim) const {
  switch (o_.kind) {
    case OptimizerKind::SGD:
      std::fill(s, s + state_row_size(dim), 0.f);
      break;
    case OptimizerKind::Adagrad:
      std::fill(s, s + dim, o_.initial_accumulator);
      break;
    case OptimizerKind::RowWiseAdagrad:
      s[0] = o_.initial_accumulator;
      break;
    case OptimizerKind::Adam:
      std::fill(s, s + 2 * dim + 1, 0.f);
      break;
    case OptimizerKind::FTRL:
      std::fill(s, s + dim, 0.f);
      std::fill(s + dim, s + 2 * dim, o_.ftrl_init);
      break;
  }
}

void Optimizer::init_state(Param& p) const {
  if (!has_state()) {
    p.state = Tensor();
    return;
  }
  int64_t rows, cols;
  rows_cols(p.value, &rows, &cols);
  const int64_t per_row = state_row_size(cols);
  Shape shape;
  if (o_.kind == OptimizerKind::Adagrad || o_.kind == OptimizerKind::SGD)
    shape = p.value.shape();  // same shape as the parameter
  else if (o_.kind == OptimizerKind::RowWiseAdagrad)
    shape = {rows};
  else
    shape = {rows, per_row};
  p.state = Tensor::empty(shape, DType::F32);
  float* s = p.state.data<float>();
  parallel_for(0, rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, per_row)),
               [&](int64_t lo, int64_t hi) {
                 for (int64_t r = lo; r < hi; ++r) init_state_row(s + r * per_row, cols);
               });
}

namespace {

// The update of one row of `d` values, state row `s`. scale: global-norm factor; wd: weight
// decay (0 for sparse rows).
void update_row(const OptimizerOptions& o, float* w, float* s, const float* g, int64_t d,
                float lr, float scale, float wd) {
  const float clip = o.clip_value;
  // No gradient transformation: grad_at(k) is g[k] exactly (the same results, fewer branches).
  const bool plain = scale == 1.f && clip <= 0.f && wd == 0.f;
  switch (o.kind) {
    case OptimizerKind::SGD: {
      if (o.momentum > 0.f) {
        const float mu = o.momentum;
        for (int64_t k = 0; k < d; ++k) {
          const float x = grad_at(g, w, k, scale, clip, wd);
          s[k] = mu * s[k] + x;
          const float u = o.nesterov ? x + mu * s[k] : s[k];
          w[k] -= lr * u;
        }
      } else if (plain) {
        for (int64_t k = 0; k < d; ++k) w[k] -= lr * g[k];
      } else {
        for (int64_t k = 0; k < d; ++k) w[k] -= lr * grad_at(g, w, k, scale, clip, wd);
      }
      break;
    }
    case OptimizerKind::Adagrad: {
      const float eps = o.adagrad_eps;
      if (plain) {  // the common case without transformations, as a tight loop
        for (int64_t k = 0; k < d; ++k) {
          s[k] += g[k] * g[k];
          w[k] -= lr * g[k] / (std::sqrt(s[k]) + eps);
        }
        break;
      }
      for (int64_t k = 0; k < d; ++k) {
        const float x = grad_at(g, w, k, scale, clip, wd);
        s[k] += x * x;
        w[k] -= lr * x / (std::sqrt(s[k]) + eps);
      }
      break;
    }
    case OptimizerKind::RowWiseAdagrad: {
      // Two passes over the gradient: the row's mean square first (double accumulation, in
      // order), then the update with one multiplier for the row.
      double sq = 0;
      for (int64_t k = 0; k < d; ++k) {
        const float x = grad_at(g, w, k, scale, clip, wd);
        sq += static_cast<double>(x) * x;
      }
      s[0] += static_cast<float>(sq / static_cast<double>(d));
      const float mult = lr / (std::sqrt(s[0]) + o.adagrad_eps);
      for (int64_t k = 0; k < d; ++k) w[k] -= mult * grad_at(g, w, k, scale, clip, wd);
      break;
    }
    case OptimizerKind::Adam: {
      float* m = s;
      float* v = s + d;
      float& t = s[2 * d];
      if (t < 16777216.f) t += 1.f;
      const float b1 = o.beta1, b2 = o.beta2;
      const float c1 = 1.f - static_cast<float>(std::pow(static_cast<double>(b1), t));
      const float c2 = 1.f - static_cast<float>(std::pow(static_cast<double>(b2), t));
      const float step = lr / c1;
      const float rc2 = 1.f / std::sqrt(c2);
      for (int64_t k = 0; k < d; ++k) {
        const float x = grad_at(g, w, k, scale, clip, 0.f);
        if (wd > 0.f) w[k] -= lr * wd * w[k];  // decoupled (AdamW)
        m[k] = b1 * m[k] + (1.f - b1) * x;
        v[k] = b2 * v[k] + (1.f - b2) * x * x;
        w[k] -= step * m[k] / (std::sqrt(v[k]) * rc2 + o.adam_eps);
      }
      break;
    }
    case OptimizerKind::FTRL: {
      float* z = s;
      float* n = s + d;
      // alpha = 0 (a schedule at its end) would divide by zero: FTRL then does not step.
      if (!(lr > 0.f)) break;
      const float alpha = lr, beta = o.ftrl_beta, l1 = o.ftrl_l1, l2 = o.ftrl_l2;
      for (int64_t k = 0; k < d; ++k) {
        const float x = grad_at(g, w, k, scale, clip, wd);
        const float n_new = n[k] + x * x;
        const float sigma = (std::sqrt(n_new) - std::sqrt(n[k])) / alpha;
        z[k] += x - sigma * w[k];
        n[k] = n_new;
        if (std::fabs(z[k]) <= l1) {
          w[k] = 0.f;
        } else {
          const float sign = z[k] < 0.f ? -1.f : 1.f;
          w[k] = -(z[k] - sign * l1) / ((beta + std::sqrt(n[k])) / alpha + l2);
        }
      }
      break;
    }
  }
}

}  // namespace

void Optimizer::step(Param& p, float lr, float grad_scale) const {
  DLREC_CHECK(p.grad.defined() && p.grad.shape() == p.value.shape(),
              "Optimizer::step: the parameter has no dense gradient of its shape");
  DLREC_CHECK(lr >= 0.f, "Optimizer::step: learning rate must be >= 0, got ", lr);
  int64_t rows, cols;
  rows_cols(p.value, &rows, &cols);
  const int64_t per_row = state_row_size(cols);
  if (per_row > 0)
    DLREC_CHECK(p.state.defined() && p.state.numel() == rows * per_row,
                "Optimizer::step: ", optimizer_name(o_.kind),
                " state missing or of the wrong size (call init_state)");
  float* w = p.value.data<float>();
  const float* g = p.grad.data<float>();
  float* s = per_row > 0 ? p.state.data<float>() : nullptr;
  const float wd = o_.weight_decay;
  // Rows of one value (biases) are batched into pieces of many rows.
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, cols));
  if (p.mask.defined())
    DLREC_CHECK(p.mask.shape() == p.value.shape() && p.mask.dtype() == DType::F32,
                "Optimizer::step: the parameter's mask does not have its shape");
  const float* mask = p.mask.defined() ? p.mask.data<float>() : nullptr;
  parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      update_row(o_, w + r * cols, s ? s + r * per_row : nullptr, g + r * cols, cols, lr,
                 grad_scale, wd);
      if (mask)  // pruned weights stay exactly zero whatever the optimizer's state says
        for (int64_t k = r * cols; k < (r + 1) * cols; ++k)
          if (mask[k] == 0.f) w[k] = 0.f;
    }
  });
}

double Optimizer::grad_norm(const std::vector<Param*>& params) {
  // Fixed pieces of 64K values summed in index order: the same bits for any thread count.
  constexpr int64_t kPiece = 1 << 16;
  double total = 0;
  for (const Param* p : params) {
    DLREC_CHECK(p->grad.defined(), "Optimizer::grad_norm: a parameter has no gradient");
    const float* g = p->grad.data<float>();
    const int64_t n = p->grad.numel();
    const int64_t pieces = (n + kPiece - 1) / kPiece;
    std::vector<double> part(pieces, 0.0);
    parallel_for(0, pieces, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        double acc = 0;
        const int64_t end = std::min(n, (i + 1) * kPiece);
        for (int64_t k = i * kPiece; k < end; ++k) acc += static_cast<double>(g[k]) * g[k];
        part[i] = acc;
      }
    });
    for (double x : part) total += x;
  }
  return std::sqrt(total);
}

double Optimizer::step_dense(const std::vector<Param*>& params, float lr) const {
  double norm = 0;
  float scale = 1.f;
  if (o_.clip_norm > 0.f) {
    norm = grad_norm(params);
    if (norm > o_.clip_norm) scale = static_cast<float>(o_.clip_norm / norm);
  }
  for (Param* p : params) step(*p, lr, scale);
  return norm;
}

void Optimizer::step_row(float* w, float* state, const float* g, int64_t dim, float lr) const {
  update_row(o_, w, state, g, dim, lr, 1.f, 0.f);
}

void Optimizer::step_sparse(Param& table, const SparseGrad& g, float lr) const {
  DLREC_CHECK(table.value.ndim() == 2 && table.value.dim(1) == g.dim,
              "Optimizer::step_sparse: gradient dim ", g.dim, " does not match the table ",
              shape_str(table.value.shape()));
  DLREC_CHECK(static_cast<int64_t>(g.values.size()) == g.size() * g.dim,
              "Optimizer::step_sparse: malformed sparse gradient");
  DLREC_CHECK(lr >= 0.f, "Optimizer::step_sparse: learning rate must be >= 0, got ", lr);
  const int64_t d = g.dim, rows = table.value.dim(0);
  const int64_t per_row = state_row_size(d);
  DLREC_CHECK(per_row == 0 || (table.state.defined() && table.state.numel() == rows * per_row),
              "Optimizer::step_sparse: ", optimizer_name(o_.kind),
              " state missing or of the wrong size (call init_state)");
  float* w = table.value.data<float>();
  float* s = per_row > 0 ? table.state.data<float>() : nullptr;
  // Each distinct row is owned by exactly one piece: no two threads write the same row.
  parallel_for(0, g.size(), 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t row = g.ids[u];
      if (row < 0 || row >= rows) fail("Optimizer::step_sparse: row ", row, " out of range");
      update_row(o_, w + row * d, s ? s + row * per_row : nullptr, g.values.data() + u * d, d,
                 lr, 1.f, 0.f);
    }
  });
}

}  // namespace dlrec::nn
