#include "dlrec/nn/optimizer.h"

#include <algorithm>
#include <cmath>

#include "dlrec/core/thread_pool.h"

namespace dlrec::nn {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptimizerKind::SGD;
  if (s == "adagrad") return OptimizerKind::Adagrad;
  fail("unknown optimizer '", s, "' (expected sgd or adagrad)");
}

Optimizer::Optimizer(OptimizerKind kind, float eps, float initial_accumulator)
    : kind_(kind), eps_(eps), init_(initial_accumulator) {
  DLREC_CHECK(eps >= 0 && initial_accumulator >= 0,
              "Optimizer: eps and the initial accumulator must be >= 0");
}

void Optimizer::init_state(Param& p) const {
  if (kind_ != OptimizerKind::Adagrad) {
    p.state = Tensor();
    return;
  }
  p.state = Tensor::empty(p.value.shape(), DType::F32);
  float* a = p.state.data<float>();
  const float v = init_;
  parallel_for(0, p.state.numel(), 1 << 16, [&](int64_t lo, int64_t hi) {
    std::fill(a + lo, a + hi, v);
  });
}

void Optimizer::step(Param& p, float lr) const {
  DLREC_CHECK(p.grad.defined() && p.grad.shape() == p.value.shape(),
              "Optimizer::step: the parameter has no dense gradient of its shape");
  float* w = p.value.data<float>();
  const float* g = p.grad.data<float>();
  const int64_t n = p.value.numel();
  if (kind_ == OptimizerKind::SGD) {
    parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) w[i] -= lr * g[i];
    });
    return;
  }
  DLREC_CHECK(p.state.defined() && p.state.shape() == p.value.shape(),
              "Optimizer::step: Adagrad state missing (call init_state)");
  float* a = p.state.data<float>();
  const float eps = eps_;
  parallel_for(0, n, 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      a[i] += g[i] * g[i];
      w[i] -= lr * g[i] / (std::sqrt(a[i]) + eps);
    }
  });
}

void Optimizer::step_sparse(Param& table, const SparseGrad& g, float lr) const {
  DLREC_CHECK(table.value.ndim() == 2 && table.value.dim(1) == g.dim,
              "Optimizer::step_sparse: gradient dim ", g.dim, " does not match the table ",
              shape_str(table.value.shape()));
  DLREC_CHECK(static_cast<int64_t>(g.values.size()) == g.size() * g.dim,
              "Optimizer::step_sparse: malformed sparse gradient");
  const bool ada = kind_ == OptimizerKind::Adagrad;
  DLREC_CHECK(!ada || (table.state.defined() && table.state.shape() == table.value.shape()),
              "Optimizer::step_sparse: Adagrad state missing (call init_state)");
  float* w = table.value.data<float>();
  float* a = ada ? table.state.data<float>() : nullptr;
  const int64_t d = g.dim, rows = table.value.dim(0);
  const float eps = eps_;
  // Each distinct row is owned by exactly one piece: no two threads write the same row.
  parallel_for(0, g.size(), 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t row = g.ids[u];
      if (row < 0 || row >= rows) fail("Optimizer::step_sparse: row ", row, " out of range");
      float* wr = w + row * d;
      const float* gr = g.values.data() + u * d;
      if (!ada) {
        for (int64_t k = 0; k < d; ++k) wr[k] -= lr * gr[k];
      } else {
        float* ar = a + row * d;
        for (int64_t k = 0; k < d; ++k) {
          ar[k] += gr[k] * gr[k];
          wr[k] -= lr * gr[k] / (std::sqrt(ar[k]) + eps);
        }
      }
    }
  });
}

}  // namespace dlrec::nn
