// Compression training across data-parallel CPU ranks (docs/COMPRESSION.md): 2:4 masks on a
// schedule, QAT whose input ranges every rank keeps over the global batch, and distillation from
// a dense teacher, under mpirun against one process on the same data and seed: every logged loss
// within 1e-5 relative, the final AUC within 1e-4, and the checkpoints' QAT ranges alike.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dist/dist_train_util.h"
#include "dist/run_job.h"
#include "dlrec/core/config.h"
#include "dlrec/dist/communicator.h"
#include "dlrec/io/tensor_file.h"
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

const char* kModel = R"("model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 8, 1]},
      "optimizer": {"type": "sgd", "lr": 0.1})";

// The QAT ranges of a checkpoint (meta "qat": the weights; tensors "<weight>.qat_amax").
std::vector<std::pair<std::string, float>> qat_ranges(const std::string& checkpoint) {
  const json meta = io::read_tensor_meta(checkpoint);
  std::vector<io::NamedTensor> targets;
  for (const auto& n : meta.at("qat"))
    targets.emplace_back(n.get<std::string>() + ".qat_amax", Tensor::empty({1}, DType::F32));
  io::TensorLoadOptions opt;
  opt.allow_extra = true;
  io::load_tensors(checkpoint, targets, opt);
  std::vector<std::pair<std::string, float>> out;
  for (const auto& [name, t] : targets) out.emplace_back(name, t.data<float>()[0]);
  return out;
}

TEST(CompressDataParallel, SparseQatWithDistillationOnTwoRanksMatchesOneProcess) {
  if (!dist::mpi_built() || mpirun_prefix(2).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin "
                    "libopenmpi-dev); compression across ranks is not tested here";
  TempDir tmp("cdp");
  const std::string data = tmp.path + "/data", dense_cfg = tmp.path + "/dense.json",
                    cfg = tmp.path + "/compress.json", teacher = tmp.path + "/teacher";
  make_dist_train_data(tmp.path, data);
  std::ofstream(dense_cfg) << "{" << kModel << R"(,
      "train": {"epochs": 3, "max_steps": 300, "log_every": 0, "seed": 5}})";
  auto dense = run_job(train_command(dense_cfg, data, tmp.path + "/dense", 64,
                                     tmp.path + "/dense.jsonl") + " --comm single", 300);
  ASSERT_EQ(dense.exit_code, 0) << dense.output;
  auto exp = run_job(dlrec::testing::kDlrecBin + " export --run " + tmp.path + "/dense --out " +
                         teacher, 120);
  ASSERT_EQ(exp.exit_code, 0) << exp.output;
  // The fine-tune of the dense checkpoint: QAT from its first step (the range the first global
  // batch's), the masks computed at steps 350, 400, 450 and 500 from the ranks' (equal)
  // weights, and the teacher scoring each rank's rows.
  std::ofstream(cfg) << "{" << kModel << R"(,
      "train": {"epochs": 7, "max_steps": 600, "log_every": 10, "seed": 3},
      "compress": {
        "sparsity": {"pattern": "2:4", "skip_incompatible": true,
                     "schedule": {"start_step": 350, "end_step": 500, "every": 50}},
        "qat": {"ema_decay": 0.9},
        "distill": {"teacher": ")" << teacher << R"(", "alpha": 0.5, "temperature": 2.0}}})";
  for (const char* run : {"/one", "/two"}) {
    std::filesystem::create_directories(tmp.path + run);
    std::filesystem::copy_file(tmp.path + "/dense/checkpoint.dlrec",
                               tmp.path + run + "/checkpoint.dlrec");
  }
  auto one = run_job(train_command(cfg, data, tmp.path + "/one", 64, tmp.path + "/one.jsonl") +
                         " --comm single --resume",
                     600);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto two = run_job(mpirun_prefix(2) + train_command(cfg, data, tmp.path + "/two", 32,
                                                      tmp.path + "/two.jsonl") + " --resume",
                     600);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto a = read_metrics(tmp.path + "/one.jsonl"), b = read_metrics(tmp.path + "/two.jsonl");
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(expect_same_logged_losses(a, b, 31, &worst));
  EXPECT_EQ(a.back()["rows"], 2000);
  EXPECT_EQ(b.back()["rows"], 2000);
  EXPECT_NEAR(a.back()["auc"].get<double>(), b.back()["auc"].get<double>(), 1e-4);
  EXPECT_GT(a.back()["auc"].get<double>(), 0.6);  // it learned something
  const auto ra = qat_ranges(tmp.path + "/one/checkpoint.dlrec"),
             rb = qat_ranges(tmp.path + "/two/checkpoint.dlrec");
  ASSERT_EQ(ra.size(), rb.size());
  ASSERT_FALSE(ra.empty());
  double worst_range = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    ASSERT_EQ(ra[i].first, rb[i].first);
    ASSERT_GT(ra[i].second, 0.f) << ra[i].first;
    worst_range = std::max(worst_range, std::fabs(double(ra[i].second) - rb[i].second) / ra[i].second);
    EXPECT_NEAR(ra[i].second, rb[i].second, 1e-5 * ra[i].second) << ra[i].first;
  }
  std::printf("[compress dp] steps 300-600: worst relative loss difference %.3g, QAT ranges %.3g, "
              "AUC %.6f vs %.6f\n", worst, worst_range, a.back()["auc"].get<double>(),
              b.back()["auc"].get<double>());
}

}  // namespace
