// `dlrec train` with sharded tables on 4 ranks declared as 2 nodes (--ranks-per-node 2): the
// hierarchical all-to-all is pure data movement, so the job's metrics equal the flat
// all-to-all's byte for byte; the topology is printed once; bad topology options are clear
// errors (docs/DISTRIBUTED.md, "Several nodes").
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "dist/dist_train_util.h"
#include "dist/run_job.h"
#include "dlrec/core/config.h"
#include "dlrec/dist/communicator.h"
#include "test_files.h"

using namespace dlrec;
using dlrec::testing::mpirun_prefix;
using dlrec::testing::run_job;
using dlrec::testing::TempDir;

namespace {

const std::string& kDlrec = dlrec::testing::kDlrecBin;

// 4,000 training rows, five categorical features (one multi-hot), the tables sharded every way
// the CPU engine knows (each kind exchanges through all_to_all_v).
struct Data {
  TempDir tmp{"hier_train"};
  std::string dir = tmp.path + "/data", config = tmp.path + "/config.json";
  Data() {
    dlrec::testing::TestEtl etl;
    etl.workflow = dlrec::testing::dist_train_workflow(/*normalize=*/false);
    etl.train_rows = 4000;
    dlrec::testing::generate_and_etl(dlrec::testing::dist_train_gen(5000, 5),
                                     tmp.path + "/logs.tsv", dir, etl);
    std::ofstream(config) << R"({
      "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
      "optimizer": {"type": "adagrad", "lr": 0.05, "adagrad_init": 0.01},
      "train": {"batch_size": 32, "max_steps": 120, "log_every": 10, "seed": 3},
      "sharding": {"memory_per_rank_gb": 1, "replicate_max_bytes": 0,
                   "tables": {"emb.0": {"kind": "row_wise"}, "emb.1": {"kind": "column_wise"},
                              "emb.2": {"kind": "table_wise", "owner": 3},
                              "emb.3": {"kind": "replicated"}}}})";
  }
  std::string train(const std::string& run, const std::string& extra) const {
    return mpirun_prefix(4) +
           dlrec::testing::train_command(config, dir, tmp.path + "/" + run, 8,
                                         tmp.path + "/" + run + ".jsonl") +
           " " + extra;
  }
  std::string log(const std::string& run) const {
    std::ifstream f(tmp.path + "/" + run + ".jsonl");
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

TEST(HierarchicalTraining, TwoDeclaredNodesGiveTheFlatJobsMetricsExactly) {
  if (!dist::mpi_built() || mpirun_prefix(4).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  Data d;
  auto hier = run_job(d.train("hier", "--ranks-per-node 2"), 300);
  ASSERT_EQ(hier.exit_code, 0) << hier.output;
  const std::string line =
      "[dist] 4 ranks on 2 nodes (2 per node, from --ranks-per-node 2): node 0 (";
  EXPECT_NE(hier.output.find(line), std::string::npos) << hier.output;
  EXPECT_EQ(hier.output.find(line), hier.output.rfind(line)) << "printed once: " << hier.output;
  EXPECT_NE(hier.output.find("all-to-all: hierarchical"), std::string::npos) << hier.output;
  auto flat = run_job(d.train("flat", "--ranks-per-node 2 --all-to-all flat"), 300);
  ASSERT_EQ(flat.exit_code, 0) << flat.output;
  EXPECT_NE(flat.output.find("all-to-all: flat"), std::string::npos) << flat.output;
  const std::string a = d.log("hier"), b = d.log("flat");
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 13) << a;  // 12 logged losses, the evaluation
  EXPECT_NE(a.find("\"auc\""), std::string::npos) << a;
  EXPECT_EQ(a, b);  // every logged loss and the evaluation, to the last digit
}

TEST(HierarchicalTraining, BadTopologyOptionsAreClearErrors) {
  if (!dist::mpi_built() || mpirun_prefix(4).empty())
    GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin)";
  Data d;
  auto r = run_job(d.train("bad", "--ranks-per-node 3"), 120);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(r.hung) << r.output;
  EXPECT_NE(r.output.find("--ranks-per-node 3 does not divide the job's 4 ranks into whole nodes"),
            std::string::npos)
      << r.output;
  auto t = run_job(kDlrec + " train --config " + d.config + " --data " + d.dir + " --run " +
                       d.tmp.path + "/t --all-to-all tree",
                   60);
  EXPECT_NE(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("--all-to-all"), std::string::npos) << t.output;
}

}  // namespace
