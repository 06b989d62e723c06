// The fit split across processes (etl/fit_merge.h), in one process: the input cut into 1-7 parts
// (etl/input_parts.h), each part fitted by its own workflow, the parts' heads added in order,
// their encoders' counts in any order and through another part's workflow (as the owners of
// apps/dlrec/etl_ranks.cc add them), and the dense sums continued part after part: the fitted
// workflow and its statistics are those of one fit over every row, byte for byte. Also the plan of
// the shard files each process writes (etl/ranks_merge.h) and the workflows the merge refuses.
// (tests/dist/etl_ranks_test.cc runs the whole job through mpirun.)
#include "dlrec/etl/fit_merge.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/etl/input_parts.h"
#include "dlrec/etl/ranks_merge.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::error_of;
using dlrec::testing::TempDir;
using dlrec::testing::write_file;

// Criteo-shaped rows: dense values with three decimals (their double sums round, so the order
// of the additions shows), negative values and zeros of both signs (min/max ties), missing
// values, repeated keys with frequency ties.
std::string criteo_text(int rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s;
  char buf[48];
  for (int i = 0; i < rows; ++i) {
    s += std::to_string(rng() % 2);
    for (int d = 0; d < 13; ++d) {
      const uint64_t k = rng() % 13;
      if (k == 0) {
        s += "\t";
      } else if (k == 1) {
        s += rng() % 2 ? "\t-0" : "\t0";
      } else {
        // Large and tiny magnitudes: a double sum of them is not exact.
        std::snprintf(buf, sizeof buf, "\t%s%d.%03de%d", rng() % 5 == 0 ? "-" : "",
                      static_cast<int>(rng() % 1000), static_cast<int>(rng() % 1000),
                      static_cast<int>(rng() % 12) - 6);
        s += buf;
      }
    }
    for (int c = 0; c < 26; ++c) {
      if (rng() % 11 == 0) {
        s += "\t";
        continue;
      }
      std::snprintf(buf, sizeof buf, "\t%08x", static_cast<unsigned>(rng() % (30 + 60 * c)));
      s += buf;
    }
    s += '\n';
  }
  return s;
}

const char* kWorkflow = R"({"pipeline": [
  {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                {"op": "LogOp"}]},
  {"columns": ["I3"], "ops": [{"op": "Bucketize", "boundaries": [0.5, 2, 8]}]},
  {"columns": ["C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "C10", "C11", "C12", "C13",
               "C14", "C15", "C16", "C17", "C18", "C19", "C20"],
   "ops": [{"op": "Categorify", "freq_threshold": 2}]},
  {"columns": ["C21", "C22"], "ops": [{"op": "Categorify", "max_size": 40, "num_buckets": 5}]},
  {"columns": ["C23", "C24", "C25"], "ops": [{"op": "Categorify"}]},
  {"columns": ["C26"], "ops": [{"op": "HashBucket", "num_buckets": 100}]}]})";

Workflow make(const std::string& config) {
  return Workflow::from_config(json::parse(config), io::Schema::criteo());
}

std::vector<const io::RawChunk*> pointers(const ParsedInput& in) {
  std::vector<const io::RawChunk*> v;
  for (const auto& c : in.chunks) v.push_back(&c);
  return v;
}

TEST(FitMergeTest, PartsAddedInOrderAreTheSingleFit) {
  TempDir tmp("fit_merge");
  const std::vector<std::string> files = {write_file(tmp.path, "a.tsv", criteo_text(3000, 1)),
                                          write_file(tmp.path, "b.tsv", criteo_text(2200, 2))};
  io::ReadOptions read;
  read.chunk_rows = 100;  // chunks of different sizes in every part
  const io::Schema schema = io::Schema::criteo();

  Workflow single = make(kWorkflow);
  ASSERT_EQ(FitParts::why_not_mergeable(single), "");
  InputPart all = parse_input_part(files, schema, read, 0, 1, 4096);
  ASSERT_EQ(all.error_file, -1) << all.error_message;
  ASSERT_EQ(all.parsed.stats.rows, 5200);
  size_t next = 0;
  single.fit([&](io::RawChunk& c) {
    if (next == all.parsed.chunks.size()) return false;
    c = all.parsed.chunks[next++];
    return true;
  });
  const std::string want = single.to_json().dump(), want_stats = single.fit_stats().dump();

  for (int parts : {1, 2, 3, 7}) {
    SCOPED_TRACE("parts " + std::to_string(parts));
    std::vector<InputPart> got;
    std::vector<Workflow> fits;
    for (int p = 0; p < parts; ++p) {
      got.push_back(parse_input_part(files, schema, read, p, parts, 4096));
      fits.push_back(make(kWorkflow));
      FitParts::fit_part(fits[p], pointers(got[p].parsed));
    }
    std::vector<double> sums(FitParts::num_sums(fits[0]), 0.0);
    for (int p = 0; p < parts; ++p) FitParts::continue_sums(fits[p], pointers(got[p].parsed), sums);
    for (int p = 1; p < parts; ++p) {
      const std::string head = FitParts::save_head(fits[p]);
      FitParts::add_head(fits[0], head.data(), head.size());
    }
    // Encoder j: the parts other than 0 added, last first, into part (j % (parts - 1)) + 1's
    // counts, and that sum into part 0's.
    const int n = FitParts::num_counts(fits[0]);
    ASSERT_EQ(n, 25);  // C1..C25 (C26 is hashed: nothing to count)
    for (int j = 0; j < n && parts > 1; ++j) {
      const int owner = j % (parts - 1) + 1;
      for (int p = parts - 1; p >= 1; --p)
        if (p != owner) {
          const std::string c = FitParts::save_counts(fits[p], j);
          EXPECT_EQ(c.size(), FitParts::counts_bytes(fits[p], j));
          FitParts::add_counts(fits[owner], j, c.data(), c.size());
        }
      const std::string sum = FitParts::save_counts(fits[owner], j);
      FitParts::add_counts(fits[0], j, sum.data(), sum.size());
    }
    FitParts::finish(fits[0], sums);
    EXPECT_TRUE(fits[0].to_json().dump() == want);
    EXPECT_EQ(fits[0].fit_stats().dump(), want_stats);
  }
  // The means of stats.json come from the continued sums: adding the parts' own sums would
  // round differently on these values (checked, so that the test shows what it claims).
  std::vector<InputPart> got;
  std::vector<double> added(13, 0.0), continued(13, 0.0);
  for (int p = 0; p < 7; ++p) {
    got.push_back(parse_input_part(files, schema, read, p, 7, 4096));
    std::vector<double> own(13, 0.0);
    FitParts::continue_sums(single, pointers(got[p].parsed), own);
    for (int k = 0; k < 13; ++k) added[k] += own[k];
    FitParts::continue_sums(single, pointers(got[p].parsed), continued);
  }
  EXPECT_NE(added, continued);
}

TEST(FitMergeTest, BadPartBytesAreErrors) {
  Workflow w = make(kWorkflow);
  FitParts::fit_part(w, {});
  std::string bytes = FitParts::save_head(w);
  EXPECT_NE(error_of([&] { FitParts::add_head(w, bytes.data(), 8); }).find("cut short"),
            std::string::npos);
  std::string extra = bytes + "x";
  EXPECT_NE(error_of([&] {
              FitParts::add_head(w, extra.data(), extra.size());
            }).find("followed by 1 extra bytes"),
            std::string::npos);
  bytes[0] ^= 1;
  EXPECT_NE(error_of([&] {
              FitParts::add_head(w, bytes.data(), bytes.size());
            }).find("does not start as it must"),
            std::string::npos);
  // Counts are (key, count) pairs of 16 bytes; the error names the column.
  const std::string counts(24, '\0');
  EXPECT_NE(error_of([&] {
              FitParts::add_counts(w, 2, counts.data(), counts.size());
            }).find("the counts of column 'C3' from another process"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { FitParts::add_counts(w, 25, counts.data(), 16); }).find("encoder 25 of 25"),
      std::string::npos);
}

TEST(FitMergeTest, WorkflowsWithoutAnExactMergeAreNamed) {
  EXPECT_NE(FitParts::why_not_mergeable(make(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})"))
                .find("op 'Normalize' on dense column 'I1'"),
            std::string::npos);
  EXPECT_NE(FitParts::why_not_mergeable(make(R"({"pipeline": [
    {"columns": "@categorical", "ops": [{"op": "Categorify", "encode_type": "joint"}]}]})"))
                .find("op 'Categorify' on column 'C1' has no exact partial fit"),
            std::string::npos);
  Workflow w = make(R"({"pipeline": [
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  w.set_fit_memory(int64_t{64} << 20, "/nonexistent");
  EXPECT_NE(FitParts::why_not_mergeable(w).find("memory budget"), std::string::npos);
}

TEST(RankShardsTest, EachFileIsWrittenByTheRankHoldingMostOfItsRows) {
  // Ranks hold rows [0, 10), [10, 25), [25, 30); 20 train; 8 rows per file.
  const auto plan = plan_rank_shards({0, 10, 25, 30}, 20, 8);
  ASSERT_EQ(plan.size(), 5u);
  const struct {
    const char* name;
    int64_t begin, end;
    int owner;
  } want[] = {{"train_00000.shard", 0, 8, 0},
              {"train_00001.shard", 8, 16, 1},
              {"train_00002.shard", 16, 20, 1},
              {"valid_00000.shard", 20, 28, 1},
              {"valid_00001.shard", 28, 30, 2}};
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].name(), want[i].name) << i;
    EXPECT_EQ(plan[i].begin, want[i].begin) << i;
    EXPECT_EQ(plan[i].end, want[i].end) << i;
    EXPECT_EQ(plan[i].owner, want[i].owner) << i;
  }
  // A tie goes to the earlier rank; every row trains: no validation files.
  const auto tie = plan_rank_shards({0, 4, 8}, 8, 8);
  ASSERT_EQ(tie.size(), 1u);
  EXPECT_EQ(tie[0].owner, 0);
  EXPECT_NE(error_of([] {
              plan_rank_shards({0, 4}, 5, 8);
            }).find("5 training rows of 4"),
            std::string::npos);
}

}  // namespace
}  // namespace dlrec::etl
