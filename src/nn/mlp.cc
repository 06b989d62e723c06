#include "dlrec/nn/mlp.h"

#include "dlrec/nn/rng.h"

namespace dlrec::nn {

MLP::MLP(int64_t in_features, const std::vector<int64_t>& sizes, bool relu_last)
    : in_(in_features) {
  DLREC_CHECK(in_ > 0, "MLP: input size must be positive, got ", in_);
  int64_t prev = in_;
  layers_.reserve(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const bool last = k + 1 == sizes.size();
    layers_.emplace_back(prev, sizes[k],
                         (!last || relu_last) ? Activation::ReLU : Activation::None);
    prev = sizes[k];
  }
}

void MLP::init(uint64_t seed) {
  for (size_t k = 0; k < layers_.size(); ++k) layers_[k].init(derive_seed(seed, k));
}

const Tensor& MLP::forward(const Tensor& x) {
  const Tensor* h = &x;
  for (auto& l : layers_) h = &l.forward(*h);
  return *h;
}

const Tensor& MLP::backward(const Tensor& dy, bool need_dx) {
  const Tensor* g = &dy;
  for (size_t k = layers_.size(); k-- > 0;) g = &layers_[k].backward(*g, need_dx || k > 0);
  return *g;
}

}  // namespace dlrec::nn
