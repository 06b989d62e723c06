// Evaluation metrics over a whole validation set.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrec::train {

// Exact ROC AUC of `scores` against binary `labels` (ties get half credit, as in the
// Mann-Whitney statistic). Returns NaN when one class is absent. No rows, or any NaN score, is
// an error (naming the count of NaN scores).
double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels);

// Mean binary cross-entropy of probabilities `probs` (clamped to [1e-7, 1 - 1e-7]); no rows is
// an error.
double log_loss(const std::vector<float>& probs, const std::vector<float>& labels);

// The same metrics on a CUDA device, from logits and labels in that device's memory (built with
// CUDA only): probabilities sigmoid(logits) as in evaluation on the host, exact AUC by a
// device sort (large validation sets never leave the GPU), mean log loss, positive count.
// The same errors as roc_auc: no rows, NaN logits (counted).
struct DeviceMetrics {
  double auc = 0, logloss = 0, positives = 0;
};
DeviceMetrics metrics_from_logits_cuda(const float* logits, const float* labels, int64_t n,
                                       int device);

// Root mean squared error and mean absolute error of `predictions` against `labels`
// (regression targets, train.loss "mse"); no rows, or a NaN prediction (counted), is an error.
struct RegressionMetrics {
  double rmse = 0, mae = 0, label_mean = 0;
};
RegressionMetrics regression_metrics(const std::vector<float>& predictions,
                                     const std::vector<float>& labels);

struct EvalResult {
  int64_t rows = 0;
  bool regression = false;  // train.loss "mse": rmse/mae/label_mean are set, auc/logloss not
  double auc = 0;
  double logloss = 0;
  double positive_rate = 0;
  double rmse = 0, mae = 0, label_mean = 0;
  double seconds = 0;
};

// "rows=N AUC=... logloss=... positives=..." or, for a regression, "rows=N RMSE=... MAE=...
// label_mean=..." (what `dlrec train`/`eval` print).
std::string format_eval(const EvalResult& e);

}  // namespace dlrec::train
