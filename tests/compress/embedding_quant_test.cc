// Row-wise INT8 / 4-bit embedding tables: the round trip's error bound (fp32 and fp16 scale and
// bias), the 4-bit packing, the config's bad inputs and the tables of a model; the CPU lookup of
// codes (nn::EmbeddingBag::set_quantized): its pooled rows bit for bit those of the fp32 table
// the codes dequantize to, the fp32 values released, bad records errors.
#include "dlrec/compress/embedding_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/compress/sparsity.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/model.h"
#include "dlrec/nn/embedding_bag.h"
#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::expect_error;

namespace {

Tensor random_table(int64_t rows, int64_t dim) {
  Tensor t = Tensor::empty({rows, dim}, DType::F32, Device::cpu());
  float* v = t.data<float>();
  for (int64_t i = 0; i < rows * dim; ++i)
    v[i] = std::sin(0.731f * static_cast<float>(i)) * (1.f + static_cast<float>(i % 13)) * 0.05f;
  for (int64_t k = 0; k < dim; ++k) v[3 * dim + k] = 0.25f;  // a constant row
  return t;
}

}  // namespace

TEST(EmbeddingQuant, RoundTripErrorIsWithinHalfAStep) {
  const int64_t rows = 64, dim = 13;  // odd dim: the last int4 byte holds one value
  const Tensor t = random_table(rows, dim);
  for (int bits : {8, 4})
    for (bool fp16 : {false, true}) {
      const compress::RowQuantTable q = compress::quantize_rows(t, bits, fp16);
      ASSERT_EQ(q.row_bytes(), bits == 8 ? dim : (dim + 1) / 2);
      std::vector<float> row(dim);
      const float* v = t.data<float>();
      for (int64_t r = 0; r < rows; ++r) {
        nn::row_quant_dequantize(q, r, row.data());
        float mn = v[r * dim], mx = v[r * dim];
        for (int64_t k = 0; k < dim; ++k) {
          mn = std::min(mn, v[r * dim + k]);
          mx = std::max(mx, v[r * dim + k]);
        }
        // fp32: half a step (plus float rounding); fp16: the rounded bias's offset and the
        // rounded scale's drift over the levels on top.
        const double levels = (1 << bits) - 1;
        double bound = q.scale[r] / 2 + 1e-6 * (std::abs(mx) + std::abs(mn));
        if (fp16)
          bound += std::abs(q.bias[r] - mn) + levels * std::abs(q.scale[r] - (mx - mn) / levels);
        for (int64_t k = 0; k < dim; ++k)
          EXPECT_LE(std::abs(row[k] - v[r * dim + k]), bound)
              << "bits " << bits << " fp16 " << fp16 << " row " << r << " col " << k;
      }
      // The constant row comes back exactly (fp32) or to the bias's fp16 rounding.
      nn::row_quant_dequantize(q, 3, row.data());
      for (float x : row) EXPECT_NEAR(x, 0.25f, fp16 ? 1e-4 : 0.0);
      EXPECT_LT(q.bytes(), rows * dim * 4);
    }
}

TEST(EmbeddingQuant, ConfigBadInputs) {
  auto parse = [](const char* text) {
    return compress::CompressConfig::from_json(parse_json(text, "test"));
  };
  const auto c =
      parse(R"({"embeddings": {"dtype": "int4", "tables": ["emb.0"], "scale_bias": "fp16"}})");
  EXPECT_EQ(c.embeddings.bits, 4);
  EXPECT_TRUE(c.embeddings.fp16_scale_bias);
  EXPECT_EQ(compress::CompressConfig::from_json(c.to_json()).to_json(), c.to_json());
  expect_error([&] { parse(R"({"embeddings": {"dtype": "int2"}})"); }, {"dtype", "int2"});
  expect_error([&] { parse(R"({"embeddings": {"tables": []}})"); }, {"compress.embeddings.tables"});
  expect_error([&] { parse(R"({"embeddings": {"scale_bias": "bf16"}})"); }, {"scale_bias"});
  expect_error([&] { parse(R"({"embeddings": {"bits": 8}})"); }, {"bits"});
}

TEST(EmbeddingQuant, QuantizesTheModelsTablesInPlace) {
  io::ShardLayout layout;
  layout.num_dense = 4;
  layout.cardinalities = {50, 30};
  layout.multi_hot = {false, false};
  model::RunConfig cfg = model::RunConfig::from_json(parse_json(R"({
      "model": {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [8, 8], "top_mlp": [8, 1]}})",
                                                                "test config"));
  auto m = model::build_model(cfg.model, cfg.optimizer, layout, Device::cpu(), 3);
  compress::EmbeddingQuantConfig e;
  e.on = true;
  const auto all = compress::quantize_embedding_tables(e, *m);
  ASSERT_EQ(all.size(), 2u);
  for (const auto& r : all) {
    EXPECT_GT(r.max_abs_err, 0.0) << r.table;
    EXPECT_LT(r.rel_l2, 0.01) << r.table;  // int8 of a uniform init: ~0.2 % of the values
  }
  // Quantizing again changes nothing (the values are on the grid already).
  const auto again = compress::quantize_embedding_tables(e, *m);
  for (const auto& r : again) EXPECT_LT(r.max_abs_err, 1e-6) << r.table;
  e.all_tables = false;
  e.tables = {"nope"};
  expect_error([&] { compress::quantize_embedding_tables(e, *m); },
               {"compress.embeddings.tables: 'nope'", all[0].table});
}

// The CPU lookup of codes (nn::EmbeddingBag::set_quantized).
TEST(EmbeddingQuantLookup, PoolsBitForBitLikeTheDequantizedTable) {
  const int64_t rows = 97, dim = 13, batch = 40;
  const Tensor t = random_table(rows, dim);
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
  const Tensor t = random_table(rows, dim);
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
  q = compress::quantize_rows(random_table(rows + 1, dim), 4, false);
  expect_error([&] { set(q); }, {"the table is [8, 5]"});
}
