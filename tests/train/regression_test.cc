// Labels beyond 0/1, end to end on the CPU: a ratings log (user, item, rating 1-5) through ETL
// with the workflow's "label" key, trained with train.loss "mse" (RMSE/MAE in evaluation) or, the
// rating binarized, with BCE (AUC); the exported model predicts raw rows without the rating.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/nn/loss.h"
#include "dlrec/train/export.h"
#include "dlrec/train/trainer.h"
#include "test_errors.h"

using namespace dlrec;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name)
      : path(::testing::TempDir() + "dlrec_regr_" + std::to_string(::getpid()) + "_" + name) {
    fs::remove_all(path);
    make_dirs(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// rating = round(clamp(3 + user bias + item bias + noise, 1, 5)): biases in [-1.5, 1.5].
// Returns the ratings' standard deviation (the RMSE of predicting the mean).
double write_ratings(const std::string& path, int rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> bias(-1.5, 1.5);
  std::normal_distribution<double> noise(0, 0.4);
  std::vector<double> user_bias(50), item_bias(40);
  for (auto& b : user_bias) b = bias(rng);
  for (auto& b : item_bias) b = bias(rng);
  std::ofstream f(path);
  f << "user,item,rating\n";
  double sum = 0, sum2 = 0;
  for (int i = 0; i < rows; ++i) {
    const int u = static_cast<int>(rng() % user_bias.size());
    const int it = static_cast<int>(rng() % item_bias.size());
    const double r =
        std::round(std::min(5.0, std::max(1.0, 3 + user_bias[u] + item_bias[it] + noise(rng))));
    f << "u" << u << ",i" << it << "," << r << "\n";
    sum += r;
    sum2 += r * r;
  }
  const double mean = sum / rows;
  return std::sqrt(sum2 / rows - mean * mean);
}

io::Schema ratings_schema() {
  return io::Schema::from_json(json::parse(R"({"format": "csv", "columns": [
      {"name": "user", "kind": "categorical"}, {"name": "item", "kind": "categorical"},
      {"name": "rating", "kind": "dense"}]})"));
}

etl::EtlResult run_etl_on(const std::string& logs, const std::string& out, const json& label_ops) {
  etl::EtlOptions o;
  o.inputs = {logs};
  o.schema = ratings_schema();
  o.workflow = {{"label", "rating"},
                {"pipeline",
                 {{{"columns", json::array({"rating"})}, {"ops", label_ops}},
                  {{"columns", "@categorical"}, {"ops", {{{"op", "Categorify"}}}}}}}};
  o.output_dir = out;
  o.valid_ratio = 0.2;
  return etl::run_etl(o);
}

model::RunConfig config(const std::string& loss) {
  return model::RunConfig::from_json(json::parse(R"({
    "model": {"arch": "wide_deep", "embedding_dim": 8, "top_mlp": [16, 1]},
    "optimizer": {"type": "adagrad", "lr": 0.1},
    "train": {"batch_size": 128, "epochs": 4, "log_every": 0, "loss": ")" + loss + R"("}})"));
}

TEST(RegressionTarget, MseLearnsTheRatingsAndReportsRmseMae) {
  TempDir dir("mse");
  const double sd = write_ratings(dir.path + "/ratings.csv", 8000, 11);
  etl::EtlResult er = run_etl_on(dir.path + "/ratings.csv", dir.path + "/data", json::array());
  ASSERT_EQ(er.valid_rows, 1600);
  train::TrainerOptions opt;
  opt.data_dir = dir.path + "/data";
  opt.run_dir = dir.path + "/run";
  train::Trainer t(config("mse"), opt);
  EXPECT_EQ(t.model().loss(), nn::LossKind::Mse);
  train::TrainResult r = t.train();
  ASSERT_EQ(r.eval.rows, 1600);
  EXPECT_TRUE(r.eval.regression);
  EXPECT_TRUE(std::isnan(r.eval.auc));
  // The biases explain most of the variance: well below the RMSE of predicting the mean.
  EXPECT_LT(r.eval.rmse, 0.6 * sd) << "sd " << sd;
  EXPECT_GT(r.eval.mae, 0);
  EXPECT_LE(r.eval.mae, r.eval.rmse);
  EXPECT_NEAR(r.eval.label_mean, 3, 0.6);
  EXPECT_NE(train::format_eval(r.eval).find("RMSE="), std::string::npos);

  // Exported, the model predicts ratings (no sigmoid) for rows that carry no rating (the server
  // passes no labels): the same values as evaluation.
  std::vector<float> eval_pred;
  t.evaluate(&eval_pred);
  train::export_model(opt.run_dir, dir.path + "/model");
  train::Predictor p(dir.path + "/model");
  // A request-like chunk (as the server builds it): ids only, no rating (NaN), no labels.
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"u1", "i2"}, {"u3", "i4"}, {"u7", "i0"}};
  io::RawChunk req;
  req.reset(1, 2);
  for (const auto& [user, item] : rows) {
    req.dense.push_back(NAN);
    req.cat_values[0].push_back(io::hash_category(user));
    req.cat_values[1].push_back(io::hash_category(item));
    for (int c = 0; c < 2; ++c)
      req.cat_offsets[c].push_back(static_cast<int64_t>(req.cat_values[c].size()));
    ++req.rows;
  }
  std::vector<float> pred = p.predict(req);
  ASSERT_EQ(pred.size(), 3u);
  for (float v : pred) {
    EXPECT_GT(v, 0.0f);  // ratings, not probabilities squashed into (0, 1)
    EXPECT_LT(v, 6.0f);
  }
  EXPECT_TRUE(std::any_of(pred.begin(), pred.end(), [](float v) { return v > 1.0f; }));
  EXPECT_FALSE(eval_pred.empty());
  EXPECT_TRUE(std::any_of(eval_pred.begin(), eval_pred.end(), [](float v) { return v > 1.0f; }));
}

TEST(RegressionTarget, BinarizedRatingsTrainWithBce) {
  TempDir dir("bce");
  write_ratings(dir.path + "/ratings.csv", 8000, 12);
  run_etl_on(dir.path + "/ratings.csv", dir.path + "/data",
             {{{"op", "Binarize"}, {"threshold", 3}, {"compare", "gt"}}});
  train::TrainerOptions opt;
  opt.data_dir = dir.path + "/data";
  opt.run_dir = dir.path + "/run";
  train::TrainResult r = train::Trainer(config("bce"), opt).train();
  EXPECT_FALSE(r.eval.regression);
  EXPECT_GT(r.eval.auc, 0.8);  // the biases decide rating > 3 for most pairs
  EXPECT_GT(r.eval.positive_rate, 0.1);
  EXPECT_LT(r.eval.positive_rate, 0.9);
}

// `dlrec eval` of a run without validation rows printed AUC=0.00000 and exited 0 once.
TEST(RegressionTarget, EvalWithoutValidationRowsIsAnError) {
  TempDir dir("novalid");
  write_ratings(dir.path + "/ratings.csv", 500, 13);
  etl::EtlOptions o;
  o.inputs = {dir.path + "/ratings.csv"};
  o.schema = ratings_schema();
  o.workflow = {{"label", "rating"},
                {"pipeline", {{{"columns", "@categorical"}, {"ops", {{{"op", "Categorify"}}}}}}}};
  o.output_dir = dir.path + "/data";
  ASSERT_EQ(etl::run_etl(o).valid_rows, 0);
  train::TrainerOptions opt;
  opt.data_dir = o.output_dir;
  train::Trainer t(config("mse"), opt);
  dlrec::testing::expect_error([&] { t.evaluate(); }, {"no validation rows", "nothing to evaluate"});
  dlrec::testing::expect_error([&] { train::evaluate_shards(t.model(), {}, 128); },
                               {"no shards to evaluate"});
}

TEST(RegressionTarget, LossConfigAndFunctions) {
  dlrec::testing::expect_error([] { config("mae"); },
                               {"train.loss", "'mae' is not one of: bce, mse"});
  EXPECT_EQ(config("mse").to_json()["train"]["loss"], "mse");
  EXPECT_FALSE(config("bce").to_json()["train"].contains("loss"));  // older run.json unchanged
  EXPECT_EQ(model::RunConfig::from_json(config("mse").to_json()).train.loss, "mse");
  // mse: mean of squares, gradient 2 (z - y) / n, checked against finite differences.
  std::vector<float> z = {0.5f, 2.f, -1.f}, y = {1.f, 2.f, 3.f}, g(3);
  EXPECT_NEAR(nn::mse(z.data(), y.data(), 3, g.data()), (0.25 + 0 + 16) / 3, 1e-9);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> zp = z, zm = z;
    zp[i] += 1e-2f;
    zm[i] -= 1e-2f;
    const double fd =
        (nn::mse(zp.data(), y.data(), 3, nullptr) - nn::mse(zm.data(), y.data(), 3, nullptr)) /
        2e-2;
    EXPECT_NEAR(g[i], fd, 1e-3) << i;
  }
  EXPECT_EQ(nn::loss_and_grad(nn::LossKind::Mse, z.data(), y.data(), 3, nullptr),
            nn::mse(z.data(), y.data(), 3, nullptr));
  EXPECT_EQ(nn::parse_loss("bce"), nn::LossKind::Bce);
  dlrec::testing::expect_error([] { nn::parse_loss("l1"); }, {"unknown loss 'l1'"});
  // Regression metrics by hand; no rows and NaN predictions are errors.
  train::RegressionMetrics m = train::regression_metrics({1, 3}, {2, 2});
  EXPECT_DOUBLE_EQ(m.rmse, 1);
  EXPECT_DOUBLE_EQ(m.mae, 1);
  EXPECT_DOUBLE_EQ(m.label_mean, 2);
  dlrec::testing::expect_error([] { train::regression_metrics({}, {}); }, {"no rows"});
  dlrec::testing::expect_error([] { train::regression_metrics({NAN, 1}, {1, 1}); },
                               {"1 of 2 predictions are NaN"});
}

}  // namespace
