// INT8 PTQ units: the quantized arithmetic (AVX2 kernel against the scalar reference, both
// against fp32), weight scales with 2:4 masks, calibration thresholds, the config section and
// its errors, calibration on a model (NaN activations, skip lists).
#include "dlrec/compress/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dlrec/compress/sparsity.h"
#include "dlrec/io/synthetic_batch.h"
#include "dlrec/nn/param.h"
#include "test_errors.h"

using namespace dlrec;
using dlrec::testing::expect_error;

namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint64_t seed, float scale = 1.f) {
  Tensor t = Tensor::empty({rows, cols}, DType::F32, Device::cpu());
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n(g);
  return t;
}

// The fp32 Linear: act(x W^T + b), in double.
std::vector<double> fp32_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu) {
  const int64_t B = x.dim(0), in = x.dim(1), out = w.dim(0);
  std::vector<double> y(static_cast<size_t>(B * out));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double s = b.data<float>()[j];
      for (int64_t k = 0; k < in; ++k)
        s += static_cast<double>(x.data<float>()[r * in + k]) * w.data<float>()[j * in + k];
      y[r * out + j] = relu ? std::max(s, 0.0) : s;
    }
  return y;
}

model::RunConfig small_config(const std::string& arch) {
  json j = parse_json(arch == "dcnv2" ? R"({"model": {"arch": "dcnv2", "embedding_dim": 4,
      "bottom_mlp": [8, 4], "top_mlp": [16, 1], "cross_layers": 2, "cross_low_rank": 4}})"
                                      : R"({"model": {"embedding_dim": 4, "bottom_mlp": [8, 4],
      "top_mlp": [8, 1], "interaction": "cat"}})",
                      "test config");
  return model::RunConfig::from_json(j);
}

io::ShardLayout small_layout() {
  io::ShardLayout l;
  l.num_dense = 4;
  l.cardinalities = {20, 100, 7};
  l.multi_hot = {false, false, false};
  return l;
}

compress::QuantizeConfig quant_config(const std::string& text) {
  return compress::CompressConfig::from_json(parse_json(text, "test")).quantize;
}

}  // namespace

// A kernel's layer output against the scalar reference, bit for bit, on shapes with tails in
// every blocked dimension (rows % 8, in % 4 and % 16, out % 4 and % 16) and inputs beyond the
// calibrated range (clamped), infinite or -0.
static void expect_kernel_equals_reference(compress::Int8Kernel kernel) {
  for (auto [B, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 3, 1},
                            {7, 16, 4},
                            {300, 37, 13},
                            {513, 128, 64},
                            {64, 1024, 6},
                            {9, 5, 33},
                            {17, 479, 50}}) {
    Tensor x = random_matrix(B, in, 1 + in, 2.f);
    float* xs = x.data<float>();
    xs[0] = 1e30f;
    if (x.numel() > 2) xs[1] = -std::numeric_limits<float>::infinity(), xs[2] = -0.f;
    if (x.numel() > 3) xs[3] = 6.35f;  // x / 0.05 = 127: the edge of the range
    const Tensor w = random_matrix(out, in, 2 + out, 0.1f);
    Tensor bias = random_matrix(1, out, 3, 0.1f);
    bias = bias.reshape({out});
    const compress::QuantWeight q = compress::quantize_weight(w);
    for (const bool relu : {true, false}) {
      Tensor y_k, y_ref, y_layer;
      compress::int8_linear(x, 0.05f, q, bias, relu, y_k, kernel);
      compress::int8_linear(x, 0.05f, q, bias, relu, y_ref, compress::Int8Kernel::Reference);
      ASSERT_EQ(y_k.numel(), B * out);
      for (int64_t i = 0; i < y_k.numel(); ++i)
        ASSERT_EQ(y_k.data<float>()[i], y_ref.data<float>()[i])
            << compress::int8_kernel_name(kernel) << " B=" << B << " in=" << in << " out=" << out
            << " element " << i;
      // The inference record (its weight packed once where the CPU has VNNI): the same bits.
      compress::Int8Linear layer(q, 0.05f);
      ASSERT_TRUE(layer.forward(x, bias, relu, y_layer));
      for (int64_t i = 0; i < y_layer.numel(); ++i)
        ASSERT_EQ(y_layer.data<float>()[i], y_ref.data<float>()[i]) << "Int8Linear, element " << i;
    }
  }
}

TEST(Int8Gemm, Avx2KernelEqualsTheScalarReferenceBitForBit) {
  if (!compress::int8_kernel_available(compress::Int8Kernel::Avx2))
    GTEST_SKIP() << "this CPU has no AVX2";
  expect_kernel_equals_reference(compress::Int8Kernel::Avx2);
}

TEST(Int8Gemm, Avx512VnniKernelEqualsTheScalarReferenceBitForBit) {
  if (!compress::int8_kernel_available(compress::Int8Kernel::Avx512Vnni))
    GTEST_SKIP() << "this CPU has no AVX-512 VNNI";
  expect_kernel_equals_reference(compress::Int8Kernel::Avx512Vnni);
  EXPECT_EQ(compress::int8_best_kernel(), compress::Int8Kernel::Avx512Vnni);
}

TEST(Int8Gemm, ReferenceGemmIsTheExactIntegerProduct) {
  const int8_t x[6] = {127, -127, 3, 0, 1, -1};   // [2, 3]
  const int8_t w[6] = {127, 127, 2, -5, 0, 100};  // [2, 3]
  int32_t acc[4];
  compress::int8_gemm_reference(x, w, 2, 2, 3, acc);
  EXPECT_EQ(acc[0], 127 * 127 - 127 * 127 + 6);
  EXPECT_EQ(acc[1], -635 + 300);
  EXPECT_EQ(acc[2], 127 - 2);
  EXPECT_EQ(acc[3], -100);
}

TEST(Int8Gemm, CloseToFp32WhenTheRangeCoversTheInput) {
  const int64_t B = 200, in = 64, out = 32;
  const Tensor x = random_matrix(B, in, 5, 1.f);
  const Tensor w = random_matrix(out, in, 6, 0.2f);
  Tensor bias = random_matrix(1, out, 7, 0.1f).reshape({out});
  float amax = 0;
  for (int64_t i = 0; i < x.numel(); ++i) amax = std::max(amax, std::fabs(x.data<float>()[i]));
  const compress::QuantWeight q = compress::quantize_weight(w);
  Tensor y;
  compress::int8_linear(x, amax / 127.f, q, bias, false, y);
  const std::vector<double> ref = fp32_linear(x, w, bias, false);
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e2 += (y.data<float>()[i] - ref[i]) * (y.data<float>()[i] - ref[i]);
    r2 += ref[i] * ref[i];
  }
  EXPECT_LT(std::sqrt(e2 / r2), 0.03);  // int8 of Gaussian data: ~1 % relative L2
  EXPECT_GT(std::sqrt(e2 / r2), 0.0);   // and it is really quantized
}

TEST(Int8Weights, PerChannelScalesKeepMaskedZerosAndRoundTheRest) {
  Tensor w = random_matrix(8, 16, 9, 0.3f);
  Tensor mask = Tensor::empty(w.shape(), DType::F32, Device::cpu());
  compress::compute_mask_2_4(w, 0.5, mask);
  for (int64_t i = 0; i < w.numel(); ++i)
    if (mask.data<float>()[i] == 0.f) w.data<float>()[i] = 0.f;
  for (int64_t k = 0; k < 16; ++k) w.data<float>()[3 * 16 + k] = 0.f;  // an all-zero row
  const compress::QuantWeight q = compress::quantize_weight(w);
  EXPECT_EQ(q.scales[3], 1.f);
  for (int64_t j = 0; j < 8; ++j) {
    float amax = 0;
    int hit127 = 0;
    for (int64_t k = 0; k < 16; ++k) {
      const float v = w.data<float>()[j * 16 + k];
      amax = std::max(amax, std::fabs(v));
      const int8_t qv = q.q[j * 16 + k];
      if (v == 0.f) {
        EXPECT_EQ(qv, 0) << j << "," << k;
      }
      EXPECT_LE(std::fabs(qv * q.scales[j] - v), q.scales[j] * 0.5f + 1e-7f);
      hit127 += std::abs(qv) == 127;
    }
    if (amax > 0) {
      EXPECT_FLOAT_EQ(q.scales[j], amax / 127.f);
      EXPECT_GE(hit127, 1);  // the largest value of each channel maps to +-127
    }
  }
}

TEST(Int8Weights, QuantizeValueRoundsHalfToEvenAndClamps) {
  EXPECT_EQ(compress::quantize_value(2.5f, 1.f), 2);
  EXPECT_EQ(compress::quantize_value(3.5f, 1.f), 4);
  EXPECT_EQ(compress::quantize_value(-2.5f, 1.f), -2);
  EXPECT_EQ(compress::quantize_value(1000.f, 1.f), 127);
  EXPECT_EQ(compress::quantize_value(-1000.f, 1.f), -127);  // symmetric: never -128
}

TEST(Int8Calibration, ThresholdsOfTheThreeMethods) {
  // |x| half-normal (sigma = 100 bins = 0.9766) over [0, 20), rounded down to whole counts (the
  // far tail is empty), plus 10 outliers in the last bin.
  compress::AbsHistogram h;
  h.range = 20.0;
  h.counts.assign(2048, 0.0);
  for (int64_t k = 0; k < 2048; ++k) {
    h.counts[k] = std::floor(1e5 * std::exp(-0.5 * (k / 100.0) * (k / 100.0)));
  }
  h.counts[2047] += 10;
  const double sigma = 100 * 20.0 / 2048, amax = 20.0;
  EXPECT_EQ(compress::threshold_from_histogram(h, amax, "max", 99.99), 20.0);
  // 99.9 % of a half-normal lies below 3.29 sigma.
  const double p = compress::threshold_from_histogram(h, amax, "percentile", 99.9);
  EXPECT_NEAR(p, 3.29 * sigma, 0.05 * sigma);
  const double p2 = compress::threshold_from_histogram(h, amax, "percentile", 99.99999999);
  EXPECT_GT(p2, 19.9);  // beyond the outliers' share: everything
  const double e = compress::threshold_from_histogram(h, amax, "entropy", 0);
  EXPECT_GT(e, 2 * sigma);  // keeps the bulk
  EXPECT_LT(e, 8 * sigma);  // clips the outliers
  // Uniform data with outliers far out: merging bins loses nothing, so entropy keeps the range.
  compress::AbsHistogram u;
  u.range = 10.0;
  u.counts.assign(2048, 0.0);
  for (int64_t k = 0; k < 205; ++k) u.counts[k] = 1000;
  u.counts[2047] = 10;
  EXPECT_EQ(compress::threshold_from_histogram(u, 10.0, "entropy", 0), 10.0);
  expect_error([&] { compress::threshold_from_histogram(h, amax, "minmax", 0); },
               {"unknown method 'minmax'"});
}

TEST(Int8Config, ParsesValidatesAndReadsBack) {
  const compress::QuantizeConfig q = quant_config(
      R"({"quantize": {"calibration": "percentile", "percentile": 99.999, "skip": ["top.1"],
          "layers": ["top", "bottom"], "batches": 4, "batch_size": 512}})");
  EXPECT_TRUE(q.on);
  EXPECT_EQ(q.calibration, "percentile");
  EXPECT_EQ(q.percentile, 99.999);
  EXPECT_EQ(q.skip, std::vector<std::string>{"top.1"});
  EXPECT_FALSE(q.all_dense);
  json back = {{"quantize", q.to_json()}};
  EXPECT_EQ(compress::CompressConfig::from_json(back).quantize.to_json(), q.to_json());
  EXPECT_FALSE(compress::CompressConfig::from_json(json()).quantize.on);
}

TEST(Int8Config, BadValuesAreErrorsNamingTheKey) {
  expect_error([] { quant_config(R"({"quantize": {"calibration": "kl"}})"); },
               {"compress.quantize.calibration", "unknown method 'kl'"});
  expect_error([] { quant_config(R"({"quantize": {"percentile": 100}})"); },
               {"compress.quantize.percentile", "(50, 100)", "100"});
  expect_error([] { quant_config(R"({"quantize": {"percentile": 12}})"); },
               {"compress.quantize.percentile"});
  expect_error([] { quant_config(R"({"quantize": {"batches": 0}})"); },
               {"compress.quantize.batches"});
  expect_error([] { quant_config(R"({"quantize": {"dtype": "int4"}})"); },
               {"compress.quantize.dtype"});
  expect_error([] { quant_config(R"({"quantize": {"skip": ["top", "top"]}})"); },
               {"compress.quantize.skip", "listed twice"});
  expect_error([] { quant_config(R"({"quantize": {"clip": 3}})"); }, {"clip"});
}

TEST(Int8Calibrate, QuantizesTheModelAndReportsEachLayer) {
  const model::RunConfig cfg = small_config("dcnv2");
  auto m = model::build_model(cfg.model, cfg.optimizer, small_layout(), Device::cpu(), 3);
  std::vector<io::Batch> batches;
  for (int i = 0; i < 3; ++i) batches.push_back(io::random_batch(small_layout(), 256, false, i));
  const std::vector<float> fp32 = m->forward(batches[0], false).to_vector<float>();
  compress::QuantizeConfig q =
      quant_config(R"({"quantize": {"skip": ["top.1"], "calibration": "max"}})");
  const auto layers = compress::calibrate_and_quantize(q, *m, batches);
  ASSERT_EQ(layers.size(), m->prunable_weights().size());
  int skipped = 0;
  for (const auto& l : layers) {
    if (l.skipped) {
      ++skipped;
      EXPECT_EQ(l.weight, "top.1.weight");
      continue;
    }
    EXPECT_GT(l.x_scale, 0.f) << l.weight;
    EXPECT_GT(l.output_rel_l2, 0.0) << l.weight;
    EXPECT_EQ(l.threshold, l.amax) << l.weight;  // max calibration clips nothing
    EXPECT_LT(l.output_rel_l2, 0.1) << l.weight;
  }
  EXPECT_EQ(skipped, 1);
  const std::vector<float> int8 = m->forward(batches[0], false).to_vector<float>();
  double diff = 0;
  for (size_t i = 0; i < fp32.size(); ++i)
    diff = std::max(diff, std::fabs(double(int8[i]) - fp32[i]));
  EXPECT_GT(diff, 0.0);  // the forward runs INT8 now
  EXPECT_LT(diff, 0.5);
  compress::set_int8(*m, layers, false);
  const std::vector<float> back = m->forward(batches[0], false).to_vector<float>();
  EXPECT_EQ(back, fp32);
}

TEST(Int8Calibrate, BadInputsAreClearErrors) {
  const model::RunConfig cfg = small_config("dlrm");
  auto m = model::build_model(cfg.model, cfg.optimizer, small_layout(), Device::cpu(), 3);
  std::vector<io::Batch> batches = {io::random_batch(small_layout(), 64, false, 1)};
  expect_error(
      [&] {
        compress::calibrate_and_quantize(quant_config(R"({"quantize": {"skip": ["tops"]}})"), *m,
                                         batches);
      },
      {"compress.quantize.skip", "'tops'", "names no quantized layer", "top.0"});
  expect_error(
      [&] {
        compress::calibrate_and_quantize(quant_config(R"({"quantize": {"layers": ["cross"]}})"), *m,
                                         batches);
      },
      {"compress.quantize.layers", "'cross'", "bottom, top"});
  compress::QuantizeConfig bad;
  bad.on = true;
  bad.calibration = "mse";
  expect_error([&] { compress::calibrate_and_quantize(bad, *m, batches); },
               {"calibration", "unknown method 'mse'"});
  // NaN in the activations: a NaN dense value reaches bottom.0's input.
  batches.push_back(io::random_batch(small_layout(), 64, false, 2));
  batches[1].dense[5 * 4 + 2] = std::nanf("");
  expect_error(
      [&] { compress::calibrate_and_quantize(quant_config(R"({"quantize": {}})"), *m, batches); },
      {"int8 calibration", "'bottom.0.weight'", "calibration batch 1", "row 5", "column 2"});
  // A failed calibration leaves the model fp32 (no observer left behind).
  for (const auto& w : m->prunable_weights()) EXPECT_FALSE(w.param->quant) << w.name;
}

// A NaN activation has no int8 value: its output row is NaN, as the fp32 layer's would be (not
// the -127 a clamp would make of it). Subnormal weights get a scale a load accepts (> 0).
TEST(Int8Gemm, NanInputRowsStayNanAndSubnormalWeightsGetANormalScale) {
  const int64_t B = 3, in = 8, out = 4;
  Tensor x = random_matrix(B, in, 11, 1.f);
  x.data<float>()[1 * in + 5] = std::numeric_limits<float>::quiet_NaN();
  Tensor w = random_matrix(out, in, 12, 0.2f);
  for (int64_t k = 0; k < in; ++k) w.data<float>()[2 * in + k] = 1e-40f * (k + 1);  // subnormal
  const compress::QuantWeight q = compress::quantize_weight(w);
  EXPECT_GE(q.scales[2], std::numeric_limits<float>::min());
  Tensor bias = random_matrix(1, out, 13, 0.1f).reshape({out});
  for (const auto kernel : {compress::Int8Kernel::Reference, compress::Int8Kernel::Avx2,
                            compress::Int8Kernel::Avx512Vnni}) {
    if (!compress::int8_kernel_available(kernel)) continue;  // the Avx* tests above say so
    Tensor y;
    compress::int8_linear(x, 0.05f, q, bias, /*relu=*/true, y, kernel);
    for (int64_t j = 0; j < out; ++j) {
      EXPECT_TRUE(std::isnan(y.data<float>()[1 * out + j])) << j;
      EXPECT_TRUE(std::isfinite(y.data<float>()[0 * out + j])) << j;
      EXPECT_TRUE(std::isfinite(y.data<float>()[2 * out + j])) << j;
    }
  }
}
