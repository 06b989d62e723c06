// Data-parallel training of CUDA engine models on 2 (and 4) GPUs (NCCL) against one GPU, with
// the tables replicated or sharded (table-wise, row-wise, column-wise, replicated with the
// gradient all-reduced, hybrid)
// (docs/DISTRIBUTED.md, "Across GPUs"): the same data and seed, a global batch of per-GPU batch x
// GPUs, the same loss at every logged step (1e-5 relative) and the same final AUC (1e-4), over
// 1,000 steps in fp32; and the configurations the GPUs refuse, with their messages. Every test
// here skips visibly on a machine without 2 GPUs, NCCL or mpirun (CI has none of them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "dist/dist_train_util.h"
#include "dist/run_job.h"
#include "dlrec/core/config.h"
#include "dlrec/core/device.h"
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

#define SKIP_WITHOUT_TWO_GPUS()                                                                  \
  if (!dist::mpi_built() || mpirun_prefix(2).empty())                                            \
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed: GPU data parallelism is " \
                    "not tested here";                                                           \
  if (!dist::nccl_built())                                                                       \
    GTEST_SKIP() << "this build has no NCCL (a CUDA build with NCCL is needed)";                 \
  if (cuda::device_count() < 2)                                                                  \
  GTEST_SKIP() << "this machine has " << cuda::device_count()                                    \
               << " GPU(s); training across GPUs needs 2"

// 10,000 training rows (the last global batch of each epoch is partial: 16 rows at 64, 8 + 8
// on two GPUs), 2,000 validation rows, one multi-hot feature (bags of several ids).
struct Data {
  TempDir tmp{"gpudp"};
  std::string dir = tmp.path + "/data", config = tmp.path + "/config.json";
  // extra: more top-level config sections (", \"sharding\": {}"); dim: the tables' width (and
  // the bottom MLP's output).
  // model_extra: more model keys (", \"pooling\": \"mean\"").
  Data(const std::string& optimizer, const std::string& precision, const std::string& extra = "",
       int dim = 8, const std::string& model_extra = "") {
    make_dist_train_data(tmp.path, dir);
    std::ofstream(config) << R"({
      "model": {"embedding_dim": )"
                          << dim << R"(, "bottom_mlp": [16, )" << dim << R"(], "top_mlp": [16, 1])"
                          << model_extra << R"(},
      "optimizer": )" << optimizer
                          << R"(,
      "train": {"batch_size": 32, "epochs": 7, "max_steps": 1000, "log_every": 10,
                "seed": 3, "device": "cuda", "precision": ")"
                          << precision << R"("})" << extra << "}";
  }
  std::string train_args(const std::string& run, int64_t batch, const std::string& log) const {
    return train_command(config, dir, tmp.path + "/" + run, batch, tmp.path + "/" + log) +
           " --comm-timeout 120";
  }
  std::vector<json> metrics(const std::string& log) const {
    return read_metrics(tmp.path + "/" + log);
  }
};

// One GPU at batch 64 against `dlrec train --gpus N` at 64 / N per GPU: every logged loss within
// 1e-5 relative, the final AUC within 1e-4. `extra`: more config sections (sharding).
void expect_gpus_match_one(const std::string& optimizer, int gpus = 2,
                           const std::string& extra = "", const char* label = "table-wise",
                           int dim = 8) {
  Data d(optimizer, "fp32", extra, dim);
  auto one = run_job(d.train_args("one", 64, "one.jsonl") + " --comm single", 900);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto many = run_job(
      d.train_args("many", 64 / gpus, "many.jsonl") + " --gpus " + std::to_string(gpus), 900);
  ASSERT_EQ(many.exit_code, 0) << many.output;
  EXPECT_NE(many.output.find("trained: steps=1000 samples=63712 "), std::string::npos)
      << many.output;
  if (!extra.empty()) {  // the plan is printed once (rank 0), with each GPU's tables
    EXPECT_NE(many.output.find("table_wise"), std::string::npos) << many.output;
    if (extra.find("row_wise") != std::string::npos) {
      EXPECT_NE(many.output.find("row_wise"), std::string::npos) << many.output;
    }
    if (extra.find("column_wise") != std::string::npos) {  // a piece's columns in the plan
      EXPECT_NE(many.output.find("column_wise"), std::string::npos) << many.output;
      EXPECT_NE(many.output.find("cols [4, 8) of " + std::to_string(dim)), std::string::npos)
          << many.output;
    }
    if (extra.find("\"hybrid\"") != std::string::npos) {  // the prefix and the owner
      EXPECT_NE(many.output.find("hybrid emb.4: ids [0, 20) on every GPU, the others on GPU "),
                std::string::npos)
          << many.output;
    }
    if (extra.find("\"replicated\"") != std::string::npos) {  // the plan's count of them
      EXPECT_EQ(many.output.find("(0 replicated,"), std::string::npos) << many.output;
    }
    EXPECT_NE(many.output.find("[shard] GPU " + std::to_string(gpus - 1) + ": "), std::string::npos)
        << many.output;
  }
  const std::vector<json> a = d.metrics("one.jsonl"), b = d.metrics("many.jsonl");
  double worst = 0;  // over 100 logged losses, then the evaluation
  ASSERT_NO_FATAL_FAILURE(expect_same_logged_losses(a, b, 101, &worst));
  EXPECT_EQ(a.back()["rows"], 2000);
  EXPECT_EQ(b.back()["rows"], 2000);
  EXPECT_NEAR(a.back()["auc"].get<double>(), b.back()["auc"].get<double>(), 1e-4);
  EXPECT_GT(a.back()["auc"].get<double>(), 0.6);  // it learned something
  if (!extra.empty()) {
    // The sharded run's checkpoint (each table streamed from its owner to rank 0) is the whole
    // model: one GPU evaluates it to the job's AUC; and a resume on the GPUs (each loading the
    // tables it owns) evaluates to it too.
    auto ev = run_job(kDlrec + " eval --run " + d.tmp.path + "/many", 300);
    ASSERT_EQ(ev.exit_code, 0) << ev.output;
    const double job_auc = b.back()["auc"].get<double>();
    const size_t at = ev.output.find("AUC=");
    ASSERT_NE(at, std::string::npos) << ev.output;
    EXPECT_NEAR(std::stod(ev.output.substr(at + 4, 12)), job_auc, 1e-4) << ev.output;
    auto re = run_job(d.train_args("many", 64 / gpus, "resumed.jsonl") + " --gpus " +
                          std::to_string(gpus) + " --resume",
                      300);
    ASSERT_EQ(re.exit_code, 0) << re.output;
    EXPECT_NE(re.output.find("resumed from"), std::string::npos) << re.output;
    const std::vector<json> c = d.metrics("resumed.jsonl");
    ASSERT_FALSE(c.empty()) << re.output;
    EXPECT_NEAR(c.back()["auc"].get<double>(), job_auc, 1e-6) << re.output;
  }
  std::printf(
      "[gpu dp%s] 1000 steps: worst relative loss difference %.3g, AUC %.6f (1 GPU) vs "
      "%.6f (%d GPUs)\n",
      extra.empty() ? "" : (std::string(" ") + label).c_str(), worst, a.back()["auc"].get<double>(),
      b.back()["auc"].get<double>(), gpus);
}
void expect_two_gpus_match_one(const std::string& optimizer) { expect_gpus_match_one(optimizer); }

// Table-wise sharding: the planner's placement, and one table's owner set by the config.
// "replicate": 0 keeps every table table-wise (the cost rule would replicate the 40-row tables
// of this small model: GpuReplicated below).
const char* kTableWise =
    R"(, "sharding": {"replicate": 0, "tables": {"emb.0": {"kind": "table_wise", "owner": 1}}})";

TEST(GpuTableWise, TwoGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 2, kTableWise);
}

TEST(GpuTableWise, TwoGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 2, kTableWise);
}

TEST(GpuTableWise, FourGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 4, kTableWise);
}

TEST(GpuTableWise, FourGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 4, kTableWise);
}

// The optimizers whose state is a row's own (Adam: m, v and a step count; rowwise_adagrad) and
// SGD with momentum, across GPUs: Adam on the dense layers and table-wise tables (the checkpoint,
// each table's state streamed from its owner to rank 0, evaluates on one GPU and resumes on
// two); row-wise Adagrad on the tables beside Nesterov momentum on the dense layers, table-wise
// and then data-parallel (no sharding section: every rank applies the global batch's update).
TEST(GpuTableWise, TwoGpusMatchOneGpuOver1000StepsAdam) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "adam", "lr": 0.001})", 2, kTableWise);
}

TEST(GpuTableWise, TwoGpusMatchOneGpuOver1000StepsRowWiseAdagradMomentum) {
  SKIP_WITHOUT_TWO_GPUS();
  const char* rowwise_momentum = R"({"type": "sgd", "lr": 0.05, "momentum": 0.9,
      "nesterov": true,
      "embedding": {"type": "rowwise_adagrad", "lr": 0.05, "adagrad_init": 0.01}})";
  expect_gpus_match_one(rowwise_momentum, 2, kTableWise);
  expect_two_gpus_match_one(rowwise_momentum);
}

// Row-wise sharding: the multi-hot table (emb.4, bags of several ids: partial sums from several
// GPUs) split by rows over every GPU, one table's owner set, the others placed by the planner.
const char* kRowWise =
    R"(, "sharding": {"replicate": 0, "tables": {"emb.4": {"kind": "row_wise"},
                                 "emb.0": {"kind": "table_wise", "owner": 1}}})";

TEST(GpuRowWise, TwoGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 2, kRowWise, "row-wise");
}

TEST(GpuRowWise, TwoGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 2, kRowWise,
                        "row-wise");
}

TEST(GpuRowWise, FourGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 4, kRowWise, "row-wise");
}

TEST(GpuRowWise, FourGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 4, kRowWise,
                        "row-wise");
}

// Replicated tables (dense gradient all-reduced) beside table-wise and row-wise ones: the
// multi-hot table and emb.1 replicated by the config, emb.0 table-wise on GPU 1, emb.2 row-wise,
// the others by the cost rule ("replicate": "auto").
const char* kReplicated =
    R"(, "sharding": {"replicate": "auto", "tables": {"emb.4": {"kind": "replicated"},
                                 "emb.1": {"kind": "replicated"},
                                 "emb.2": {"kind": "row_wise"},
                                 "emb.0": {"kind": "table_wise", "owner": 1}}})";

TEST(GpuReplicated, TwoGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 2, kReplicated, "replicated");
}

TEST(GpuReplicated, FourGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 4, kReplicated,
                        "replicated");
}

// Column-wise sharding: the multi-hot table (emb.4) split by columns over the GPUs (pieces of
// 4 columns: [0, 4) and [4, 8) at dim 8 on 2 GPUs; 4 x 4 at dim 16 on 4; with "pieces": 3 at
// dim 16 on 4 GPUs widths 4, 4 and 8, two widths and one GPU without a piece), beside a row-wise
// and a table-wise table with its owner set.
std::string column_wise(const std::string& pieces = "") {
  return R"(, "sharding": {"replicate": 0, "tables": {"emb.4": {"kind": "column_wise")" + pieces +
         R"(}, "emb.2": {"kind": "row_wise"}, "emb.0": {"kind": "table_wise", "owner": 1}}})";
}

TEST(GpuColumnWise, TwoGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 2, column_wise(), "column-wise");
}

TEST(GpuColumnWise, TwoGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 2,
                        column_wise(), "column-wise");
}

TEST(GpuColumnWise, FourGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 4, column_wise(), "column-wise", 16);
}

TEST(GpuColumnWise, FourGpusThreePiecesMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 4,
                        column_wise(R"(, "pieces": 3)"), "column-wise", 16);
}

// Hybrid tables (the frequent ids on every GPU, the others on the owner, their rows written
// straight into the ranks' buffers): the multi-hot table (bags mixing frequent and other ids)
// and emb.1, beside a row-wise and a table-wise table and the cost rule's replicas.
const char* kHybrid =
    R"(, "sharding": {"replicate": "auto", "tables": {"emb.4": {"kind": "hybrid", "frequent_rows": 20},
                                 "emb.1": {"kind": "hybrid", "frequent_rows": 7},
                                 "emb.2": {"kind": "row_wise"},
                                 "emb.0": {"kind": "table_wise", "owner": 1}}})";

TEST(GpuHybrid, TwoGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "sgd", "lr": 0.1})", 2, kHybrid, "hybrid");
}

TEST(GpuHybrid, TwoGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 2, kHybrid,
                        "hybrid");
}

TEST(GpuHybrid, FourGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  if (cuda::device_count() < 4)
    GTEST_SKIP() << "this machine has " << cuda::device_count() << " GPUs; the test needs 4";
  expect_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})", 4, kHybrid,
                        "hybrid");
}

TEST(GpuDataParallel, TwoGpusMatchOneGpuOver1000StepsSgd) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_two_gpus_match_one(R"({"type": "sgd", "lr": 0.1})");
}

TEST(GpuDataParallel, TwoGpusMatchOneGpuOver1000StepsAdagrad) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_two_gpus_match_one(R"({"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01})");
}

// What does not run across GPUs yet ends the job with a message naming it.
TEST(GpuDataParallel, UnsupportedConfigurationsAreClearErrors) {
  SKIP_WITHOUT_TWO_GPUS();
  {
    Data d(R"({"type": "sgd", "lr": 0.1})", "fp16");
    auto r = run_job(d.train_args("fp16", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("dynamic loss scaling across GPUs is not supported"), std::string::npos)
        << r.output;
  }
  {  // more column pieces than GPUs
    Data d(R"({"type": "sgd", "lr": 0.1})", "fp32",
           R"(, "sharding": {"tables": {"emb.1": {"kind": "column_wise", "pieces": 3}}})");
    auto r = run_job(d.train_args("cols", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("table 'emb.1' asks for 3 column pieces but the job has 2 rank(s)"),
              std::string::npos)
        << r.output;
  }
  {  // bf16 splits columns in 16-byte vectors of 8 values: dim 8 is one piece
    Data d(R"({"type": "sgd", "lr": 0.1})", "bf16",
           R"(, "sharding": {"tables": {"emb.1": {"kind": "column_wise"}}})");
    auto r = run_job(d.train_args("cols16", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("sharding.tables.emb.1.kind: \"column_wise\" on the GPUs splits "
                            "columns in multiples of 8"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("dim 8 gives 1 piece(s)"), std::string::npos) << r.output;
  }
  {  // a hybrid prefix as large as the table (its ids >= F would be none)
    Data d(R"({"type": "sgd", "lr": 0.1})", "fp32",
           R"(, "sharding": {"tables": {"emb.1": {"kind": "hybrid", "frequent_rows": 100000}}})");
    auto r = run_job(d.train_args("hyb", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("frequent_rows: 100000 is out of range"), std::string::npos)
        << r.output;
  }
  {  // hybrid tables pool by sum
    Data d(R"({"type": "sgd", "lr": 0.1})", "fp32",
           R"(, "sharding": {"tables": {"emb.1": {"kind": "hybrid", "frequent_rows": 5}}})", 8,
           R"(, "pooling": "mean")");
    auto r = run_job(d.train_args("hybmean", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("hybrid tables on the GPUs pool by sum (this layer pools by mean)"),
              std::string::npos)
        << r.output;
  }
  {  // Adam's per-row state on a row-wise piece
    Data d(R"({"type": "sgd", "lr": 0.1, "embedding": {"type": "adam"}})", "fp32",
           R"(, "sharding": {"tables": {"emb.2": {"kind": "row_wise"}}})");
    auto r = run_job(d.train_args("adamrw", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("table 'emb.2' is row_wise; optimizer.embedding \"adam\" trains "
                            "across GPUs with table-wise tables only"),
              std::string::npos)
        << r.output;
  }
  {  // a replication rule that is neither "auto" nor a size
    Data d(R"({"type": "sgd", "lr": 0.1})", "fp32", R"(, "sharding": {"replicate": "all"})");
    auto r = run_job(d.train_args("repl", 32, "m.jsonl") + " --gpus 2", 300);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("sharding.replicate' must be \"auto\" or a size in bytes"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
