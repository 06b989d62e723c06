#include "dlrec/nn/fm.h"

#include <vector>

#include "dlrec/core/thread_pool.h"

namespace dlrec::nn {

FactorizationMachine::FactorizationMachine(int64_t num_fields, int64_t dim)
    : n_(num_fields), d_(dim) {
  DLREC_CHECK(num_fields >= 2 && dim > 0,
              "FactorizationMachine: needs at least 2 fields of a "
              "positive width, got ",
              num_fields, " fields of width ", dim);
}

const Tensor& FactorizationMachine::forward(const Tensor& v) {
  const int64_t B = check_matrix(v, n_ * d_, "FactorizationMachine::forward input");
  v_ = v;
  ensure_buffer(y_, {B, 1});
  const float* x = v.data<float>();
  float* y = y_.data<float>();
  const int64_t n = n_, d = d_;
  parallel_for(0, B, 64, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(d), q(d);
    for (int64_t b = lo; b < hi; ++b) {
      const float* xb = x + b * n * d;
      for (int64_t k = 0; k < d; ++k) s[k] = q[k] = 0.f;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < d; ++k) {
          s[k] += xb[i * d + k];
          q[k] += xb[i * d + k] * xb[i * d + k];
        }
      double acc = 0;
      for (int64_t k = 0; k < d; ++k) acc += static_cast<double>(s[k]) * s[k] - q[k];
      y[b] = static_cast<float>(0.5 * acc);
    }
  });
  return y_;
}

const Tensor& FactorizationMachine::backward(const Tensor& dy) {
  DLREC_CHECK(v_.defined(), "FactorizationMachine::backward called before forward");
  const int64_t B = v_.dim(0), n = n_, d = d_;
  DLREC_CHECK(check_matrix(dy, 1, "FactorizationMachine::backward dy") == B,
              "FactorizationMachine::backward: dy has ", dy.dim(0), " rows, the forward had ", B);
  ensure_buffer(dv_, {B, n * d});
  const float* x = v_.data<float>();
  const float* g = dy.data<float>();
  float* dv = dv_.data<float>();
  parallel_for(0, B, 64, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(d);
    for (int64_t b = lo; b < hi; ++b) {
      const float* xb = x + b * n * d;
      float* db = dv + b * n * d;
      for (int64_t k = 0; k < d; ++k) s[k] = 0.f;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < d; ++k) s[k] += xb[i * d + k];
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < d; ++k) db[i * d + k] = g[b] * (s[k] - xb[i * d + k]);
    }
  });
  return dv_;
}

}  // namespace dlrec::nn
