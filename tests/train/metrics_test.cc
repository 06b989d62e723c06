#include <gtest/gtest.h>

#include <cmath>

#include "dlrec/train/metrics.h"

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
