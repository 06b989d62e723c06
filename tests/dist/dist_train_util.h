// Shared by the tests of `dlrec train` across processes or GPUs: the small synthetic dataset
// they train on, the command line of a run, its metrics log, and the comparison of two runs'
// logged losses (the multi-rank job against one process).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/datagen.h"
#include "etl_test_util.h"

namespace dlrec::testing {

inline const std::string kDlrecBin = std::string(DLREC_BIN_DIR) + "/dlrec";

// `rows` rows of 4 dense and 5 categorical features (one multi-hot), cardinalities 40, 200 and
// 1,000 in turn.
inline io::DatagenConfig dist_train_gen(int64_t rows, uint64_t seed) {
  io::DatagenConfig g;
  g.rows = rows;
  g.seed = seed;
  g.num_dense = 4;
  g.num_cat = 5;
  g.num_multi_hot = 1;
  g.cardinalities = {40, 200, 1000};
  return g;
}

// The dense columns filled, clipped at 0 and logged (then normalized when `normalize`); the
// categorical ones through `categorical_op` (an op's JSON).
inline std::string dist_train_workflow(
    bool normalize, const std::string& categorical_op = R"({"op": "Categorify"})") {
  return std::string(R"({"pipeline": [
      {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                    {"op": "LogOp"})") +
         (normalize ? R"(, {"op": "Normalize"})" : "") + R"(]},
      {"columns": "@categorical", "ops": [)" +
         categorical_op + "]}]}";
}

// The 12,000-row dataset (seed 11) of most of these tests in tmp/data: 10,000 training rows in
// files of 3,000 (so that batches cross them), 2,000 validation rows; the dense columns
// normalized. `etl_ranks`: the training rows split for that many ranks.
inline void make_dist_train_data(const std::string& tmp, const std::string& data_dir,
                                 const std::string& categorical_op = R"({"op": "Categorify"})",
                                 int etl_ranks = 1) {
  TestEtl etl;
  etl.workflow = dist_train_workflow(true, categorical_op);
  etl.train_rows = 10000;
  etl.shard_rows = 3000;
  etl.ranks = etl_ranks;
  generate_and_etl(dist_train_gen(12000, 11), tmp + "/logs.tsv", data_dir, etl);
}

// `dlrec train` of `config` on `data` into `run_dir` at `batch` rows (per rank), its metrics
// (one JSON line per logged step, then the evaluation) into `metrics_log`, one thread, quiet.
inline std::string train_command(const std::string& config, const std::string& data,
                                 const std::string& run_dir, int64_t batch,
                                 const std::string& metrics_log) {
  return kDlrecBin + " train --config " + config + " --data " + data + " --run " + run_dir +
         " --batch-size " + std::to_string(batch) + " --metrics-log " + metrics_log +
         " --threads 1 --quiet";
}

// The JSON lines of a metrics log.
inline std::vector<json> read_metrics(const std::string& path) {
  std::vector<json> v;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) v.push_back(json::parse(line));
  return v;
}

// Two metrics logs of `lines` lines each (the logged losses, then the evaluation): the same
// steps, every loss within 1e-5 relative; *worst gets the largest relative difference. A fatal
// failure here ends only this function: call it under ASSERT_NO_FATAL_FAILURE.
inline void expect_same_logged_losses(const std::vector<json>& one, const std::vector<json>& many,
                                      size_t lines, double* worst) {
  ASSERT_EQ(one.size(), many.size());
  ASSERT_EQ(one.size(), lines);
  *worst = 0;
  for (size_t i = 0; i + 1 < one.size(); ++i) {
    ASSERT_EQ(one[i]["step"], many[i]["step"]);
    const double x = one[i]["loss"], y = many[i]["loss"];
    *worst = std::max(*worst, std::abs(x - y) / std::abs(x));
    EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(x)) << "step " << one[i]["step"];
  }
}

}  // namespace dlrec::testing
