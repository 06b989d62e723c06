// EmbeddingBag pooling and its sparse gradient against dense finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "dlrec/core/thread_pool.h"
#include "dlrec/nn/embedding_bag.h"
#include "nn/grad_check.h"

namespace dlrec::nn {
namespace {

using testing::expect_grad_close;
using testing::numeric_grad;
using testing::random_tensor;

struct Bags {
  std::vector<int64_t> offsets, indices;
};

// One-hot: one id per sample.
Bags one_hot() { return {{0, 1, 2, 3, 4}, {3, 0, 3, 7}}; }
// Multi-hot with a duplicate id inside a bag, ids shared across samples and empty bags.
Bags multi_hot() { return {{0, 3, 3, 4, 8, 8}, {2, 5, 2, 9, 5, 1, 1, 0}}; }

void check_sparse_grad(Pooling pooling, const Bags& bags) {
  const int64_t rows = 10, dim = 3;
  EmbeddingBag emb(rows, dim, pooling);
  emb.init(5);
  const int64_t B = static_cast<int64_t>(bags.offsets.size()) - 1;
  Tensor r = random_tensor({B, dim}, 8);
  auto loss = [&] { return testing::dot_loss(emb.forward(bags.offsets, bags.indices, false), r); };
  emb.forward(bags.offsets, bags.indices, true);
  const SparseGrad& g = emb.backward(r);

  // Expand the sparse gradient to a dense one; ids must be distinct.
  std::set<int64_t> distinct(g.ids.begin(), g.ids.end());
  ASSERT_EQ(distinct.size(), g.ids.size()) << "ids are not de-duplicated";
  std::set<int64_t> expected(bags.indices.begin(), bags.indices.end());
  EXPECT_EQ(distinct, expected) << "sparse gradient rows must be exactly the batch's ids";
  std::vector<float> dense(rows * dim, 0.f);
  for (int64_t u = 0; u < g.size(); ++u)
    for (int64_t k = 0; k < dim; ++k) dense[g.ids[u] * dim + k] = g.values[u * dim + k];

  // Pooling is linear in the table, so differences are exact up to rounding; rows not in the
  // batch must have a zero numeric gradient and be absent from the sparse one.
  auto num = numeric_grad(emb.weight().value, loss, 1e-2);
  expect_grad_close(num, dense.data(), 1e-4, 1e-3, "table gradient");
  for (int64_t row = 0; row < rows; ++row)
    if (!expected.count(row)) {
      for (int64_t k = 0; k < dim; ++k) EXPECT_EQ(num[row * dim + k], 0.0);
    }
}

TEST(EmbeddingBag, SparseGradSumOneHot) { check_sparse_grad(Pooling::Sum, one_hot()); }
TEST(EmbeddingBag, SparseGradSumMultiHot) { check_sparse_grad(Pooling::Sum, multi_hot()); }
TEST(EmbeddingBag, SparseGradMeanOneHot) { check_sparse_grad(Pooling::Mean, one_hot()); }
TEST(EmbeddingBag, SparseGradMeanMultiHot) { check_sparse_grad(Pooling::Mean, multi_hot()); }

TEST(EmbeddingBag, ForwardPoolsAndEmptyBagsAreZero) {
  EmbeddingBag sum(10, 2, Pooling::Sum), mean(10, 2, Pooling::Mean);
  sum.init(3);
  mean.init(3);
  const Bags b = multi_hot();
  Tensor s = sum.forward(b.offsets, b.indices, false);
  Tensor m = mean.forward(b.offsets, b.indices, false);
  const float* w = sum.weight().value.data<float>();
  for (int64_t r = 0; r < 5; ++r) {
    const int64_t len = b.offsets[r + 1] - b.offsets[r];
    for (int64_t k = 0; k < 2; ++k) {
      double acc = 0;
      for (int64_t p = b.offsets[r]; p < b.offsets[r + 1]; ++p) acc += w[b.indices[p] * 2 + k];
      EXPECT_NEAR(s.data<float>()[r * 2 + k], acc, 1e-6);
      EXPECT_NEAR(m.data<float>()[r * 2 + k], len ? acc / len : 0.0, 1e-6);
      if (len == 0) {
        EXPECT_EQ(s.data<float>()[r * 2 + k], 0.f);
        EXPECT_EQ(m.data<float>()[r * 2 + k], 0.f);
      }
    }
  }
}

TEST(EmbeddingBag, DuplicateIdsAcrossBatchAreSummedOnce) {
  EmbeddingBag emb(4, 1, Pooling::Sum);
  emb.forward({0, 1, 2, 4}, {2, 2, 2, 2}, true);
  Tensor dout = Tensor::from_vector<float>({1.f, 10.f, 100.f}, {3, 1});
  const SparseGrad& g = emb.backward(dout);
  ASSERT_EQ(g.ids, (std::vector<int64_t>{2}));
  EXPECT_FLOAT_EQ(g.values[0], 1.f + 10.f + 2 * 100.f);
}

TEST(EmbeddingBag, RejectsBadIdsAndBackwardWithoutForward) {
  EmbeddingBag emb(4, 2);
  EXPECT_THROW(emb.backward(Tensor::zeros({1, 2}, DType::F32)), Error);
  EXPECT_THROW(emb.forward({0, 1}, {4}, true), Error);
  EXPECT_THROW(emb.forward({0, 1}, {-1}, false), Error);
  EXPECT_THROW(emb.forward({0, 2}, {1}, false), Error);  // offsets beyond the ids
  EXPECT_THROW(EmbeddingBag(0, 2), Error);
}

TEST(EmbeddingBag, InitIsBoundedAndThreadCountIndependent) {
  EmbeddingBag a(5000, 8), b(5000, 8);
  set_num_threads(1);
  a.init(99);
  set_num_threads(4);
  b.init(99);
  set_num_threads(0);
  auto va = a.weight().value.to_vector<float>();
  EXPECT_EQ(va, b.weight().value.to_vector<float>());
  const float bound = std::sqrt(1.f / 5000);
  float lo = 1, hi = -1;
  for (float v : va) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.9f * bound);
  EXPECT_GT(hi, 0.9f * bound);
}

TEST(EmbeddingBag, LargeBatchGradIsThreadCountIndependent) {
  // Many samples, heavy duplication: the per-row sums must not depend on the thread count.
  const int64_t B = 20000, rows = 50, dim = 4;
  Rng rng(1);
  std::vector<int64_t> off(B + 1), idx;
  for (int64_t r = 0; r < B; ++r) {
    off[r] = static_cast<int64_t>(idx.size());
    const int64_t len = rng.below(4);
    for (int64_t j = 0; j < len; ++j) idx.push_back(rng.below(rows));
  }
  off[B] = static_cast<int64_t>(idx.size());
  Tensor dout = random_tensor({B, dim}, 2);
  std::vector<std::vector<float>> results;
  std::vector<std::vector<float>> pooled;
  for (int threads : {1, 2, 5}) {
    set_num_threads(threads);
    EmbeddingBag emb(rows, dim, Pooling::Mean);
    emb.init(4);
    pooled.push_back(emb.forward(off, idx, true).to_vector<float>());
    results.push_back(emb.backward(dout).values);
  }
  set_num_threads(0);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  EXPECT_EQ(pooled[0], pooled[2]);
}

}  // namespace
}  // namespace dlrec::nn
