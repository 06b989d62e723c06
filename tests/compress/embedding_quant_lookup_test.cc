// The CPU lookup of row-wise INT8 / 4-bit codes (nn::EmbeddingBag::set_quantized): its pooled
// rows are bit for bit those of the fp32 table the codes dequantize to (sum and mean, 8 and 4
// bits, fp32 and fp16 scale/bias), the fp32 values are released, and bad records are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/compress/embedding_quant.h"
#include "dlrec/nn/embedding_bag.h"
#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::expect_error;

namespace {

Tensor table_values(int64_t rows, int64_t dim) {
  Tensor t = Tensor::empty({rows, dim}, DType::F32, Device::cpu());
  float* v = t.data<float>();
  for (int64_t i = 0; i < rows * dim; ++i)
    v[i] = std::cos(0.377f * static_cast<float>(i)) * (0.5f + static_cast<float>(i % 7)) * 0.03f;
  for (int64_t k = 0; k < dim; ++k) v[5 * dim + k] = -0.125f;  // a constant row
  return t;
}

}  // namespace

TEST(EmbeddingQuantLookup, PoolsBitForBitLikeTheDequantizedTable) {
  const int64_t rows = 97, dim = 13, batch = 40;
  const Tensor t = table_values(rows, dim);
  std::vector<int64_t> offsets{0}, indices;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t len = r % 5;  // empty bags too
    for (int64_t j = 0; j < len; ++j) indices.push_back((r * 31 + j * 17) % rows);
    offsets.push_back(static_cast<int64_t>(indices.size()));
  }
  for (nn::Pooling pooling : {nn::Pooling::Sum, nn::Pooling::Mean})
    for (int bits : {8, 4})
      for (bool fp16 : {false, true}) {
        const compress::RowQuantTable q = compress::quantize_rows(t, bits, fp16);
        nn::EmbeddingBag dense(rows, dim, pooling), coded(rows, dim, pooling);
        float* w = dense.weight().value.data<float>();
        for (int64_t r = 0; r < rows; ++r) nn::row_quant_dequantize(q, r, w + r * dim);
        coded.set_quantized(q, "test table");
        EXPECT_EQ(coded.weight().value.numel(), 0);  // the fp32 values are released
        ASSERT_NE(coded.quantized(), nullptr);
        const Tensor a = dense.forward(offsets, indices, false);
        const Tensor b = coded.forward(offsets, indices, false);
        ASSERT_EQ(a.numel(), b.numel());
        EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.numel() * sizeof(float)), 0)
            << "bits " << bits << " fp16 " << fp16;
        expect_error([&] { coded.forward(offsets, indices, true); }, {"cannot train"});
      }
}

TEST(EmbeddingQuantLookup, BadRecordsAreErrors) {
  const int64_t rows = 8, dim = 5;
  const Tensor t = table_values(rows, dim);
  const compress::RowQuantTable good = compress::quantize_rows(t, 4, false);
  auto set = [&](compress::RowQuantTable q) {
    nn::EmbeddingBag bag(rows, dim);
    bag.set_quantized(std::move(q), "emb.3");
  };
  set(good);
  compress::RowQuantTable q = good;
  q.codes.pop_back();  // truncated
  expect_error([&] { set(q); }, {"emb.3: holds 23 code bytes"});
  q = good;
  q.codes.push_back(0);  // a wrong code count
  expect_error([&] { set(q); }, {"needs 24"});
  q = good;
  q.scale[2] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { set(q); }, {"row 2's scale is"});
  q = good;
  q.scale[1] = std::numeric_limits<float>::infinity();
  expect_error([&] { set(q); }, {"row 1's scale is inf"});
  q = good;
  q.bias[4] = -std::numeric_limits<float>::infinity();
  expect_error([&] { set(q); }, {"row 4's bias is"});
  q = good;
  q.scale.pop_back();
  expect_error([&] { set(q); }, {"7 scales and 8 biases"});
  q = good;
  q.codes[2] |= 0xF0;  // odd dim: the last byte's high nibble is unused
  expect_error([&] { set(q); }, {"unused high nibble"});
  q = good;
  q.bits = 2;
  expect_error([&] { set(q); }, {"bits must be 8 or 4"});
  q = compress::quantize_rows(table_values(rows + 1, dim), 4, false);
  expect_error([&] { set(q); }, {"the table is [8, 5]"});
}
