#include "train/data_parallel.h"

#include <cstring>
#include <unordered_map>

#include "dlrec/core/error.h"
#include "dlrec/nn/embedding_bag.h"

namespace dlrec::train {

void DataParallelReducer::reduce_dense(const std::vector<Tensor*>& grads) {
  bucket_.resize(kBucketFloats);
  size_t first = 0;
  while (first < grads.size()) {
    // Pack grads [first, last) into the bucket (a gradient larger than a bucket goes alone,
    // reduced in place).
    size_t last = first;
    int64_t used = 0;
    while (last < grads.size() && used + grads[last]->numel() <= kBucketFloats) {
      used += grads[last]->numel();
      ++last;
    }
    if (last == first) {
      Tensor& g = *grads[first];
      DLREC_CHECK(g.dtype() == DType::F32, "data-parallel: dense gradient of dtype ",
                  dtype_name(g.dtype()));
      comm_.all_reduce(g);
      ++first;
      continue;
    }
    int64_t at = 0;
    for (size_t k = first; k < last; ++k) {
      std::memcpy(bucket_.data() + at, grads[k]->data<float>(), grads[k]->nbytes());
      at += grads[k]->numel();
    }
    comm_.all_reduce(bucket_.data(), used);
    at = 0;
    for (size_t k = first; k < last; ++k) {
      std::memcpy(grads[k]->data<float>(), bucket_.data() + at, grads[k]->nbytes());
      at += grads[k]->numel();
    }
    first = last;
  }
}

void DataParallelReducer::reduce_sparse(const nn::SparseGrad& local, nn::SparseGrad& merged) {
  const int64_t dim = local.dim;
  const std::vector<int64_t> counts = comm_.all_gather_counts(local.size());
  int64_t total = 0;
  std::vector<int64_t> value_counts;
  for (int64_t c : counts) {
    total += c;
    value_counts.push_back(c * dim);
  }
  ids_.resize(total);
  values_.resize(total * dim);
  comm_.all_gather_v(local.ids.data(), ids_.data(), counts, dist::Elem::I64);
  comm_.all_gather_v(local.values.data(), values_.data(), value_counts, dist::Elem::F32);
  merged.dim = dim;
  merged.ids.clear();
  merged.values.clear();
  std::unordered_map<int64_t, int64_t> slot;
  slot.reserve(total * 2);
  for (int64_t u = 0; u < total; ++u) {
    auto [it, fresh] = slot.emplace(ids_[u], merged.size());
    const float* v = values_.data() + u * dim;
    if (fresh) {
      merged.ids.push_back(ids_[u]);
      merged.values.insert(merged.values.end(), v, v + dim);
    } else {
      float* m = merged.values.data() + it->second * dim;
      for (int64_t d = 0; d < dim; ++d) m[d] += v[d];
    }
  }
}

RowPiece batch_piece(int64_t global_rows, int64_t per_part, int part, int parts) {
  if (global_rows >= per_part * parts) return {per_part * part, per_part * (part + 1)};
  return {global_rows * part / parts, global_rows * (part + 1) / parts};
}

}  // namespace dlrec::train
