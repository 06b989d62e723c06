#include "dlrec/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "dlrec/core/error.h"

namespace dlrec::train {

double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  DLREC_CHECK(scores.size() == labels.size(), "roc_auc: ", scores.size(), " scores for ",
              labels.size(), " labels");
  const size_t n = scores.size();
  DLREC_CHECK(n > 0, "AUC of no rows: there is nothing to evaluate");
  // A NaN score has no rank (it compares unequal to itself, and would make the sort's order
  // undefined and the tie loop below spin forever): refused, counted.
  size_t nan_scores = 0;
  for (float s : scores) nan_scores += std::isnan(s);
  DLREC_CHECK(nan_scores == 0, "AUC: ", nan_scores, " of ", n,
              " scores are NaN (the model's outputs are not numbers; its weights have diverged "
              "or hold NaN)");
  DLREC_CHECK(n <= UINT32_MAX, "AUC: ", n, " rows is more than this implementation ranks");
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });
  // Sum of the (tie-averaged) ranks of the positives.
  double pos = 0, rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double p = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) p += labels[order[j++]] > 0.5f;
    rank_sum += p * (0.5 * (i + 1 + j));  // mean of ranks i+1 .. j
    pos += p;
    i = j;
  }
  double neg = static_cast<double>(n) - pos;
  if (pos == 0 || neg == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

RegressionMetrics regression_metrics(const std::vector<float>& predictions,
                                     const std::vector<float>& labels) {
  DLREC_CHECK(predictions.size() == labels.size(), "regression metrics: ", predictions.size(),
              " predictions for ", labels.size(), " labels");
  const size_t n = predictions.size();
  DLREC_CHECK(n > 0, "RMSE of no rows: there is nothing to evaluate");
  size_t nan_preds = 0;
  double se = 0, ae = 0, sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(predictions[i]) - labels[i];
    nan_preds += std::isnan(predictions[i]);
    se += d * d;
    ae += std::fabs(d);
    sum += labels[i];
  }
  DLREC_CHECK(nan_preds == 0, "RMSE: ", nan_preds, " of ", n,
              " predictions are NaN (the model's outputs are not numbers; its weights have "
              "diverged or hold NaN)");
  RegressionMetrics m;
  m.rmse = std::sqrt(se / n);
  m.mae = ae / n;
  m.label_mean = sum / n;
  return m;
}

std::string format_eval(const EvalResult& e) {
  char buf[160];
  if (e.regression)
    std::snprintf(buf, sizeof buf, "rows=%lld RMSE=%.5f MAE=%.5f label_mean=%.4f",
                  static_cast<long long>(e.rows), e.rmse, e.mae, e.label_mean);
  else
    std::snprintf(buf, sizeof buf, "rows=%lld AUC=%.5f logloss=%.5f positives=%.4f",
                  static_cast<long long>(e.rows), e.auc, e.logloss, e.positive_rate);
  return buf;
}

double log_loss(const std::vector<float>& probs, const std::vector<float>& labels) {
  DLREC_CHECK(probs.size() == labels.size(), "log_loss: size mismatch");
  DLREC_CHECK(!probs.empty(), "log loss of no rows: there is nothing to evaluate");
  double s = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    double p = std::min(std::max<double>(probs[i], 1e-7), 1 - 1e-7);
    s -= labels[i] > 0.5f ? std::log(p) : std::log(1 - p);
  }
  return s / probs.size();
}

}  // namespace dlrec::train
