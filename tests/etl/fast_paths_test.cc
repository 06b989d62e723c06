// The ETL speed and memory paths give the same results as the plain ones: the text parser's
// fast path, Categorify's spilled counts, appending transforms, chunk-size-independent fits,
// run_etl under a memory budget and with small chunks.
#include <dirent.h>
#include <sys/resource.h>
#include <gtest/gtest.h>

#include "test_files.h"
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/key_map.h"
#include "dlrec/io/shard.h"
#include "dlrec/etl/run.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::TempDir;
using dlrec::testing::list_dir;
using dlrec::testing::read_all;


// Criteo-layout text: label, 13 integers (some missing, some negative), 26 hex keys drawn
// from a skewed pool per column (some missing).
std::string criteo_text(int rows, uint64_t seed, int pool = 5000) {
  std::mt19937_64 rng(seed);
  std::string s;
  char buf[32];
  for (int i = 0; i < rows; ++i) {
    s += rng() % 4 == 0 ? "1" : "0";
    for (int d = 0; d < 13; ++d) {
      s += '\t';
      if (rng() % 10) s += std::to_string(static_cast<int>(rng() % 500) - 5);
    }
    for (int c = 0; c < 26; ++c) {
      s += '\t';
      if (rng() % 25 == 0) continue;
      const uint64_t u = rng();
      const uint64_t k = u % 3 ? (u >> 20) % 50 : (u >> 20) % static_cast<uint64_t>(pool);
      std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(k * 2654435761u + c));
      s += buf;
    }
    s += '\n';
  }
  return s;
}

json criteo_workflow(int64_t freq_threshold) {
  return json::parse(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}, {"op": "Normalize"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": )" +
                     std::to_string(freq_threshold) + "}]}]}");
}

// Reads every chunk of a file.
std::vector<io::RawChunk> read_chunks(const std::string& path, const io::Schema& schema,
                                      int64_t chunk_rows) {
  io::ReadOptions ro;
  ro.chunk_rows = chunk_rows;
  io::TextReader r({path}, schema, ro);
  std::vector<io::RawChunk> v;
  io::RawChunk c;
  while (r.next(c)) v.push_back(c);
  return v;
}

ChunkSource source_of(const std::vector<io::RawChunk>& chunks) {
  auto i = std::make_shared<size_t>(0);
  return [&chunks, i](io::RawChunk& out) {
    if (*i >= chunks.size()) return false;
    out = chunks[(*i)++];
    return true;
  };
}

// ---- the parser's fast path

// Lines that the fast path takes and lines it must hand to the general path decode as
// written, whichever path took them.
TEST(TextFastPathTest, ValuesMatchTheSpecification) {
  io::Schema s;
  s.columns = {{"label", io::ColumnKind::Label, false},
               {"I1", io::ColumnKind::Dense, false},
               {"I2", io::ColumnKind::Dense, false},
               {"C1", io::ColumnKind::Categorical, false},
               {"C2", io::ColumnKind::Categorical, false}};
  TempDir tmp("fast_parse");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << "1\t12\t-3\t0123abcd\tFFFFFFFF\n"      // 8-digit keys (SWAR)
                      << "0\t+7\t\tABCDEF01\t\n"                 // '+', missing
                      << "1\t1.5\t2e3\t1\t0000000000000fff\n"    // decimals, short/16-digit keys
                      << "0\t-0\t123456789012345678\t\"a1\"\t7\n"  // quoted field, 18 digits
                      << "1.0\t1234567890123456789\t0\t12345678\t9abcdef0\n";  // '1.0' label
  auto chunks = read_chunks(path, s, 1024);
  ASSERT_EQ(chunks.size(), 1u);
  const io::RawChunk& c = chunks[0];
  ASSERT_EQ(c.rows, 5);
  EXPECT_EQ(c.label, (std::vector<float>{1, 0, 1, 0, 1}));
  EXPECT_EQ(c.dense[0], 12.f);
  EXPECT_EQ(c.dense[1], -3.f);
  EXPECT_EQ(c.dense[2], 7.f);
  EXPECT_TRUE(std::isnan(c.dense[3]));
  EXPECT_EQ(c.dense[4], 1.5f);
  EXPECT_EQ(c.dense[5], 2000.f);
  EXPECT_EQ(c.dense[6], 0.f);
  EXPECT_TRUE(std::signbit(c.dense[6]));  // "-0" keeps its sign on both paths
  EXPECT_EQ(c.dense[7], static_cast<float>(123456789012345678.0));
  EXPECT_EQ(c.dense[8], static_cast<float>(1234567890123456789.0));
  EXPECT_EQ(c.cat_values[0],
            (std::vector<uint64_t>{0x0123abcd, 0xABCDEF01, 0x1, 0xa1, 0x12345678}));
  EXPECT_EQ(c.cat_values[1], (std::vector<uint64_t>{0xFFFFFFFF, 0xfff, 0x7, 0x9abcdef0}));
  EXPECT_EQ(c.cat_offsets[1], (std::vector<int64_t>{0, 1, 1, 2, 3, 4}));
}

// What the fast path rejects gets the general path's message, with file, line and column.
TEST(TextFastPathTest, BadValuesKeepTheirMessages) {
  io::Schema s = io::Schema::criteo();
  TempDir tmp("fast_parsebad");
  const std::string& dir = tmp.path;
  const std::string good = criteo_text(3, 1);
  for (const auto& [key, expect] :
       std::vector<std::pair<std::string, std::string>>{
           {"0123abcg", "column 15 (C1): '0123abcg' is not a hexadecimal category"},
           {"0123456789abcdef0", "more than 16 digits"},
           {"0123 abc", "is not a hexadecimal category"}}) {
    std::string text = criteo_text(1, 2);
    // Replace C1 of the single line (field 15) by `key`.
    size_t p = 0;
    for (int f = 0; f < 14; ++f) p = text.find('\t', p) + 1;
    size_t q = text.find('\t', p);
    text = good + text.substr(0, p) + key + text.substr(q);
    const std::string path = dir + "/bad.tsv";
    std::ofstream(path) << text;
    std::string err;
    try {
      read_chunks(path, s, 1024);
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find(path + ":4:"), std::string::npos) << err;
    EXPECT_NE(err.find(expect), std::string::npos) << err;
  }
  // A row with one field too many is a field-count error, not a value error.
  std::string text = good;
  text.insert(text.find('\n'), "\t");
  std::ofstream(dir + "/ragged.tsv") << text;
  std::string err;
  try {
    read_chunks(dir + "/ragged.tsv", s, 1024);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("ragged.tsv:1: expected 40 fields, got 41"), std::string::npos) << err;
}

// ---- Categorify under a memory budget

TEST(SpillTest, TinyBudgetSpillsAndGivesTheInMemoryVocabulary) {
  TempDir tmp("fast_spill");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << criteo_text(6000, 3);
  const io::Schema s = io::Schema::criteo();
  auto chunks = read_chunks(path, s, 1000);
  Workflow mem = Workflow::from_config(criteo_workflow(2), s);
  mem.fit(source_of(chunks));
  Workflow spill = Workflow::from_config(criteo_workflow(2), s);
  spill.set_fit_memory(8 << 10, dir);  // 4 KB of count tables: spills every few hundred keys
  spill.fit(source_of(chunks));
  const auto [runs, bytes] = spill.fit_spill_stats();
  EXPECT_GT(runs, 26);
  EXPECT_GT(bytes, 0);
  EXPECT_EQ(mem.to_json().dump(), spill.to_json().dump());
  EXPECT_EQ(mem.fit_stats().dump(), spill.fit_stats().dump());
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"in.tsv"});  // runs removed after merging
  io::Batch a, b;
  mem.transform(chunks[1], a);
  spill.transform(chunks[1], b);
  EXPECT_EQ(a.cat_indices, b.cat_indices);
  EXPECT_EQ(a.dense, b.dense);
}

// Thousands of runs merge within 40 file descriptors (8 runs open at once: three levels of group
// merges before the last one): the in-memory vocabulary, no run left behind. All runs of a
// column opened at once ran out of descriptors ("Too many open files") with 16 threads.
TEST(SpillTest, ThousandsOfRunsMergeWithFewFileDescriptors) {
  TempDir tmp("fast_spillfd");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << criteo_text(20000, 6, 100000);
  const io::Schema s = io::Schema::criteo();
  auto chunks = read_chunks(path, s, 1000);
  Workflow mem = Workflow::from_config(criteo_workflow(1), s);
  mem.fit(source_of(chunks));
  const int saved = num_threads();
  set_num_threads(1);  // one column at a time: its merge alone holds descriptors
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 40;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  Workflow spill = Workflow::from_config(criteo_workflow(1), s);
  std::string err;
  try {
    spill.set_fit_memory(4 << 10, dir);  // 2 KB of count tables: a run every ~100 keys
    spill.fit(source_of(chunks));
  } catch (const Error& e) {
    err = e.what();
  }
  ::setrlimit(RLIMIT_NOFILE, &old);
  set_num_threads(saved);
  ASSERT_EQ(err, "");
  EXPECT_GT(spill.fit_spill_stats().first, 26 * 8 * 8 * 8);
  EXPECT_EQ(mem.to_json().dump(), spill.to_json().dump());
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"in.tsv"});
}

TEST(SpillTest, RunEtlUnderBudgetEqualsInMemoryAndLeavesNoSpillFiles) {
  TempDir tmp("fast_spillrun");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << criteo_text(25000, 4, 200000);
  EtlOptions o;
  o.inputs = {path};
  o.schema = io::Schema::criteo();
  o.workflow = criteo_workflow(2);
  o.valid_ratio = 0.1;
  o.shard_rows = 15000;
  o.block_rows = 4096;
  o.output_dir = dir + "/mem";
  EtlResult r1 = run_etl(o);
  EXPECT_EQ(r1.spill_runs, 0);
  o.output_dir = dir + "/budget";
  o.memory_budget_mb = 1;  // 512 KB of count tables for ~26 x 23000 distinct keys
  EtlResult r2 = run_etl(o);
  EXPECT_GT(r2.spill_runs, 0);
  const auto files = list_dir(dir + "/mem");
  EXPECT_EQ(files, list_dir(dir + "/budget"));  // no spill file left behind
  for (const auto& f : files)
    EXPECT_EQ(read_all(dir + "/mem/" + f), read_all(dir + "/budget/" + f)) << f;
}

TEST(SpillTest, FailedRunRemovesSpillFiles) {
  TempDir tmp("fast_spillfail");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::string text = criteo_text(20000, 5, 100000);
  text += "1\tnot-a-number\n";  // fails the fit pass after many spills
  std::ofstream(path) << text;
  EtlOptions o;
  o.inputs = {path};
  o.schema = io::Schema::criteo();
  o.workflow = criteo_workflow(2);
  o.output_dir = dir + "/out";
  o.memory_budget_mb = 1;
  EXPECT_THROW(run_etl(o), Error);
  EXPECT_EQ(list_dir(dir + "/out"), std::vector<std::string>{});
}

TEST(KeyMapTest, DrainSortedKeepsCapacityAndAllKeys) {
  KeyMap<uint64_t> m;
  std::mt19937_64 rng(9);
  std::map<uint64_t, uint64_t> ref;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t k = i % 7 == 0 ? ~uint64_t{0} : rng() % 3000;
    ++m[k];
    ++ref[k];
  }
  const size_t cap = m.capacity();
  std::vector<std::pair<uint64_t, uint64_t>> got;
  m.drain_sorted([&](uint64_t k, uint64_t v) { got.emplace_back(k, v); });
  const std::vector<std::pair<uint64_t, uint64_t>> want(ref.begin(), ref.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.capacity(), cap);
  EXPECT_EQ(m.find(got[0].first), nullptr);
  ++m[5];
  EXPECT_EQ(*m.find(5), 1u);
}

TEST(KeyMapTest, HashedAccessMatchesPlainAcrossGrowth) {
  // The hash given ahead (Categorify's prefetch ring) stays valid when the table grows in
  // between, and the empty-slot marker key works through the hashed calls too.
  KeyMap<uint64_t> m, plain;
  std::mt19937_64 rng(11);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 20000; ++i) keys.push_back(i % 9 == 0 ? ~uint64_t{0} : rng() % 5000);
  std::vector<uint64_t> hashes;
  for (uint64_t k : keys) hashes.push_back(KeyMap<uint64_t>::hash(k));  // all before any insert
  for (size_t i = 0; i < keys.size(); ++i) {
    m.prefetch_hashed(hashes[i]);
    ++m.at_hashed(keys[i], hashes[i]);
    ++plain[keys[i]];
  }
  EXPECT_GT(m.capacity(), 16u);  // it grew
  EXPECT_EQ(m.size(), plain.size());
  plain.for_each([&](uint64_t k, uint64_t v) {
    const uint64_t* got = m.find_hashed(k, KeyMap<uint64_t>::hash(k));
    ASSERT_NE(got, nullptr) << k;
    EXPECT_EQ(*got, v) << k;
    EXPECT_EQ(m.find(k), got);
  });
  EXPECT_EQ(m.find_hashed(123456789, KeyMap<uint64_t>::hash(123456789)), nullptr);
}

// ---- a batch reused across chunks of other sizes

TEST(FastTransformTest, ReusedBatchEqualsFreshOneForEveryChunkSize) {
  // transform() keeps a reused batch's vectors as they are (no zero-filling per chunk): a
  // batch that held a larger chunk, then a smaller one, then a larger one again, must hold
  // exactly what a fresh batch gets, missing values included.
  TempDir tmp("fast_reuse");
  const std::string path = tmp.path + "/in.tsv";
  std::ofstream(path) << criteo_text(30000, 8);
  const io::Schema s = io::Schema::criteo();
  auto chunks = read_chunks(path, s, 7000);
  ASSERT_GE(chunks.size(), 3u);
  size_t small = 0, large = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].rows < chunks[small].rows) small = i;
    if (chunks[i].rows > chunks[large].rows) large = i;
  }
  ASSERT_LT(chunks[small].rows, chunks[large].rows);
  Workflow w = Workflow::from_config(criteo_workflow(2), s);
  w.fit(source_of(chunks));
  io::Batch reused;
  for (size_t i : {large, small, size_t{1}, small, large}) {
    w.transform(chunks[i], reused);
    io::Batch fresh;
    w.transform(chunks[i], fresh);
    EXPECT_EQ(reused.rows, fresh.rows) << i;
    EXPECT_EQ(reused.labels, fresh.labels) << i;
    EXPECT_EQ(reused.dense, fresh.dense) << i;
    EXPECT_EQ(reused.cat_offsets, fresh.cat_offsets) << i;
    EXPECT_EQ(reused.cat_indices, fresh.cat_indices) << i;
  }
}

// ---- transform append, chunk-size independence

TEST(FastTransformTest, AppendEqualsConcatenationAndFitIgnoresChunkSize) {
  TempDir tmp("fast_append");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << criteo_text(70000, 6);
  const io::Schema s = io::Schema::criteo();
  auto big = read_chunks(path, s, 1 << 16);
  auto small = read_chunks(path, s, 777);
  Workflow a = Workflow::from_config(criteo_workflow(3), s);
  a.fit(source_of(big));
  Workflow b = Workflow::from_config(criteo_workflow(3), s);
  b.fit(source_of(small));
  // Normalize merges fixed blocks of values: the same mean/std bit for bit.
  EXPECT_EQ(a.to_json().dump(), b.to_json().dump());
  io::Batch whole, appended, part;
  for (const auto& c : big) {
    a.transform(c, part);
    whole.rows ? whole.append(part) : void(whole = part);
  }
  for (const auto& c : small) a.transform(c, appended, nullptr, /*append=*/true);
  EXPECT_EQ(whole.rows, appended.rows);
  EXPECT_EQ(whole.labels, appended.labels);
  EXPECT_EQ(whole.dense, appended.dense);
  EXPECT_EQ(whole.cat_offsets, appended.cat_offsets);
  EXPECT_EQ(whole.cat_indices, appended.cat_indices);
}

}  // namespace
}  // namespace dlrec::etl

namespace dlrec::etl {
namespace {

// ---- shuffled output for ranks

// Rows of shards as sortable tuples (label, dense, ids).
std::vector<std::vector<double>> rows_of(const std::string& dir,
                                         const std::vector<std::string>& names) {
  std::vector<std::vector<double>> v;
  for (const auto& n : names) {
    io::ShardReader r(dir + "/" + n);
    io::Batch b;
    r.read(0, r.rows(), b);
    for (int64_t i = 0; i < b.rows; ++i) {
      std::vector<double> row = {b.labels[i]};
      for (int d = 0; d < b.num_dense; ++d) row.push_back(b.dense[i * b.num_dense + d]);
      for (int t = 0; t < b.num_cat(); ++t)
        for (int64_t k = b.cat_offsets[t][i]; k < b.cat_offsets[t][i + 1]; ++k)
          row.push_back(static_cast<double>(b.cat_indices[t][k]));
      v.push_back(row);
    }
  }
  return v;
}

EtlOptions shuffle_options(const std::string& dir, const std::string& input) {
  EtlOptions o;
  o.inputs = {input};
  o.schema = io::Schema::criteo();
  o.workflow = criteo_workflow(2);
  o.valid_ratio = 0.2;
  o.shard_rows = 1000;
  o.block_rows = 256;
  o.output_dir = dir;
  return o;
}

TEST(ShuffleTest, RanksGetEqualShuffledPartsOfTheSameRows) {
  TempDir tmp("fast_shuffle");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << criteo_text(9001, 8);
  EtlOptions o = shuffle_options(dir + "/plain", path);
  EtlResult plain = run_etl(o);
  o.output_dir = dir + "/s1";
  o.shuffle = true;
  o.seed = 5;
  o.ranks = 3;
  EtlResult s1 = run_etl(o);
  EXPECT_EQ(s1.train_rows, plain.train_rows);
  ASSERT_EQ(s1.rank_shards.size(), 3u);
  // 7201 training rows: 2400, 2400, 2401 (files of <= 1000 rows).
  json rk = read_json_file(o.output_dir + "/ranks.json");
  EXPECT_EQ(rk["train_rows"], json::array({2400, 2400, 2401}));
  EXPECT_EQ(rk["train_shards"][0],
            json::array({"train_r000_00000.shard", "train_r000_00001.shard", "train_r000_00002.shard"}));
  std::vector<std::vector<double>> all;
  for (int r = 0; r < 3; ++r) {
    auto part = rows_of(o.output_dir, s1.rank_shards[r]);
    EXPECT_EQ(static_cast<int64_t>(part.size()), rk["train_rows"][r].get<int64_t>());
    all.insert(all.end(), part.begin(), part.end());
  }
  auto ref = rows_of(dir + "/plain", plain.train_shards);
  EXPECT_NE(all, ref);  // moved around, within and across files
  auto first_file_ref = std::vector<std::vector<double>>(ref.begin(), ref.begin() + 1000);
  auto first_file = rows_of(o.output_dir, {s1.rank_shards[0][0]});
  std::sort(first_file.begin(), first_file.end());
  std::sort(first_file_ref.begin(), first_file_ref.end());
  EXPECT_NE(first_file, first_file_ref);  // not only within files
  std::sort(all.begin(), all.end());
  std::sort(ref.begin(), ref.end());
  EXPECT_EQ(all, ref);  // the same rows
  // Validation rows keep their order and files.
  EXPECT_EQ(read_all(dir + "/plain/valid_00000.shard"), read_all(o.output_dir + "/valid_00000.shard"));
  // The same seed gives the same bytes, whatever the thread count; another seed does not.
  const int threads = num_threads();
  set_num_threads(1);
  o.output_dir = dir + "/s2";
  run_etl(o);
  set_num_threads(threads);
  for (const auto& f : list_dir(dir + "/s1"))
    EXPECT_EQ(read_all(dir + "/s1/" + f), read_all(dir + "/s2/" + f)) << f;
  o.output_dir = dir + "/s3";
  o.seed = 6;
  run_etl(o);
  EXPECT_NE(read_all(dir + "/s1/train_r000_00000.shard"), read_all(dir + "/s3/train_r000_00000.shard"));
  // No temporary bucket is left.
  for (const auto& f : list_dir(dir + "/s1")) EXPECT_EQ(f.find(".shuffle"), std::string::npos) << f;
}

TEST(ShuffleTest, RanksWithoutShuffleSplitInOrder) {
  TempDir tmp("fast_ranks");
  const std::string& dir = tmp.path;
  const std::string path = dir + "/in.tsv";
  std::ofstream(path) << criteo_text(3000, 9);
  EtlOptions o = shuffle_options(dir + "/plain", path);
  o.valid_ratio = 0;
  EtlResult plain = run_etl(o);
  o.output_dir = dir + "/r";
  o.ranks = 2;
  EtlResult r = run_etl(o);
  auto a = rows_of(o.output_dir, r.rank_shards[0]);
  auto b = rows_of(o.output_dir, r.rank_shards[1]);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(a, rows_of(dir + "/plain", plain.train_shards));
  o.ranks = 0;
  o.output_dir = dir + "/bad";
  std::string err;
  try {
    run_etl(o);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("ranks must be in [1, 65536], got 0"), std::string::npos) << err;
}

}  // namespace
}  // namespace dlrec::etl

namespace dlrec::etl {
namespace {

// count_rows (mapped, counted in parallel parts) against a line-by-line reference.
TEST(CountRowsTest, BlankLinesHeaderAndUnterminatedLastLine) {
  TempDir tmp("fast_count");
  const std::string& dir = tmp.path;
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const int kind = static_cast<int>(rng() % 4);
      if (kind == 0) text += "\n";                     // blank
      else if (kind == 1) text += "\r\n";              // a '\r' is a byte of the line
      else text += std::string(rng() % 9 + 1, 'x') + "\n";
    }
    if (rng() % 2) text += "tail";  // no newline at the end
    for (bool header : {false, true}) {
      int64_t want = 0;
      bool first = true;
      size_t p = 0;
      while (p < text.size()) {
        size_t q = text.find('\n', p);
        if (q == std::string::npos) q = text.size();
        if (!(first && header) && q > p) ++want;
        first = false;
        p = q + 1;
      }
      const std::string path = dir + "/c.txt";
      std::ofstream(path, std::ios::binary) << text;
      io::Schema s = io::Schema::criteo();
      s.header = header;
      ASSERT_EQ(count_rows({path}, s), want) << "trial " << trial << " header " << header;
      RowCountAhead ahead({path, path}, s, 0.25);  // the file twice: two files in turn
      ASSERT_EQ(ahead.rows(), 2 * want) << "trial " << trial << " header " << header;
      EXPECT_EQ(ahead.train_before(2 * want + 1), train_rows_of(2 * want, 0.25));
    }
  }
}

// train_rows_of: rows less floor(rows * ratio), never decreasing as rows grow (what
// RowCountAhead::train_before relies on with a partial count).
TEST(CountRowsTest, TrainRowsOfNeverDecreases) {
  std::mt19937_64 rng(5);
  EXPECT_EQ(train_rows_of(10, 0.1), 9);
  EXPECT_EQ(train_rows_of(9, 0.1), 9);
  EXPECT_EQ(train_rows_of(0, 0.3), 0);
  EXPECT_EQ(train_rows_of(1000, 0), 1000);
  for (double ratio : {0.1, 0.25, 1.0 / 3, 0.5, 0.77, 0.999}) {
    for (int i = 0; i < 20000; ++i) {
      const int64_t r = static_cast<int64_t>(rng() % (int64_t{1} << (i % 2 ? 20 : 40)));
      EXPECT_LE(train_rows_of(r, ratio), train_rows_of(r + 1, ratio)) << r << " " << ratio;
    }
  }
}

// RowCountAhead on a missing file: the error names it, from rows() and train_before() alike.
TEST(CountRowsTest, CountAheadErrorNamesTheFile) {
  RowCountAhead ahead({"/nonexistent/dir/x.tsv"}, io::Schema::criteo(), 0.1);
  std::string a, b;
  try {
    ahead.rows();
  } catch (const Error& e) {
    a = e.what();
  }
  try {
    ahead.train_before(5);
  } catch (const Error& e) {
    b = e.what();
  }
  EXPECT_NE(a.find("cannot open '/nonexistent/dir/x.tsv'"), std::string::npos) << a;
  EXPECT_EQ(a, b);
}

// count_rows on a file of several parts (8 MB or more each) read in 1 MB buffers, with lines
// and blank lines ('\n' after '\n') ending right at part and buffer boundaries, at 1 and 3
// threads.
TEST(CountRowsTest, PartAndBufferBoundaries) {
  TempDir tmp("fast_count_big");
  std::mt19937 rng(11);
  std::string text;
  while (text.size() < (size_t{26} << 20)) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 3) text += "\n";  // blank
    else text += std::string(rng() % 300 + 1, 'x') + "\n";
  }
  text += "tail";
  // At the boundaries of the 3 parts (26 MB >> 23) and of the 1 MB buffers inside them: a
  // '\n' right after the boundary, ending a blank line or a line of bytes in turn.
  int turn = 0;
  for (int t = 0; t < 3; ++t) {
    const size_t from = text.size() * t / 3, to = text.size() * (t + 1) / 3;
    for (size_t b = from; b < to; b += size_t{1} << 20) {
      if (b < 2) continue;
      text[b - 2] = 'x';
      text[b - 1] = turn % 2 ? '\n' : 'x';
      text[b] = '\n';
      ++turn;
    }
  }
  const std::string path = tmp.path + "/big.txt";
  std::ofstream(path, std::ios::binary) << text;
  const int saved = num_threads();
  for (bool header : {false, true}) {
    int64_t want = 0;
    bool first = true;
    for (size_t p = 0; p < text.size();) {
      size_t q = text.find('\n', p);
      if (q == std::string::npos) q = text.size();
      if (!(first && header) && q > p) ++want;
      first = false;
      p = q + 1;
    }
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      io::Schema s = io::Schema::criteo();
      s.header = header;
      EXPECT_EQ(count_rows({path}, s), want) << "threads " << threads << " header " << header;
    }
    // Counted ahead: asked at once (before the count is done), train_before gives min(upto,
    // the training rows) for rows anywhere in the file, then the count.
    io::Schema s = io::Schema::criteo();
    s.header = header;
    RowCountAhead ahead({path}, s, 0.1);
    const int64_t train = train_rows_of(want, 0.1);
    for (int64_t upto : {int64_t{1}, want / 3, train - 1, train, train + 1, want, want + 7})
      EXPECT_EQ(ahead.train_before(upto), std::min(upto, train)) << upto << " header " << header;
    EXPECT_EQ(ahead.rows(), want);
  }
  {  // stopped while counting: the destructor returns
    RowCountAhead ahead({path, path, path}, io::Schema::criteo(), 0.1);
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace dlrec::etl
