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

// Runs `prefix dlrec etl <args> --out dir` and expects success, by `processes` processes.
void etl(const std::string& prefix, const std::string& args, const std::string& dir,
         int processes = 1) {
  auto r = run_job(prefix + kDlrec + " etl " + args + " --out " + dir, 300);
  ASSERT_FALSE(r.hung) << r.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string parsed = "etl: " + std::to_string(processes) + " processes parsed";
  EXPECT_EQ(r.output.find(parsed) != std::string::npos, processes > 1) << r.output;
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
  etl(mpirun_prefix(2), args, tmp.path + "/np2", 2);
  etl(mpirun_prefix(3), args, tmp.path + "/np3", 3);
  expect_same_dirs(tmp.path + "/plain", tmp.path + "/np2");
  expect_same_dirs(tmp.path + "/plain", tmp.path + "/np3");
  EXPECT_TRUE(file_exists(tmp.path + "/np3/ranks.json"));
}

TEST(EtlRanksTest, MalformedRowOnRankOneEndsTheJobNamingRankFileAndLine) {
  SKIP_WITHOUT_MPI();
  TempDir tmp("etl_ranks_bad");
  const std::string good = tmp.path + "/good.tsv";
  datagen(good, 4000, 5);
  // Line 3500 of 4000 (in rank 1's half) loses its fields.
  std::string text = read_all(good);
  size_t at = 0;
  for (int l = 1; l < 3500; ++l) at = text.find('\n', at) + 1;
  text.replace(at, text.find('\n', at) - at, "1\t2");
  const std::string bad = dlrec::testing::write_file(tmp.path, "bad.tsv", text);
  const std::string expect = bad + ":3500: expected 40 fields, got 2";
  auto single = run_job(kDlrec + " etl --input " + bad + " --out " + tmp.path + "/one", 120);
  ASSERT_NE(single.exit_code, 0);
  EXPECT_NE(single.output.find(expect), std::string::npos) << single.output;

  auto r = run_job(mpirun_prefix(2) + kDlrec + " etl --input " + bad + " --out " + tmp.path +
                       "/two --on-error=fail",
                   120);
  EXPECT_FALSE(r.hung) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2: " + expect), std::string::npos) << r.output;
  EXPECT_FALSE(file_exists(tmp.path + "/two"));

  // --on-error=skip: the same output as one process.
  etl("", "--input " + bad + " --on-error=skip", tmp.path + "/skip1");
  etl(mpirun_prefix(2), "--input " + bad + " --on-error=skip", tmp.path + "/skip2", 2);
  expect_same_dirs(tmp.path + "/skip1", tmp.path + "/skip2");
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
