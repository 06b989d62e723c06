// Shared by the tests/compress programs: the synthetic data they train on (datagen + ETL) and
// running the dlrec binary as a command line.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "dlrec/core/config.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/datagen.h"
#include "dlrec/io/shard.h"
#include "etl_test_util.h"

namespace dlrec::testing {

// Synthetic logs of `num_dense` dense and 3 categorical features in `dir`, through the ETL
// (dense: fill + normalize; categorical: categorify) into dir/data, the last sixth of the rows
// the validation split; returns dir/data.
inline std::string make_compress_data(const std::string& dir, int num_dense, int64_t rows,
                                      uint64_t seed,
                                      std::vector<int64_t> cardinalities = {20, 100}) {
  make_dirs(dir);
  const std::string logs = dir + "/logs.tsv", data = dir + "/data";
  io::DatagenConfig gen;
  gen.rows = rows;
  gen.seed = seed;
  gen.num_dense = num_dense;
  gen.num_cat = 3;
  gen.cardinalities = std::move(cardinalities);
  TestEtl etl;
  etl.workflow = R"({"pipeline": [
      {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"}]},
      {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})";
  etl.train_rows = rows * 5 / 6;
  etl.shard_rows = 1000;
  generate_and_etl(gen, logs, data, etl);
  return data;
}

// The first `rows` rows of the validation split of the ETL output `data` (an error when it has
// none).
inline io::Batch first_valid_batch(const std::string& data, int64_t rows = 400) {
  const io::DatasetInfo info = io::DatasetInfo::load(data);
  DLREC_CHECK(!info.valid_shards.empty(), "'", data, "' has no validation shard");
  io::ShardLoader loader({data + "/" + info.valid_shards.at(0)}, rows);
  io::Batch b;
  DLREC_CHECK(loader.next(b), "'", data, "': the validation shard holds no rows");
  return b;
}

// The dlrec binary beside this test program (a bundle copied elsewhere), else the build's.
inline std::string dlrec_bin() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    const std::string beside = std::filesystem::path(self).parent_path().string() + "/dlrec";
    if (file_exists(beside)) return beside;
  }
  return std::string(DLREC_BIN_DIR) + "/dlrec";
}

// Runs `dlrec ARGS` (stderr into the output); its exit code, -1 when it did not exit.
inline int run_cli(const std::string& args, std::string* output) {
  return run_command(dlrec_bin() + " " + args, output);
}

}  // namespace dlrec::testing
