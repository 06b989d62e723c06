// dataset.json against its shards: the counts and layout the trainer relies on are checked
// (a dataset.json saying train_rows = 1 once made a run train one step without a word).
#include <gtest/gtest.h>

#include <string>

#include "dlrec/io/shard.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::io {
namespace {

using dlrec::testing::expect_error;
using dlrec::testing::TempDir;
using dlrec::testing::write_file;

ShardLayout layout(int64_t card = 20) {
  ShardLayout l;
  l.num_dense = 2;
  l.cardinalities = {card};
  l.multi_hot = {false};
  return l;
}

void write_shard(const std::string& path, int64_t rows, const ShardLayout& l) {
  Batch b;
  b.reset(2, 1);
  for (int64_t r = 0; r < rows; ++r) {
    b.labels.push_back(r % 2);
    b.dense.push_back(r);
    b.dense.push_back(-r);
    b.cat_indices[0].push_back(r % 20);
    b.cat_offsets[0].push_back(r + 1);
    ++b.rows;
  }
  ShardWriter w(path, l);
  w.write(b);
  w.close();
}

// A dataset of train shards t0 (30 rows), t1 (12 rows) and valid shard v0 (7 rows).
struct Dataset {
  TempDir dir{"dataset_info"};
  DatasetInfo info;
  Dataset() {
    write_shard(dir.path + "/t0.shard", 30, layout());
    write_shard(dir.path + "/t1.shard", 12, layout());
    write_shard(dir.path + "/v0.shard", 7, layout());
    info.layout = layout();
    info.train_shards = {"t0.shard", "t1.shard"};
    info.valid_shards = {"v0.shard"};
    info.train_rows = 42;
    info.valid_rows = 7;
  }
};

TEST(DatasetInfoVerify, ConsistentDatasetPasses) {
  Dataset d;
  d.info.verify(d.dir.path);
  d.info.save(d.dir.path);
  DatasetInfo::load(d.dir.path).verify(d.dir.path);
}

TEST(DatasetInfoVerify, RowCountsMustMatchTheShards) {
  Dataset d;
  d.info.train_rows = 1;
  expect_error([&] { d.info.verify(d.dir.path); },
               {"dataset.json", "train_rows is 1", "2 train shards hold 42 rows"});
  d.info.train_rows = 42;
  d.info.valid_rows = 70;
  expect_error([&] { d.info.verify(d.dir.path); }, {"valid_rows is 70", "hold 7 rows"});
}

TEST(DatasetInfoVerify, LayoutMissingAndRepeatedShardsAreErrors) {
  Dataset d;
  write_shard(d.dir.path + "/other.shard", 5, layout(30));
  DatasetInfo other = d.info;
  other.train_shards.push_back("other.shard");
  other.train_rows = 47;
  expect_error([&] { other.verify(d.dir.path); },
               {"shard 'other.shard' has the layout", "dataset.json says"});
  DatasetInfo twice = d.info;
  twice.valid_shards.push_back("t0.shard");
  twice.valid_rows = 37;
  expect_error([&] { twice.verify(d.dir.path); }, {"shard 't0.shard' is listed twice"});
  DatasetInfo missing = d.info;
  missing.train_shards.push_back("gone.shard");
  expect_error([&] { missing.verify(d.dir.path); }, {"gone.shard"});
}

TEST(DatasetInfoVerify, DeeplyNestedDatasetJsonIsAClearError) {
  TempDir dir("dataset_deep");
  write_file(dir.path, "dataset.json",
             R"({"layout": )" + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_error([&] { DatasetInfo::load(dir.path); }, {"dataset.json", "nesting deeper than 64"});
}

}  // namespace
}  // namespace dlrec::io
