// `dlrec etl` as a job of several processes (docs/ETL.md "Several processes"): under
// `mpirun -np 2` and 3, and started by `dlrec etl --processes 2` itself, the output directory is
// byte-identical to the single-process run's, on `dlrec datagen`'s Criteo-like data and on
// several files; a malformed row in rank 1's part ends the job (no hang) with a message naming
// the rank, the file and the line; nothing is left of the output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "dist/run_job.h"  // tests/dist/run_job.h
#include "dlrec/core/file_util.h"
#include "dlrec/dist/communicator.h"
#include "test_files.h"

namespace dlrec {
namespace {

using dlrec::testing::list_dir;
using dlrec::testing::mpirun_prefix;
using dlrec::testing::read_all;
using dlrec::testing::run_job;
using dlrec::testing::TempDir;

const std::string kDlrec = std::string(DLREC_BIN_DIR) + "/dlrec";

#define SKIP_WITHOUT_MPI()                                                                 \
  if (!dist::mpi_built() || mpirun_prefix(2).empty())                                      \
  GTEST_SKIP() << "this build has no MPI or mpirun is not installed (Debian: openmpi-bin " \
                  "libopenmpi-dev)"

void expect_same_dirs(const std::string& a, const std::string& b) {
  const auto names = list_dir(a);
  ASSERT_EQ(names, list_dir(b)) << a << " vs " << b;
  ASSERT_GT(names.size(), 3u);
  for (const auto& n : names) EXPECT_TRUE(read_all(a + "/" + n) == read_all(b + "/" + n)) << n;
}

void datagen(const std::string& out, int rows, int seed) {
  auto r = run_job(kDlrec + " datagen --out " + out + " --rows " + std::to_string(rows) +
                       " --seed " + std::to_string(seed),
                   120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// Runs `prefix dlrec etl <args> --out dir` and expects success, by `processes` processes; with
// several, the statistics merged across them (`merged`) or the rows gathered on rank 0.
void etl(const std::string& prefix, const std::string& args, const std::string& dir,
         int processes = 1, bool merged = true) {
  auto r = run_job(prefix + kDlrec + " etl " + args + " --out " + dir, 300);
  ASSERT_FALSE(r.hung) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string parsed = "etl: " + std::to_string(processes) + " processes parsed";
  EXPECT_EQ(r.output.find(parsed) != std::string::npos, processes > 1) << r.output;
  const std::string merge = "statistics merged across " + std::to_string(processes);
  EXPECT_EQ(r.output.find(merge) != std::string::npos, processes > 1 && merged) << r.output;
  EXPECT_EQ(r.output.find("rank 0 gathers every row") != std::string::npos,
            processes > 1 && !merged)
      << r.output;
}

TEST(EtlRanksTest, MpirunOutputIsTheSingleProcessBytes) {
  SKIP_WITHOUT_MPI();
  TempDir tmp("etl_ranks_same");
  const std::string in = tmp.path + "/day.tsv";
  datagen(in, 30000, 3);
  const std::string args = "--input " + in + " --shard-rows 4000";
  etl("", args, tmp.path + "/plain");
  etl(mpirun_prefix(1), args, tmp.path + "/np1");
  etl(mpirun_prefix(2), args, tmp.path + "/np2", 2);
  etl(mpirun_prefix(3), args, tmp.path + "/np3", 3);
  // dlrec starting mpirun itself (the CI container's transport setting through the environment).
  etl(dlrec::testing::kMpiEnv, args + " --processes 2", tmp.path + "/self2", 2);
  for (const char* d : {"/np1", "/np2", "/np3", "/self2"})
    expect_same_dirs(tmp.path + "/plain", tmp.path + d);
}

TEST(EtlRanksTest, SeveralFilesShuffledForTrainingRanks) {
  SKIP_WITHOUT_MPI();
  TempDir tmp("etl_ranks_files");
  std::string inputs;
  for (int f = 0; f < 3; ++f) {
    const std::string p = tmp.path + "/part" + std::to_string(f) + ".tsv";
    datagen(p, 4000 + 3000 * f, 10 + f);
    inputs += " --input " + p;
  }
  const std::string args = inputs + " --shard-rows 2500 --shuffle --seed 4 --ranks 2";
  etl("", args, tmp.path + "/plain");
  // --shuffle and --ranks are not merged yet: the rows go to rank 0.
  etl(mpirun_prefix(2), args, tmp.path + "/np2", 2, /*merged=*/false);
  etl(mpirun_prefix(3), args, tmp.path + "/np3", 3, /*merged=*/false);
  expect_same_dirs(tmp.path + "/plain", tmp.path + "/np2");
  expect_same_dirs(tmp.path + "/plain", tmp.path + "/np3");
  EXPECT_TRUE(file_exists(tmp.path + "/np3/ranks.json"));
}

// Every op kind the merged fit handles: Categorify with a frequency threshold, a size cap and
// OOV buckets (counts added across ranks), HashBucket, Bucketize, dense value ops, the column
// statistics of stats.json (min/max folded, means from the sums continued rank after rank);
// several files, a --train-rows split and small shards, so that files straddle the ranks
// (rows sent to their owner). Then a workflow whose fit is not merged (Normalize): the rows are
// gathered on rank 0, the output the same.
TEST(EtlRanksTest, MergedFitOfEveryMergedOpKindIsTheSingleProcessBytes) {
  SKIP_WITHOUT_MPI();
  TempDir tmp("etl_ranks_ops");
  std::string inputs;
  for (int f = 0; f < 2; ++f) {
    const std::string p = tmp.path + "/part" + std::to_string(f) + ".tsv";
    datagen(p, 7000 + 2000 * f, 20 + f);
    inputs += " --input " + p;
  }
  std::string rest;  // C1, C2, C6 ... C26
  for (int c = 1; c <= 26; ++c)
    if (c < 3 || c > 5)
      rest += std::string(rest.empty() ? "" : ", ") + "\"C" + std::to_string(c) + "\"";
  const std::string wf = dlrec::testing::write_file(tmp.path, "wf.json", R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": ["I2"], "ops": [{"op": "Bucketize", "boundaries": [0.5, 1, 2, 4]}]},
    {"columns": [)" + rest + R"(], "ops": [{"op": "Categorify", "freq_threshold": 3}]},
    {"columns": ["C3", "C4"], "ops": [{"op": "Categorify", "max_size": 50, "num_buckets": 7}]},
    {"columns": ["C5"], "ops": [{"op": "HashBucket", "num_buckets": 1000}]}]})");
  const std::string args = inputs + " --workflow " + wf + " --train-rows 12345 --shard-rows 1700";
  etl("", args, tmp.path + "/plain");
  etl(mpirun_prefix(2), args, tmp.path + "/np2", 2);
  etl(mpirun_prefix(3), args, tmp.path + "/np3", 3);
  expect_same_dirs(tmp.path + "/plain", tmp.path + "/np2");
  expect_same_dirs(tmp.path + "/plain", tmp.path + "/np3");

  const std::string norm = dlrec::testing::write_file(tmp.path, "norm.json", R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  const std::string nargs = inputs + " --workflow " + norm + " --shard-rows 5000";
  etl("", nargs, tmp.path + "/nplain");
  etl(mpirun_prefix(3), nargs, tmp.path + "/nnp3", 3, /*merged=*/false);
  expect_same_dirs(tmp.path + "/nplain", tmp.path + "/nnp3");
}

// A row that fails the transform (LogOp of -5: not finite) in a shard file that rank 1 writes,
// in a merged job: the job ends (no hang) with the single process's message from rank 1, and
// no dataset is left.
TEST(EtlRanksTest, TransformErrorInRankOnesShardEndsTheJob) {
  SKIP_WITHOUT_MPI();
  TempDir tmp("etl_ranks_nan");
  const std::string good = tmp.path + "/good.tsv";
  datagen(good, 4000, 7);
  // Field 2 (I1) of line 3500 becomes -5.
  std::string text = read_all(good);
  size_t at = 0;
  for (int l = 1; l < 3500; ++l) at = text.find('\n', at) + 1;
  const size_t tab = text.find('\t', at) + 1;
  text.replace(tab, text.find('\t', tab) - tab, "-5");
  const std::string bad = dlrec::testing::write_file(tmp.path, "bad.tsv", text);
  const std::string wf = dlrec::testing::write_file(tmp.path, "wf.json", R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}]},
    {"columns": ["I1"], "ops": [{"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  const std::string args = " etl --input " + bad + " --workflow " + wf + " --shard-rows 1000";
  const std::string expect = "at line 3500 after its ops (raw value -5)";  // (-nan or nan)
  auto one = run_job(kDlrec + args + " --out " + tmp.path + "/one", 120);
  ASSERT_NE(one.exit_code, 0) << one.output;
  ASSERT_NE(one.output.find(expect), std::string::npos) << one.output;
  auto r = run_job(mpirun_prefix(2) + kDlrec + args + " --out " + tmp.path + "/two", 120);
  EXPECT_FALSE(r.hung) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("statistics merged across 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2: dense column 'I1' is "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(expect), std::string::npos) << r.output;
  EXPECT_FALSE(file_exists(tmp.path + "/two/dataset.json"));
}

TEST(EtlRanksTest, ProcessesDisagreeingWithTheJobIsAnError) {
  SKIP_WITHOUT_MPI();
  TempDir tmp("etl_ranks_n");
  const std::string in = tmp.path + "/in.tsv";
  datagen(in, 500, 6);
  auto r = run_job(
      mpirun_prefix(2) + kDlrec + " etl --input " + in + " --out " + tmp.path + "/o --processes 3",
      120);
  EXPECT_FALSE(r.hung) << r.output;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("this job has 2 processes but the command asks for 3"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace dlrec
