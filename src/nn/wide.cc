#include "dlrec/nn/wide.h"

#include "dlrec/core/thread_pool.h"

namespace dlrec::nn {

WideLinear::WideLinear(const std::vector<int64_t>& cardinalities, Pooling pooling) {
  DLREC_CHECK(!cardinalities.empty(), "WideLinear: needs at least one categorical feature");
  tables_.reserve(cardinalities.size());
  for (int64_t c : cardinalities) tables_.emplace_back(c, 1, pooling);  // zero-filled
  b_.value = Tensor::zeros({1}, DType::F32);
  b_.grad = Tensor::zeros({1}, DType::F32);
  grads_.assign(cardinalities.size(), nullptr);
}

const Tensor& WideLinear::forward(const std::vector<Bags>& bags, int64_t batch_rows,
                                  bool training) {
  const int64_t T = static_cast<int64_t>(tables_.size()), B = batch_rows;
  DLREC_CHECK(static_cast<int64_t>(bags.size()) == T, "WideLinear::forward: ", bags.size(),
              " features given, the layer has ", T);
  ensure_buffer(parts_, {B, T});
  ensure_buffer(y_, {B, 1});
  float* parts = parts_.data<float>();
  for (int64_t t = 0; t < T; ++t)
    tables_[t].forward(bags[t].offsets, bags[t].indices, B, parts + t, T, training);
  const float b = b_.value.data<float>()[0];
  float* y = y_.data<float>();
  parallel_for(0, B, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float acc = b;
      for (int64_t t = 0; t < T; ++t) acc += parts[r * T + t];
      y[r] = acc;
    }
  });
  return y_;
}

void WideLinear::backward(const Tensor& dy) {
  const int64_t B = check_matrix(dy, 1, "WideLinear::backward dy");
  DLREC_CHECK(B == parts_.dim(0), "WideLinear::backward: dy has ", B, " rows, the forward had ",
              parts_.dim(0));
  const float* g = dy.data<float>();
  double sum = 0;
  for (int64_t r = 0; r < B; ++r) sum += g[r];
  b_.grad.data<float>()[0] = static_cast<float>(sum);
  for (size_t t = 0; t < tables_.size(); ++t) grads_[t] = &tables_[t].backward(g, 1);
}

}  // namespace dlrec::nn
