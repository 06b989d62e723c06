#include "dlrec/nn/cross.h"

#include <cstring>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/rng.h"

namespace dlrec::nn {

CrossNet::CrossNet(int64_t features, int64_t num_layers, int64_t low_rank)
    : f_(features), r_(low_rank) {
  DLREC_CHECK(features > 0, "CrossNet: the input width must be positive, got ", features);
  DLREC_CHECK(num_layers >= 1, "CrossNet: needs at least one layer, got ", num_layers);
  DLREC_CHECK(low_rank >= 0 && low_rank <= features, "CrossNet: low_rank must be in 0 .. ",
              features, " (the input width), got ", low_rank);
  w_.reserve(num_layers);
  v_.reserve(r_ > 0 ? num_layers : 0);
  for (int64_t l = 0; l < num_layers; ++l) {
    if (r_ > 0) {
      v_.emplace_back(f_, r_);
      w_.emplace_back(r_, f_);
    } else {
      w_.emplace_back(f_, f_);
    }
  }
  xs_.resize(num_layers);
  us_.resize(num_layers);
}

void CrossNet::init(uint64_t seed) {
  for (size_t l = 0; l < w_.size(); ++l) {
    const uint64_t s = derive_seed(seed, l);
    w_[l].init(derive_seed(s, 0));
    w_[l].bias().value.zero_();
    if (r_ > 0) {
      v_[l].init(derive_seed(s, 1));
      v_[l].bias().value.zero_();
    }
  }
}

const Tensor& CrossNet::forward(const Tensor& x0) {
  const int64_t B = check_matrix(x0, f_, "CrossNet::forward input");
  x0_ = x0;
  const int64_t F = f_;
  const float* a = x0.data<float>();
  for (size_t l = 0; l < w_.size(); ++l) {
    const Tensor& xl = l == 0 ? x0 : xs_[l - 1];
    // The Linear's output buffer lives until its next forward: a handle to it is enough.
    us_[l] = r_ > 0 ? w_[l].forward(v_[l].forward(xl)) : w_[l].forward(xl);
    ensure_buffer(xs_[l], {B, F});
    const float* up = us_[l].data<float>();
    const float* xp = xl.data<float>();
    float* out = xs_[l].data<float>();
    parallel_for(0, B * F, 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) out[i] = a[i] * up[i] + xp[i];
    });
  }
  return xs_.back();
}

const Tensor& CrossNet::backward(const Tensor& dy) {
  DLREC_CHECK(x0_.defined(), "CrossNet::backward called before forward");
  const int64_t B = x0_.dim(0), F = f_;
  DLREC_CHECK(check_matrix(dy, F, "CrossNet::backward dy") == B, "CrossNet::backward: dy has ",
              dy.dim(0), " rows, the forward had ", B);
  ensure_buffer(dx0_, {B, F});
  ensure_buffer(du_, {B, F});
  ensure_buffer(g_, {B, F});
  std::memcpy(g_.data<float>(), dy.data<float>(), B * F * sizeof(float));
  dx0_.zero_();
  const float* a = x0_.data<float>();
  float* g = g_.data<float>();
  float* du = du_.data<float>();
  float* dx0 = dx0_.data<float>();
  for (size_t l = w_.size(); l-- > 0;) {
    // x_{l+1} = x0 * u + x_l, u = W x_l + b: dx0 += g * u, du = g * x0, dx_l = g + W^T du.
    const float* u = us_[l].data<float>();
    parallel_for(0, B * F, 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        dx0[i] += g[i] * u[i];
        du[i] = g[i] * a[i];
      }
    });
    const Tensor& dh = w_[l].backward(du_);
    const Tensor& dxl = r_ > 0 ? v_[l].backward(dh) : dh;
    const float* d = dxl.data<float>();
    parallel_for(0, B * F, 1 << 14, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) g[i] += d[i];
    });
  }
  // x_0 is x0 itself: the residual path's gradient joins the x0 * u terms.
  parallel_for(0, B * F, 1 << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) dx0[i] += g[i];
  });
  return dx0_;
}

std::vector<std::pair<std::string, Param*>> CrossNet::params() {
  std::vector<std::pair<std::string, Param*>> out;
  for (size_t l = 0; l < w_.size(); ++l) {
    const std::string p = std::to_string(l);
    out.emplace_back(p + ".w.weight", &w_[l].weight());
    out.emplace_back(p + ".w.bias", &w_[l].bias());
    if (r_ > 0) out.emplace_back(p + ".v.weight", &v_[l].weight());
  }
  return out;
}

}  // namespace dlrec::nn
