// `dlrec train` with hybrid embedding tables under mpirun against one process (docs/DISTRIBUTED.md,
// "Hybrid embedding"): the dataset's stats.json gives each table's frequency summary
// (Categorify), the config makes emb.0 hybrid with 8 frequent rows and emb.1 hybrid with the
// planner's F; the same losses at every logged step (1e-5 relative) and final AUC (1e-4) over
// 1,000 steps on 2 ranks; the plan printout names F; bad configs are clear errors.
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

struct HybridData {
  TempDir tmp;
  std::string dir = tmp.path + "/data";
  // encoder: the categorical columns' op (Categorify numbers ids by frequency; HashBucket not).
  explicit HybridData(const std::string& name,
                      const std::string& encoder = R"({"op": "Categorify"})")
      : tmp(name) {
    make_dist_train_data(tmp.path, dir, encoder);
  }
  std::string config(const std::string& name, const std::string& tables) const {
    const std::string path = tmp.path + "/" + name;
    std::ofstream(path) << R"({
      "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
      "optimizer": {"type": "sgd", "lr": 0.1},
      "train": {"batch_size": 32, "epochs": 7, "max_steps": 1000, "log_every": 10, "seed": 3},
      "sharding": {"memory_per_rank_gb": 1, "replicate_max_bytes": 0, "tables": )"
                        << tables << "}}";
    return path;
  }
  std::string train_args(const std::string& cfg, const std::string& run, int64_t batch,
                         const std::string& log) const {
    return train_command(cfg, dir, tmp.path + "/" + run, batch, tmp.path + "/" + log);
  }
  std::vector<json> metrics(const std::string& log) const {
    return read_metrics(tmp.path + "/" + log);
  }
};

TEST(HybridTraining, TwoRanksMatchOneProcessOver1000Steps) {
  if (!dist::mpi_built() || mpirun_prefix(2).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  HybridData d("hybrid_train");
  const std::string cfg =
      d.config("hybrid.json",
               R"({"emb.0": {"kind": "hybrid", "frequent_rows": 8}, "emb.1": {"kind": "hybrid"}})");
  auto one = run_job(d.train_args(cfg, "one", 64, "one.jsonl") + " --comm single", 600);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto many = run_job(mpirun_prefix(2) + d.train_args(cfg, "many", 32, "many.jsonl"), 600);
  ASSERT_EQ(many.exit_code, 0) << many.output;
  ASSERT_NE(many.output.find("hybrid emb.0: ids [0, 8) on every rank"), std::string::npos)
      << many.output;
  ASSERT_NE(many.output.find("hybrid emb.1: ids [0, "), std::string::npos) << many.output;
  for (size_t at = many.output.find("sharding plan:"); at != std::string::npos;
       at = many.output.find("\nhybrid emb.", at + 1)) {  // the plan's summary and hybrid lines
    const size_t from = many.output[at] == '\n' ? at + 1 : at;
    std::printf("%s\n", many.output.substr(from, many.output.find('\n', from) - from).c_str());
  }
  const auto a = d.metrics("one.jsonl"), b = d.metrics("many.jsonl");
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(expect_same_logged_losses(a, b, 101, &worst));
  EXPECT_NEAR(a.back()["auc"].get<double>(), b.back()["auc"].get<double>(), 1e-4);
  EXPECT_GT(a.back()["auc"].get<double>(), 0.6);
  std::printf("[hybrid] 2 ranks: worst relative loss difference %.3g, AUC %.6f vs %.6f\n", worst,
              a.back()["auc"].get<double>(), b.back()["auc"].get<double>());
  // The gathered checkpoint: one process evaluates it.
  auto eval = run_job(kDlrec + " eval --run " + d.tmp.path + "/many --data " + d.dir, 300);
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
}

TEST(HybridTraining, BadConfigsAreClearErrors) {
  if (!dist::mpi_built() || mpirun_prefix(2).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  HybridData d("hybrid_train_bad");
  // F beyond the table's rows (emb.0: the 40-key feature).
  auto big = run_job(
      mpirun_prefix(2) +
          d.train_args(
              d.config("big.json", R"({"emb.0": {"kind": "hybrid", "frequent_rows": 100000}})"),
              "big", 32, "big.jsonl") +
          " --max-steps 2",
      300);
  EXPECT_NE(big.exit_code, 0);
  EXPECT_NE(big.output.find("sharding.tables.emb.0.frequent_rows: 100000 is out of range"),
            std::string::npos)
      << big.output;
  // Ids not numbered by frequency (HashBucket): no summary, so no hybrid.
  HybridData hashed("hybrid_train_hashed", R"({"op": "HashBucket", "num_buckets": 64})");
  auto h =
      run_job(mpirun_prefix(2) +
                  hashed.train_args(hashed.config("h.json", R"({"emb.2": {"kind": "hybrid"}})"),
                                    "h", 32, "h.jsonl") +
                  " --max-steps 2",
              300);
  EXPECT_NE(h.exit_code, 0);
  EXPECT_NE(h.output.find("table 'emb.2' is hybrid but has no frequency summary"),
            std::string::npos)
      << h.output;
}

}  // namespace
