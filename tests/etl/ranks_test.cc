// A trainer of rank r of N reads exactly its rows: io::load_rank_shards over the ranks.json of
// run_etl(--ranks N); the ranks' rows together are the training rows, each once.
#include <gtest/gtest.h>

#include "test_files.h"

#include "test_errors.h"
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/shard.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::TempDir;

// Rows whose I1 is the row number: every training row is told apart by its first dense value.
std::string numbered_text(int rows) {
  std::mt19937_64 rng(11);
  std::string s;
  char buf[32];
  for (int i = 0; i < rows; ++i) {
    s += std::to_string(rng() % 2) + "\t" + std::to_string(i);
    for (int d = 1; d < 13; ++d) s += "\t" + std::to_string(rng() % 100);
    for (int c = 0; c < 26; ++c) {
      std::snprintf(buf, sizeof buf, "\t%08x", static_cast<unsigned>(rng() % 40));
      s += buf;
    }
    s += '\n';
  }
  return s;
}

EtlOptions options(const std::string& input, const std::string& out) {
  EtlOptions o;
  o.inputs = {input};
  o.schema = io::Schema::criteo();
  o.workflow = json::parse(R"({"pipeline": [
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");  // I1 passes unchanged
  o.valid_ratio = 0.1;
  o.shard_rows = 400;
  o.block_rows = 128;
  o.output_dir = out;
  return o;
}

// The I1 values (row numbers) a rank's loader delivers, in order.
std::vector<int64_t> rank_rows(const std::string& dir, int rank, int ranks) {
  io::RankShards part = io::load_rank_shards(dir, rank, ranks);
  std::vector<std::string> paths;
  for (const auto& s : part.shards) paths.push_back(dir + "/" + s);
  io::ShardLoader loader(paths, 100);
  EXPECT_EQ(loader.total_rows(), part.rows);
  std::vector<int64_t> v;
  io::Batch b;
  while (loader.next(b))
    for (int64_t i = 0; i < b.rows; ++i) v.push_back(static_cast<int64_t>(b.dense[i * 13]));
  return v;
}

using dlrec::testing::error_of;

TEST(RanksTest, EachRankReadsItsRowsTogetherAllDisjoint) {
  TempDir tmp("ranks_parts");
  const std::string input = tmp.path + "/in.tsv";
  std::ofstream(input) << numbered_text(3001);
  for (bool shuffle : {false, true}) {
    EtlOptions o = options(input, tmp.path + (shuffle ? "/shuffled" : "/ordered"));
    o.ranks = 3;
    o.shuffle = shuffle;
    o.seed = 9;
    EtlResult r = run_etl(o);
    ASSERT_EQ(r.train_rows, 2701);  // 3001 - floor(300.1)
    std::vector<int64_t> all;
    std::vector<size_t> sizes;
    for (int rank = 0; rank < 3; ++rank) {
      std::vector<int64_t> v = rank_rows(o.output_dir, rank, 3);
      sizes.push_back(v.size());
      all.insert(all.end(), v.begin(), v.end());
    }
    EXPECT_EQ(sizes, (std::vector<size_t>{900, 900, 901}));  // equal parts, +-1 row
    if (!shuffle) {  // in input order, rank after rank
      for (int64_t i = 0; i < 2701; ++i) EXPECT_EQ(all[i], i);
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(2701);
    for (int64_t i = 0; i < 2701; ++i) want[i] = i;
    EXPECT_EQ(all, want) << "every training row exactly once (shuffle " << shuffle << ")";
  }
}

TEST(RanksTest, ClearErrors) {
  TempDir tmp("ranks_errors");
  const std::string input = tmp.path + "/in.tsv";
  std::ofstream(input) << numbered_text(500);
  EtlOptions o = options(input, tmp.path + "/plain");
  run_etl(o);  // no --ranks: no ranks.json
  EXPECT_EQ(error_of([&] { io::load_rank_shards(o.output_dir, 0, 2); }),
            "dataset '" + o.output_dir + "' has no ranks.json: prepare it for 2 ranks with "
            "`dlrec etl --ranks 2`");
  o.output_dir = tmp.path + "/two";
  o.ranks = 2;
  run_etl(o);
  const std::string rj = o.output_dir + "/ranks.json";
  EXPECT_EQ(error_of([&] { io::load_rank_shards(o.output_dir, 0, 4); }),
            "'" + rj + "' splits the training rows for 2 ranks, not 4; run `dlrec etl --ranks 4` "
            "again or train with 2 ranks");
  EXPECT_EQ(error_of([&] { io::load_rank_shards(o.output_dir, 2, 2); }),
            "rank 2 is out of range for 2 ranks (ranks are 0 to 1)");
  EXPECT_EQ(error_of([&] { io::load_rank_shards(o.output_dir, -1, 2); }),
            "rank -1 is out of range for 2 ranks (ranks are 0 to 1)");
  // Shards that do not hold the listed rows (a ranks.json edited by hand, or another run's).
  json j = read_json_file(rj);
  j["train_rows"][1] = j["train_rows"][1].get<int64_t>() + 5;
  write_file_atomic(rj, j.dump());
  EXPECT_NE(error_of([&] { io::load_rank_shards(o.output_dir, 1, 2); })
                .find("rank 1 should hold 230 rows, its shards hold 225"),
            std::string::npos);
  // Rank 0 still loads: its entry is intact.
  EXPECT_EQ(io::load_rank_shards(o.output_dir, 0, 2).rows, 225);
}

}  // namespace
}  // namespace dlrec::etl
