// `dlrec train` with sharded embedding tables under mpirun against one process
// (docs/DISTRIBUTED.md): the same data and seed, the tables spread table-wise, row-wise,
// column-wise and replicated over the ranks, the same losses at every logged step (1e-5
// relative) and the same final AUC (1e-4) over 1,000 steps; a resume from the gathered
// checkpoint; and the plan printed once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "dist/dist_train_util.h"
#include "dist/run_job.h"
#include "dlrec/core/config.h"
#include "dlrec/dist/communicator.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::expect_same_logged_losses;
using dlrec::testing::make_dist_train_data;
using dlrec::testing::mpirun_prefix;
using dlrec::testing::read_metrics;
using dlrec::testing::run_job;
using dlrec::testing::TempDir;
using dlrec::testing::train_command;

namespace {

const std::string& kDlrec = dlrec::testing::kDlrecBin;

// 10,000 training rows and 2,000 validation rows, five categorical features (one multi-hot);
// the config shards the DLRM preset's embedding layer "emb" (tables "emb.<feature>").
struct ShardedData {
  TempDir tmp{"sharded_train"};
  std::string dir = tmp.path + "/data", config = tmp.path + "/config.json";
  // train_extra: more keys of the train section (a leading comma).
  explicit ShardedData(const std::string& optimizer, const std::string& train_extra = "") {
    make_dist_train_data(tmp.path, dir);
    std::ofstream(config) << R"({
      "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
      "optimizer": )" << optimizer
                          << R"(,
      "train": {"batch_size": 32, "epochs": 7, "max_steps": 1000, "log_every": 10, "seed": 3)"
                          << train_extra << R"(},
      "sharding": {"memory_per_rank_gb": 1, "replicate_max_bytes": 0,
                   "tables": {"emb.0": {"kind": "row_wise"}, "emb.1": {"kind": "column_wise"},
                              "emb.2": {"kind": "table_wise", "owner": 1},
                              "emb.3": {"kind": "replicated"}}}})";
  }
  std::string train_args(const std::string& run, int64_t batch, const std::string& log) const {
    return train_command(config, dir, tmp.path + "/" + run, batch, tmp.path + "/" + log);
  }
  std::vector<json> metrics(const std::string& log) const {
    return read_metrics(tmp.path + "/" + log);
  }
};

void expect_sharded_matches_one_process(int ranks, const std::string& optimizer) {
  ShardedData d(optimizer);
  // One process: the sharding key applies to jobs of several ranks; the tables are whole.
  auto one = run_job(d.train_args("one", 64, "one.jsonl") + " --comm single", 600);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto many = run_job(mpirun_prefix(ranks) + d.train_args("many", 64 / ranks, "many.jsonl"), 600);
  ASSERT_EQ(many.exit_code, 0) << many.output;
  // The plan, printed once (by rank 0), with every kind.
  ASSERT_NE(many.output.find("sharding plan: 5 tables on " + std::to_string(ranks) + " rank(s)"),
            std::string::npos)
      << many.output;
  EXPECT_EQ(many.output.find("sharding plan:"), many.output.rfind("sharding plan:")) << many.output;
  for (const char* kind : {"row_wise", "column_wise", "table_wise", "replicated"})
    EXPECT_NE(many.output.find(kind), std::string::npos) << many.output;
  const auto a = d.metrics("one.jsonl"), b = d.metrics("many.jsonl");
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(expect_same_logged_losses(a, b, 101, &worst));
  EXPECT_EQ(b.back()["rows"], 2000);
  EXPECT_NEAR(a.back()["auc"].get<double>(), b.back()["auc"].get<double>(), 1e-4);
  EXPECT_GT(a.back()["auc"].get<double>(), 0.6);
  std::printf("[sharded] %d ranks: worst relative loss difference %.3g, AUC %.6f vs %.6f\n", ranks,
              worst, a.back()["auc"].get<double>(), b.back()["auc"].get<double>());
  // The checkpoint of the sharded run holds whole tables: one process evaluates it.
  auto eval = run_job(kDlrec + " eval --run " + d.tmp.path + "/many --data " + d.dir, 300);
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
}

TEST(ShardedTraining, TwoRanksMatchOneProcessOver1000Steps) {
  if (!dist::mpi_built() || mpirun_prefix(2).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  expect_sharded_matches_one_process(2, R"({"type": "sgd", "lr": 0.1})");
}

TEST(ShardedTraining, FourRanksMatchOneProcessOver1000StepsAdagrad) {
  if (!dist::mpi_built() || mpirun_prefix(4).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  expect_sharded_matches_one_process(4, R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})");
}

// Evaluation rows in global batches of 3 on 3 ranks: the last batch has 2 rows, so rank 0's
// piece is empty, and it still runs the (collective) forward with the others.
TEST(ShardedTraining, EvaluationWithAnEmptyPieceOnARank) {
  if (!dist::mpi_built() || mpirun_prefix(3).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  ShardedData d(R"({"type": "sgd", "lr": 0.1})", R"(, "eval_batch_size": 1)");
  auto one = run_job(d.train_args("one", 63, "one.jsonl") + " --comm single --max-steps 20", 300);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto three =
      run_job(mpirun_prefix(3) + d.train_args("three", 21, "three.jsonl") + " --max-steps 20", 300);
  ASSERT_EQ(three.exit_code, 0) << three.output;
  const auto a = d.metrics("one.jsonl"), b = d.metrics("three.jsonl");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(b.back()["rows"], 2000);
  EXPECT_NEAR(a.back()["auc"].get<double>(), b.back()["auc"].get<double>(), 1e-4);
}

}  // namespace
