#include "dlrec/etl/run.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include "test_errors.h"
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/shard.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::etl {
namespace {

// Scratch directories of this process, removed when the test program ends.
std::vector<std::string>& scratch_dirs() {
  static std::vector<std::string> v;
  return v;
}
struct RemoveScratch : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    for (const auto& d : scratch_dirs()) std::filesystem::remove_all(d, ec);
  }
};
const auto* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string d = std::string(::testing::TempDir()) + "dlrec_etl_" + info->name() + "_" +
                  std::to_string(::getpid());
  make_dirs(d);
  scratch_dirs().push_back(d);
  return d;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> v;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') v.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// label, I1, I2, C1 (one-hot), C2 (multi-hot, ','-separated), tab-separated, hex keys.
io::Schema tsv_schema() {
  io::Schema s;
  s.columns = {{"label", io::ColumnKind::Label, false},
               {"I1", io::ColumnKind::Dense, false},
               {"I2", io::ColumnKind::Dense, false},
               {"C1", io::ColumnKind::Categorical, false},
               {"C2", io::ColumnKind::Categorical, true}};
  return s;
}

// Row i: I1 = i (so the split is visible), I2 missing every 5th row, C1 from a small skewed
// set; rows >= `valid_from` use C1 key "ffff" (never in training) and I1 + 10000.
std::string tsv(int rows, int valid_from = 1 << 30) {
  std::string s;
  char buf[200];
  std::mt19937 rng(11);
  for (int i = 0; i < rows; ++i) {
    bool valid = i >= valid_from;
    std::string c1 = valid ? "ffff" : (rng() % 3 ? "a" : "b" + std::to_string(rng() % 4));
    std::string c2;
    for (unsigned h = rng() % 3; h > 0; --h) c2 += (c2.empty() ? "" : ",") + std::to_string(rng() % 9 + 1);
    std::string i2 = i % 5 == 0 ? "" : std::to_string(rng() % 100);
    std::snprintf(buf, sizeof buf, "%d\t%d\t%s\t%s\t%s\n", i % 2, valid ? i + 10000 : i,
                  i2.c_str(), c1.c_str(), c2.c_str());
    s += buf;
  }
  return s;
}

json tsv_config() {
  return {{"pipeline",
           json::array({{{"columns", "@dense"},
                         {"ops", {{{"op", "FillMissing"}, {"value", 0}}, {{"op", "Normalize"}}}}},
                        {{"columns", "@categorical"},
                         {"ops", {{{"op", "Categorify"}, {"freq_threshold", 1}}}}}})}};
}

EtlOptions options(const std::string& dir, const std::string& input) {
  EtlOptions o;
  o.inputs = {input};
  o.schema = tsv_schema();
  o.workflow = tsv_config();
  o.output_dir = dir + "/out";
  o.shard_rows = 300;
  o.block_rows = 64;
  return o;
}

std::string write_input(const std::string& dir, const std::string& text) {
  std::string p = dir + "/input.tsv";
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

io::Batch read_shards(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> paths;
  for (const auto& n : names) paths.push_back(dir + "/" + n);
  io::ShardLoader loader(paths, 1 << 20);
  io::Batch all, b;
  all.reset(loader.layout().num_dense, static_cast<int>(loader.layout().cardinalities.size()));
  while (loader.next(b)) all.append(b);
  return all;
}

using dlrec::testing::error_of;

TEST(RunEtlTest, TrainRowsSplitFilesAndContents) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(1000)));
  o.train_rows = 700;
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 700);
  EXPECT_EQ(r.valid_rows, 300);
  EXPECT_EQ(r.train_shards,
            (std::vector<std::string>{"train_00000.shard", "train_00001.shard", "train_00002.shard"}));
  EXPECT_EQ(r.valid_shards, (std::vector<std::string>{"valid_00000.shard"}));
  EXPECT_EQ(list_dir(o.output_dir),
            (std::vector<std::string>{"dataset.json", "stats.json", "train_00000.shard",
                                      "train_00001.shard", "train_00002.shard",
                                      "valid_00000.shard", "workflow.json"}));
  EXPECT_GT(r.output_bytes, 0);
  EXPECT_EQ(r.input_bytes, static_cast<int64_t>(file_size(o.inputs[0])));

  io::DatasetInfo info = io::DatasetInfo::load(o.output_dir);
  EXPECT_EQ(info.train_rows, 700);
  EXPECT_EQ(info.valid_rows, 300);
  EXPECT_EQ(info.train_shards, r.train_shards);
  EXPECT_EQ(info.cat_names, (std::vector<std::string>{"C1", "C2"}));
  EXPECT_EQ(info.layout.multi_hot, (std::vector<bool>{false, true}));

  // Shards hold exactly what the saved workflow makes of the input rows, in order.
  Workflow w = Workflow::load(o.output_dir + "/workflow.json");
  EXPECT_EQ(w.output_layout(), info.layout);
  io::TextReader reader(o.inputs, o.schema);
  io::RawChunk all, c;
  all.reset(2, 2);
  while (reader.next(c)) all.append(c);
  io::Batch expect;
  w.transform(all, expect);
  io::Batch train = read_shards(o.output_dir, info.train_shards);
  io::Batch valid = read_shards(o.output_dir, info.valid_shards);
  train.append(valid);
  EXPECT_EQ(train.labels, expect.labels);
  EXPECT_EQ(train.dense, expect.dense);
  EXPECT_EQ(train.cat_offsets, expect.cat_offsets);
  EXPECT_EQ(train.cat_indices, expect.cat_indices);

  json stats = read_json_file(o.output_dir + "/stats.json");
  EXPECT_EQ(stats["train_rows"], 700);
  EXPECT_EQ(stats["columns"]["rows"], 700);
  EXPECT_EQ(stats["columns"]["dense"][1]["nulls"], 140);  // every 5th of 700
  EXPECT_EQ(stats["columns"]["dense"][0]["min"], 0.0);
  EXPECT_EQ(stats["columns"]["dense"][0]["max"], 699.0);
}

// Filter drops rows after the split by input position; counts and shards stay consistent.
TEST(RunEtlTest, FilterKeepsSplitByInputPosition) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(100)));
  o.train_rows = 60;
  o.shard_rows = 7;  // several shards per chunk
  o.workflow["pipeline"].push_back(
      {{"columns", json::array({"I2"})}, {"ops", {{{"op", "Filter"}}}}});  // drops missing I2
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 48);  // 60 - every 5th
  EXPECT_EQ(r.valid_rows, 32);  // 40 - every 5th
  io::DatasetInfo info = io::DatasetInfo::load(o.output_dir);
  EXPECT_EQ(info.train_rows, 48);
  EXPECT_EQ(info.valid_rows, 32);
  json stats = read_json_file(o.output_dir + "/stats.json");
  EXPECT_EQ(stats["train_rows"], 48);
  EXPECT_EQ(stats["columns"]["rows"], 48);
  EXPECT_EQ(stats["columns"]["filtered_rows"], 12);
  // The I1 column of the kept rows: the input row index, normalized; undo with the fitted state.
  Workflow w = Workflow::load(o.output_dir + "/workflow.json");
  json norm = w.to_json()["columns"][0]["ops"][1];
  io::Batch train = read_shards(o.output_dir, info.train_shards);
  io::Batch valid = read_shards(o.output_dir, info.valid_shards);
  std::vector<int> rows;
  for (const io::Batch* b : {&train, &valid})
    for (int64_t i = 0; i < b->rows; ++i)
      rows.push_back(static_cast<int>(std::lround(
          b->dense[i * 2] * norm["std"].get<double>() + norm["mean"].get<double>())));
  std::vector<int> want;
  for (int i = 0; i < 100; ++i)
    if (i % 5) want.push_back(i);
  EXPECT_EQ(rows, want);
}

TEST(RunEtlTest, ValidRatioCountsRows) {
  std::string dir = test_dir();
  std::string text = tsv(1000);
  text.insert(text.find('\n') + 1, "\n");  // a blank line is not a row
  EtlOptions o = options(dir, write_input(dir, text));
  o.valid_ratio = 0.25;
  EXPECT_EQ(count_rows(o.inputs, o.schema), 1000);
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 750);
  EXPECT_EQ(r.valid_rows, 250);
  EXPECT_EQ(r.train_shards.size(), 3u);
  EXPECT_EQ(r.valid_shards.size(), 1u);
}

TEST(RunEtlTest, NoValidationSplit) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(600)));
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 600);
  EXPECT_EQ(r.valid_rows, 0);
  EXPECT_EQ(r.train_shards.size(), 2u);  // exactly 2 x 300
  EXPECT_TRUE(r.valid_shards.empty());
}

TEST(RunEtlTest, FitsOnTrainingRowsOnly) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(1000, 800)));
  o.train_rows = 800;
  run_etl(o);
  Workflow w = Workflow::load(o.output_dir + "/workflow.json");
  json j = w.to_json();
  // C1's vocabulary has no "ffff" (only in validation rows); its validation ids are all 1.
  json vocab = j["columns"][2]["ops"][0]["vocab"];
  EXPECT_EQ(std::count(vocab.begin(), vocab.end(), json(0xffff)), 0) << vocab.dump();
  io::DatasetInfo info = io::DatasetInfo::load(o.output_dir);
  io::Batch valid = read_shards(o.output_dir, info.valid_shards);
  EXPECT_EQ(valid.cat_indices[0], std::vector<int64_t>(200, 1));
  // I1's mean is that of 0..799, not of the shifted validation values.
  EXPECT_DOUBLE_EQ(j["columns"][0]["ops"][1]["mean"].get<double>(), 399.5);
}

TEST(RunEtlTest, FailureLeavesNoPartialFiles) {
  std::string dir = test_dir();
  std::string text = tsv(1000);
  // A malformed row late in the input (validation part): bad hex.
  size_t pos = 0;
  for (int i = 0; i < 950; ++i) pos = text.find('\n', pos) + 1;
  text.insert(pos, "1\t2\t3\tnothex!\t\n");
  EtlOptions o = options(dir, write_input(dir, text));
  o.train_rows = 500;
  std::string msg = error_of([&] { run_etl(o); });
  EXPECT_NE(msg.find("input.tsv:951"), std::string::npos) << msg;
  EXPECT_EQ(list_dir(o.output_dir), std::vector<std::string>{});

  // With on_error = skip the same input goes through.
  o.read.on_error = io::OnError::Skip;
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.skipped_rows, 1);
  EXPECT_EQ(r.train_rows + r.valid_rows, 1000);
}

TEST(RunEtlTest, NanLeftAfterPipelineFailsCleanly) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(1000)));
  o.workflow = {{"pipeline", json::array({{{"columns", "@categorical"},
                                           {"ops", {{{"op", "Categorify"}}}}}})}};
  std::string msg = error_of([&] { run_etl(o); });
  EXPECT_NE(msg.find("dense column 'I2' is missing (NaN) at line 1"), std::string::npos) << msg;
  EXPECT_EQ(list_dir(o.output_dir), std::vector<std::string>{});
}

TEST(RunEtlTest, ExistingDatasetNeedsOverwrite) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(1000)));
  run_etl(o);
  std::string msg = error_of([&] { run_etl(o); });
  EXPECT_NE(msg.find("already holds a dataset"), std::string::npos) << msg;
  o.overwrite = true;
  o.shard_rows = 2000;
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_shards.size(), 1u);
  EXPECT_EQ(list_dir(o.output_dir),
            (std::vector<std::string>{"dataset.json", "stats.json", "train_00000.shard",
                                      "workflow.json"}));
}

TEST(RunEtlTest, ConfigErrorBeforeAnyOutput) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(10)));
  o.workflow["pipeline"][1]["ops"][0]["op"] = "Categorize";
  std::string msg = error_of([&] { run_etl(o); });
  EXPECT_NE(msg.find("did you mean 'Categorify'"), std::string::npos) << msg;
  EXPECT_FALSE(file_exists(o.output_dir));
}

TEST(RunEtlTest, BadInputCacheSizeIsAnErrorBeforeAnyOutput) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(10)));
  o.input_cache_mb = -2;
  std::string msg = error_of([&] { run_etl(o); });
  EXPECT_NE(msg.find("input_cache_mb must be -1 (default size), 0 (off) or a size in MB, got -2"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(file_exists(o.output_dir));
}

TEST(RunEtlTest, BadReadAheadIsAnErrorBeforeAnyOutput) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(10)));
  for (int bad : {-1, 65}) {
    o.read_ahead = bad;
    std::string msg = error_of([&] { run_etl(o); });
    EXPECT_NE(msg.find("read_ahead must be in [0, 64] batches (0: the default), got " +
                       std::to_string(bad)),
              std::string::npos)
        << msg;
    EXPECT_FALSE(file_exists(o.output_dir));
  }
}

TEST(RunEtlTest, CacheFormNames) {
  EXPECT_EQ(parse_cache_form("auto"), CacheForm::Auto);
  EXPECT_EQ(parse_cache_form("compact"), CacheForm::Compact);
  EXPECT_EQ(parse_cache_form("parsed"), CacheForm::Parsed);
  std::string msg = error_of([] { parse_cache_form("compacted"); });
  EXPECT_NE(msg.find("input cache form must be 'auto', 'compact' or 'parsed', got 'compacted'"),
            std::string::npos)
      << msg;
}

// The kept rows' form and huge pages (EtlOptions::input_cache_form, input_cache_huge_pages):
// Auto keeps them compacted exactly when they get huge pages (the rows fit as parsed here);
// every choice writes the same bytes.
TEST(RunEtlTest, CacheHugePagesChooseTheFormAndKeepTheBytes) {
  std::string dir = test_dir();
  const std::string input = write_input(dir, tsv(700));
  auto read_file = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  struct Case {
    CacheForm form;
    HugePages huge;
    int compact, huge_pages;  // expected; -1: as Auto decides (checked below)
  };
  const Case cases[] = {{CacheForm::Auto, HugePages::Off, 0, 0},
                        {CacheForm::Auto, HugePages::On, 1, 1},
                        {CacheForm::Parsed, HugePages::On, 0, 0},
                        {CacheForm::Compact, HugePages::Off, 1, 0},
                        {CacheForm::Compact, HugePages::On, 1, 1},
                        {CacheForm::Auto, HugePages::Auto, -1, -1}};
  std::vector<std::string> ref_names;
  std::vector<std::string> ref_bytes;
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.form) * 10 + static_cast<int>(c.huge));
    EtlOptions o = options(dir, input);
    o.valid_ratio = 0.1;  // counted: the rows' size decides Auto's choices
    o.overwrite = true;
    o.input_cache_form = c.form;
    o.input_cache_huge_pages = c.huge;
    EtlResult r = run_etl(o);
    EXPECT_GT(r.input_cache_bytes, 0);
    if (c.compact >= 0) {
      EXPECT_EQ(r.input_cache_compact, c.compact == 1);
      EXPECT_EQ(r.input_cache_huge_pages, c.huge_pages == 1);
    } else {
      EXPECT_EQ(r.input_cache_compact, r.input_cache_huge_pages);
    }
    std::vector<std::string> names = list_dir(o.output_dir), bytes;
    for (const auto& n : names) bytes.push_back(read_file(o.output_dir + "/" + n));
    if (ref_names.empty()) {
      ref_names = names;
      ref_bytes = bytes;
      ASSERT_GE(names.size(), 3u);
    } else {
      EXPECT_EQ(names, ref_names);
      EXPECT_TRUE(bytes == ref_bytes);
    }
  }
}

// Counting the rows ahead (beside the fit) writes the same bytes as counting them first:
// validation ratios with the split inside a chunk, 1 and 3 threads, malformed rows skipped,
// blank lines, two input files, and no input cache (then the count comes first anyway).
TEST(RunEtlTest, CountAheadWritesTheSameBytes) {
  std::string dir = test_dir();
  std::string text = tsv(1500);
  // Blank lines spread through the text. (Malformed rows skipped with OnError::Skip are not
  // counted ahead: that mode parses to count, tests/etl/counts_test.cc.)
  std::string messy;
  int line = 0;
  for (size_t p = 0; p < text.size();) {
    const size_t q = text.find('\n', p);
    messy += text.substr(p, q + 1 - p);
    if (++line % 97 == 0) messy += "\n";
    p = q + 1;
  }
  const std::string a = dir + "/a.tsv", b = dir + "/b.tsv";
  const size_t cut = messy.find('\n', messy.size() / 3) + 1;
  std::ofstream(a, std::ios::binary) << messy.substr(0, cut);
  std::ofstream(b, std::ios::binary) << messy.substr(cut);
  auto read_file = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  const int saved = num_threads();
  for (int threads : {1, 3}) {
    for (double ratio : {0.1, 0.37}) {
      for (int64_t cache_mb : {int64_t{-1}, int64_t{0}}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, ratio " + std::to_string(ratio) +
                     ", cache " + std::to_string(cache_mb));
        set_num_threads(threads);
        std::vector<std::string> names[2], bytes[2];
        for (int ahead : {0, 1}) {
          EtlOptions o = options(dir, a);
          o.inputs = {a, b};
          o.valid_ratio = ratio;
          o.read.chunk_rows = 64;  // many chunks: the split falls inside one
          o.input_cache_mb = cache_mb;
          o.count_ahead_min_bytes = ahead ? 0 : -1;
          o.overwrite = true;
          const EtlResult r = run_etl(o);
          EXPECT_EQ(r.count_ahead, ahead == 1 && cache_mb != 0);
          EXPECT_GT(r.valid_rows, 0);
          names[ahead] = list_dir(o.output_dir);
          for (const auto& n : names[ahead]) bytes[ahead].push_back(read_file(o.output_dir + "/" + n));
        }
        EXPECT_EQ(names[0], names[1]);
        EXPECT_TRUE(bytes[0] == bytes[1]);
      }
    }
  }
  set_num_threads(saved);
}

// An input with no rows, counted ahead: the same error as counted first, nothing written.
TEST(RunEtlTest, CountAheadOfNoRowsIsAnError) {
  std::string dir = test_dir();
  const std::string input = write_input(dir, "\n\n");
  for (int ahead : {0, 1}) {
    EtlOptions o = options(dir, input);
    o.valid_ratio = 0.1;
    o.count_ahead_min_bytes = ahead ? 0 : -1;
    const std::string err = error_of([&] { run_etl(o); });
    EXPECT_NE(err.find("the input holds no rows"), std::string::npos) << err;
    EXPECT_TRUE(list_dir(o.output_dir).empty()) << ahead;
  }
}

TEST(RunEtlTest, TrainRowsBeyondInputIsAnError) {
  std::string dir = test_dir();
  EtlOptions o = options(dir, write_input(dir, tsv(100)));
  o.train_rows = 500;
  std::string msg = error_of([&] { run_etl(o); });
  EXPECT_NE(msg.find("only 100 good rows"), std::string::npos) << msg;
  EXPECT_EQ(list_dir(o.output_dir), std::vector<std::string>{});
}

json criteo_config() {
  return {{"pipeline",
           json::array({{{"columns", "@dense"},
                         {"ops", {{{"op", "FillMissing"}, {"value", 0}},
                                  {{"op", "Clip"}, {"min", 0}},
                                  {{"op", "LogOp"}}}}},
                        {{"columns", "@categorical"},
                         {"ops", {{{"op", "Categorify"}, {"freq_threshold", 2}}}}}})}};
}

TEST(RunEtlTest, RealCriteoSample) {
  const std::string input = DLREC_SOURCE_DIR "/../shared/data/criteo/day_0.part.tsv";
  if (!file_exists(input)) GTEST_SKIP() << "no " << input;
  std::string dir = test_dir();
  EtlOptions o;
  o.inputs = {input};
  o.schema = io::Schema::criteo();
  o.workflow = criteo_config();
  o.output_dir = dir + "/out";
  o.valid_ratio = 0.1;
  o.shard_rows = 4000;
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 9000);
  EXPECT_EQ(r.valid_rows, 1000);
  EXPECT_EQ(r.train_shards.size(), 3u);
  io::DatasetInfo info = io::DatasetInfo::load(o.output_dir);
  ASSERT_EQ(info.layout.cardinalities.size(), 26u);
  EXPECT_EQ(info.layout.num_dense, 13);
  for (int64_t c : info.layout.cardinalities) {
    EXPECT_GE(c, 3);
    EXPECT_LE(c, 9000 + 2);
  }
  io::Batch train = read_shards(o.output_dir, info.train_shards);
  double pos = 0;
  for (float l : train.labels) pos += l;
  EXPECT_GT(pos, 0);
  EXPECT_LT(pos / train.rows, 0.1);
  for (float v : train.dense) ASSERT_TRUE(std::isfinite(v) && v >= 0);
  json stats = read_json_file(o.output_dir + "/stats.json");
  EXPECT_EQ(stats["columns"]["categorical"].size(), 26u);
}

// Throughput of fit + transform + shard writing on generated Criteo-like rows. Run with
// --gtest_also_run_disabled_tests --gtest_filter='*Throughput*' (DLREC_ETL_BENCH_ROWS rows).
TEST(RunEtlTest, DISABLED_Throughput) {
  std::string dir = test_dir();
  const char* env = std::getenv("DLREC_ETL_BENCH_ROWS");
  const int rows = env ? std::atoi(env) : 1000000;
  std::string path = dir + "/bench.tsv";
  {
    std::ofstream out(path, std::ios::binary);
    std::mt19937_64 rng(1);
    std::string line;
    char buf[32];
    for (int i = 0; i < rows; ++i) {
      line = std::to_string(rng() % 4 == 0);
      for (int d = 0; d < 13; ++d) {
        line += '\t';
        if (rng() % 10) line += std::to_string(static_cast<int>(rng() % 1000) - 3);
      }
      for (int c = 0; c < 26; ++c) {
        line += '\t';
        if (rng() % 30 == 0) continue;
        // Power-law-ish keys: a few hot values, a long tail.
        uint64_t u = rng();
        uint64_t k = (u % 4 == 0) ? (u >> 8) % 1000000 : (u >> 8) % 100;
        std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(k * 2654435761u + c));
        line += buf;
      }
      line += '\n';
      out << line;
    }
  }
  EtlOptions o;
  o.inputs = {path};
  o.schema = io::Schema::criteo();
  o.workflow = criteo_config();
  o.output_dir = dir + "/out";
  o.valid_ratio = 0.1;
  EtlResult r = run_etl(o);
  const double mb = r.input_bytes / 1e6;
  std::printf("rows %lld, input %.1f MB, threads %d\n", static_cast<long long>(rows), mb,
              num_threads());
  std::printf("count %.2fs, fit %.2fs (%.1f MB/s), transform+write %.2fs (%.1f MB/s), total "
              "%.2fs (%.1f MB/s), output %.1f MB\n",
              r.count_seconds, r.fit_seconds, mb * 0.9 / r.fit_seconds, r.transform_seconds,
              mb / r.transform_seconds, r.total_seconds, mb / r.total_seconds,
              r.output_bytes / 1e6);
}

}  // namespace
}  // namespace dlrec::etl
