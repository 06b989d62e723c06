// QAT (fake quantization with a straight-through estimator), the distillation loss and their
// config sections: the STE gradient against finite differences of the clamped function, the
// loss and gradient against a hand computation, the records in checkpoints and exports, and
// the bad inputs.
#include "dlrec/compress/qat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "dlrec/compress/sparsity.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/tensor_file.h"
#include "dlrec/nn/linear.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "test_errors.h"
#include "test_files.h"

using namespace dlrec;
namespace fs = std::filesystem;
using dlrec::testing::expect_error;

namespace {
void expect_err(const std::function<void()>& fn, const std::string& part) {
  expect_error(fn, {part});
}
}  // namespace

namespace {

Tensor matrix(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Tensor t = Tensor::empty({rows, cols}, DType::F32, Device::cpu());
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// sum_{r,j} c[r, j] * (a [rows, in] . b [out, in]^T + bias)[r, j] in double.
double weighted_out(const std::vector<double>& a, const std::vector<double>& b,
                    const std::vector<float>& bias, const std::vector<float>& c, int64_t rows,
                    int64_t out, int64_t in) {
  double s = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double y = bias[j];
      for (int64_t k = 0; k < in; ++k) y += a[r * in + k] * b[j * in + k];
      s += c[r * out + j] * y;
    }
  return s;
}

}  // namespace

TEST(Qat, FakeQuantIsTheInt8Rounding) {
  EXPECT_FLOAT_EQ(compress::fake_quant(0.26f, 0.1f), 0.3f);
  EXPECT_FLOAT_EQ(compress::fake_quant(100.f, 0.1f), 12.7f);  // clamped to 127 levels
  EXPECT_FLOAT_EQ(compress::fake_quant(-100.f, 0.1f), -12.7f);
  EXPECT_TRUE(compress::ste_passes(12.7f, 0.1f));
  EXPECT_FALSE(compress::ste_passes(12.8f, 0.1f));
  EXPECT_FALSE(compress::ste_passes(-13.f, 0.1f));
}

// The STE gradients of a QAT Linear are the exact gradients of the clamped (unrounded)
// function: dx of sum c * (clamp(x, +-127 sx) Wq^T + b) with Wq fixed, dW of
// sum c * (xq W^T + b) with xq fixed. Values outside the range get no gradient.
TEST(Qat, SteGradientMatchesFiniteDifferencesOfTheClampedFunction) {
  const int64_t rows = 4, in = 6, out = 3;
  nn::Linear lin(in, out);
  lin.init(7);
  // amax 2: inputs beyond +-2 are clamped (sx = 2 / 127).
  auto hook = std::make_shared<compress::QatLinear>("w", 0.9, 2.0);
  lin.weight().quant = hook;
  std::vector<float> xv(rows * in);
  for (int64_t i = 0; i < rows * in; ++i) xv[i] = 0.9f * static_cast<float>(i % 7) - 2.6f;
  xv[5] = 3.5f;  // well outside
  Tensor x = matrix(rows, in, xv);
  std::vector<float> c(rows * out);
  for (int64_t i = 0; i < rows * out; ++i) c[i] = 0.3f * static_cast<float>(i % 5) - 0.55f;
  lin.forward(x);
  const Tensor dx = lin.backward(matrix(rows, out, c), true);

  const float sx = 2.f / 127.f;
  const compress::QuantWeight qw = compress::quantize_weight(lin.weight().value);
  std::vector<double> wq(out * in), xq(rows * in), xc(rows * in);
  for (int64_t i = 0; i < out * in; ++i) wq[i] = double(qw.q[i]) * qw.scales[i / in];
  for (int64_t i = 0; i < rows * in; ++i) xq[i] = compress::fake_quant(xv[i], sx);
  const std::vector<float> bias = lin.bias().value.to_vector<float>();
  auto clamp = [&](double v) {
    return std::min<double>(127.0 * sx, std::max<double>(-127.0 * sx, v));
  };
  const double h = 1e-4;
  int outside = 0;
  for (int64_t i = 0; i < rows * in; ++i) {
    for (int64_t k = 0; k < rows * in; ++k) xc[k] = clamp(xv[k]);
    xc[i] = clamp(xv[i] + h);
    const double up = weighted_out(xc, wq, bias, c, rows, out, in);
    xc[i] = clamp(xv[i] - h);
    const double dn = weighted_out(xc, wq, bias, c, rows, out, in);
    const double fd = (up - dn) / (2 * h);
    EXPECT_NEAR(dx.data<float>()[i], fd, 1e-4) << "x element " << i << " = " << xv[i];
    if (std::abs(xv[i]) > 127 * sx) {
      outside++;
      EXPECT_EQ(dx.data<float>()[i], 0.f);
    }
  }
  EXPECT_GE(outside, 3);
  const std::vector<float> w = lin.weight().value.to_vector<float>();
  std::vector<double> wp(w.begin(), w.end());
  for (int64_t i = 0; i < out * in; ++i) {
    const double keep = wp[i];
    wp[i] = keep + h;
    const double up = weighted_out(xq, wp, bias, c, rows, out, in);
    wp[i] = keep - h;
    const double dn = weighted_out(xq, wp, bias, c, rows, out, in);
    wp[i] = keep;
    EXPECT_NEAR(lin.weight().grad.data<float>()[i], (up - dn) / (2 * h), 1e-4) << "W " << i;
  }
  // The step's batch range entered the running max: 0.9 * 2 + 0.1 * 3.5.
  EXPECT_NEAR(hook->amax(), 0.9 * 2.0 + 0.1 * 3.5, 1e-6);
}

// The QAT forward is the INT8 layer's arithmetic (the export): same outputs to float rounding.
TEST(Qat, ForwardMatchesTheExportedInt8Layer) {
  const int64_t rows = 9, in = 8, out = 5;
  nn::Linear lin(in, out, nn::Activation::ReLU);
  lin.init(3);
  auto hook = std::make_shared<compress::QatLinear>("w", 0.99);  // no range yet: the batch's
  lin.weight().quant = hook;
  std::vector<float> xv(rows * in);
  for (int64_t i = 0; i < rows * in; ++i) xv[i] = std::sin(0.37f * static_cast<float>(i)) * 3.f;
  Tensor x = matrix(rows, in, xv);
  const std::vector<float> y = lin.forward(x).to_vector<float>();
  lin.backward(Tensor::zeros({rows, out}, DType::F32, Device::cpu()), false);
  // The first step sets the range to its batch's max |x|.
  double amax = 0;
  for (float v : xv) amax = std::max<double>(amax, std::abs(v));
  EXPECT_NEAR(hook->amax(), amax, 1e-6);
  auto q = hook->to_int8(lin.weight().value);
  Tensor y8 = Tensor::empty({rows, out}, DType::F32, Device::cpu());
  compress::int8_linear(x, q->x_scale(), q->weight(), lin.bias().value, true, y8, compress::Int8Kernel::Reference);
  for (int64_t i = 0; i < rows * out; ++i) EXPECT_NEAR(y[i], y8.data<float>()[i], 1e-5) << i;
}

TEST(Distill, LossAndGradientMatchAHandComputation) {
  const std::vector<float> z = {1.5f, -0.7f, 0.2f}, y = {1.f, 0.f, 0.f}, t = {2.f, -3.f, 1.f};
  const double alpha = 0.3, T = 2.0;
  std::vector<float> dz(3);
  const double loss = compress::distill_loss(z.data(), y.data(), t.data(), 3, alpha, T, dz.data());
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  auto bce = [&](double v, double p) {
    return -(p * std::log(sig(v)) + (1 - p) * std::log(1 - sig(v)));
  };
  double ref = 0;
  for (int i = 0; i < 3; ++i) {
    const double q = sig(t[i] / T);
    ref += alpha * bce(z[i], y[i]) + (1 - alpha) * bce(z[i] / T, q);
    const double g = (alpha * (sig(z[i]) - y[i]) + (1 - alpha) * (sig(z[i] / T) - q) / T) / 3;
    EXPECT_NEAR(dz[i], g, 1e-7) << i;
    // and against a finite difference of the loss
    std::vector<float> zp = z, zm = z;
    zp[i] += 1e-3f;
    zm[i] -= 1e-3f;
    const double fd =
        (compress::distill_loss(zp.data(), y.data(), t.data(), 3, alpha, T, nullptr) -
         compress::distill_loss(zm.data(), y.data(), t.data(), 3, alpha, T, nullptr)) /
        (double(zp[i]) - zm[i]);
    EXPECT_NEAR(dz[i], fd, 1e-5) << i;
  }
  EXPECT_NEAR(loss, ref / 3, 1e-9);
  // alpha 1 is the plain BCE; a teacher equal to the student at T = 1 and alpha 0 has zero
  // gradient.
  EXPECT_NEAR(compress::distill_loss(z.data(), y.data(), t.data(), 3, 1.0, 5.0, nullptr),
              (bce(z[0], 1) + bce(z[1], 0) + bce(z[2], 0)) / 3, 1e-9);
  compress::distill_loss(z.data(), y.data(), z.data(), 3, 0.0, 1.0, dz.data());
  for (float g : dz) EXPECT_NEAR(g, 0.f, 1e-8);
}

TEST(QatConfig, BadInputsAreErrorsNamingTheKey) {
  auto parse = [](const char* text) {
    return compress::CompressConfig::from_json(parse_json(text, "test"));
  };
  const compress::CompressConfig ok = parse(R"({"qat": {"skip": ["top.1"], "ema_decay": 0.9},
                "distill": {"teacher": "m", "alpha": 0.25, "temperature": 3}})");
  EXPECT_TRUE(ok.qat.on);
  EXPECT_DOUBLE_EQ(ok.qat.ema_decay, 0.9);
  EXPECT_DOUBLE_EQ(ok.distill.alpha, 0.25);
  EXPECT_DOUBLE_EQ(ok.distill.temperature, 3.0);
  // to_json round-trips
  EXPECT_EQ(compress::CompressConfig::from_json(ok.to_json()).to_json(), ok.to_json());
  expect_err([&] { parse(R"({"qat": {"ema_decay": 1.0}})"); }, "compress.qat.ema_decay");
  expect_err([&] { parse(R"({"qat": {"calibration": "max"}})"); }, "calibration");
  expect_err([&] { parse(R"({"qat": {"layers": "top"}})"); }, "compress.qat.layers");
  expect_err([&] { parse(R"({"distill": {"alpha": 0.5}})"); }, "compress.distill.teacher");
  expect_err([&] { parse(R"({"distill": {"teacher": "m", "alpha": 1.5}})"); },
             "compress.distill.alpha: must be in [0, 1]");
  expect_err([&] { parse(R"({"distill": {"teacher": "m", "alpha": -0.1}})"); },
             "compress.distill.alpha");
  expect_err([&] { parse(R"({"distill": {"teacher": "m", "temperature": 0}})"); },
             "compress.distill.temperature: must be > 0");
  expect_err([&] { parse(R"({"distill": {"teacher": "m", "temperature": -2}})"); },
             "compress.distill.temperature");
}
