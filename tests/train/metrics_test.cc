#include "dlrec/train/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "dlrec/core/device.h"
#include "dlrec/core/tensor.h"
#include "test_errors.h"

using namespace dlrec::train;

TEST(Metrics, AucMatchesPairCounting) {
  std::vector<float> s = {0.1f, 0.4f, 0.35f, 0.8f, 0.4f, 0.2f, 0.9f};
  std::vector<float> y = {0, 0, 1, 1, 1, 0, 1};
  // Brute force: fraction of (pos, neg) pairs ranked correctly, ties count 1/2.
  double good = 0, pairs = 0;
  for (size_t i = 0; i < s.size(); ++i)
    for (size_t j = 0; j < s.size(); ++j)
      if (y[i] == 1 && y[j] == 0) {
        pairs++;
        good += s[i] > s[j] ? 1 : (s[i] == s[j] ? 0.5 : 0);
      }
  EXPECT_NEAR(roc_auc(s, y), good / pairs, 1e-12);
  EXPECT_DOUBLE_EQ(roc_auc({1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({1, 1, 1, 1}, {0, 1, 0, 1}), 0.5);
  EXPECT_TRUE(std::isnan(roc_auc({1, 2}, {1, 1})));
}

TEST(Metrics, LogLoss) {
  EXPECT_NEAR(log_loss({0.5f, 0.5f}, {0, 1}), std::log(2.0), 1e-7);
  EXPECT_NEAR(log_loss({0.9f, 0.2f}, {1, 0}), -(std::log(0.9) + std::log(0.8)) / 2, 1e-6);
  EXPECT_LT(log_loss({0.f}, {0}), 1e-6);  // clamped, finite
  EXPECT_TRUE(std::isfinite(log_loss({0.f}, {1})));
}

// A NaN score once made roc_auc loop forever (NaN == NaN is false, so its tie group never
// advanced) and `dlrec eval` hang: now an error that counts them.
TEST(Metrics, NaNScoresAreAnErrorNamingTheCount) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  dlrec::testing::expect_error(
      [&] {
        roc_auc({0.1f, nan, 0.7f, nan, nan}, {0, 1, 1, 0, 1});
      },
      {"AUC", "3 of 5 scores are NaN"});
  dlrec::testing::expect_error([&] { roc_auc({nan}, {1}); }, {"1 of 1 scores are NaN"});
}

TEST(Metrics, NoRowsIsAnErrorNotZero) {
  dlrec::testing::expect_error([] { roc_auc({}, {}); }, {"AUC of no rows"});
  dlrec::testing::expect_error([] { log_loss({}, {}); }, {"log loss of no rows"});
}

#ifdef DLREC_WITH_CUDA
// The device AUC and log loss equal the host's on data with many tied scores.
TEST(Metrics, DeviceAucAndLogLossMatchHost) {
  if (dlrec::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU metrics not run";
  std::mt19937 rng(3);
  const int64_t n = 200000;
  std::vector<float> logits(n), labels(n), probs(n);
  for (int64_t i = 0; i < n; ++i) {
    logits[i] = static_cast<float>(static_cast<int>(rng() % 41) - 20) * 0.25f;  // heavy ties
    const float p = 1.f / (1.f + std::exp(-logits[i]));
    labels[i] = (rng() % 1000) < p * 1000 ? 1.f : 0.f;
    probs[i] = p;
  }
  auto dev = dlrec::Device::cuda(0);
  dlrec::Tensor z = dlrec::Tensor::from_vector(logits, {n}, dev);
  dlrec::Tensor y = dlrec::Tensor::from_vector(labels, {n}, dev);
  auto m = metrics_from_logits_cuda(z.data<float>(), y.data<float>(), n, 0);
  EXPECT_NEAR(m.auc, roc_auc(probs, labels), 1e-9);
  EXPECT_NEAR(m.logloss, log_loss(probs, labels), 1e-6);
  double pos = 0;
  for (float l : labels) pos += l;
  EXPECT_EQ(m.positives, pos);
  // One class only: NaN, as on the host.
  std::vector<float> ones(1000, 1.f);
  dlrec::Tensor o = dlrec::Tensor::from_vector(ones, {1000}, dev);
  EXPECT_TRUE(std::isnan(metrics_from_logits_cuda(z.data<float>(), o.data<float>(), 1000, 0).auc));
}

TEST(Metrics, DeviceNaNLogitsAndNoRowsAreErrors) {
  if (dlrec::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU metrics not run";
  std::vector<float> logits = {0.5f, std::numeric_limits<float>::quiet_NaN(), -1.f, 2.f};
  std::vector<float> labels = {1, 0, 1, 0};
  auto dev = dlrec::Device::cuda(0);
  dlrec::Tensor z = dlrec::Tensor::from_vector(logits, {4}, dev);
  dlrec::Tensor y = dlrec::Tensor::from_vector(labels, {4}, dev);
  dlrec::testing::expect_error(
      [&] { metrics_from_logits_cuda(z.data<float>(), y.data<float>(), 4, 0); },
      {"1 of 4 scores are NaN"});
  dlrec::testing::expect_error(
      [&] { metrics_from_logits_cuda(z.data<float>(), y.data<float>(), 0, 0); },
      {"AUC of no rows"});
}
#endif
