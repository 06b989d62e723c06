// run_etl gives the same bytes whatever the thread count (the parallel reader, the batched fit
// and transform, the parallel shard encoding), and reports the first error in input order.
#include <dirent.h>
#include <gtest/gtest.h>

#include "test_files.h"
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/run.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::TempDir;
using dlrec::testing::list_dir;
using dlrec::testing::read_all;

// Restores the thread count at the end of a test.
struct ThreadsGuard {
  int saved = num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};


// Criteo-layout rows; `missing` = 1 in N dense fields is empty (0: none).
std::string criteo_text(int rows, uint64_t seed, int missing = 10) {
  std::mt19937_64 rng(seed);
  std::string s;
  char buf[32];
  for (int i = 0; i < rows; ++i) {
    s += rng() % 4 == 0 ? "1" : "0";
    for (int d = 0; d < 13; ++d) {
      s += '\t';
      if (missing == 0 || rng() % missing) s += std::to_string(static_cast<int>(rng() % 500));
    }
    for (int c = 0; c < 26; ++c) {
      s += '\t';
      if (rng() % 25 == 0) continue;
      const uint64_t u = rng();
      const uint64_t k = u % 3 ? (u >> 20) % 50 : (u >> 20) % 3000;
      std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(k * 2654435761u + c));
      s += buf;
    }
    s += '\n';
  }
  return s;
}

EtlOptions options(const std::string& input, const std::string& out, const json& workflow) {
  EtlOptions o;
  o.inputs = {input};
  o.schema = io::Schema::criteo();
  o.workflow = workflow;
  o.valid_ratio = 0.15;
  o.shard_rows = 7000;  // several shards, cut inside batches
  o.block_rows = 1000;
  o.read.chunk_rows = 500;  // many chunks per batch
  o.output_dir = out;
  return o;
}

const char* kCriteo = R"({"pipeline": [
  {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                {"op": "LogOp"}, {"op": "Normalize"}]},
  {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 3}]}]})";

// Filter (rows dropped: the serial transform path), k-fold TargetEncoding (training rows
// encoded by their position), a crossed feature and a second fit pass (Normalize twice).
const char* kFeatures = R"({"pipeline": [
  {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Normalize"},
                                {"op": "Clip", "min": -1}, {"op": "Normalize"}]},
  {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]},
  {"columns": ["C1", "C2"], "ops": [{"op": "TargetEncoding", "kfold": 3, "seed": 5},
                                    {"op": "HashedCross", "num_buckets": 1000}]},
  {"columns": ["I3"], "ops": [{"op": "Filter", "min": 3}]}]})";

// Every file of every thread count equals the one-thread output.
void expect_same_bytes_for_threads(const json& workflow, int64_t memory_budget_mb) {
  TempDir tmp("threads_same");
  const std::string input = tmp.path + "/in.tsv";
  std::ofstream(input) << criteo_text(30000, 3);
  ThreadsGuard guard;
  std::vector<std::string> ref_files;
  for (int threads : {1, 3, 8}) {
    set_num_threads(threads);
    const std::string out = tmp.path + "/t" + std::to_string(threads);
    EtlOptions o = options(input, out, workflow);
    o.memory_budget_mb = memory_budget_mb;
    EtlResult r = run_etl(o);
    EXPECT_GT(r.train_shards.size(), 2u);
    EXPECT_GT(r.valid_rows, 0);
    if (threads == 1) {
      ref_files = list_dir(out);
      continue;
    }
    EXPECT_EQ(list_dir(out), ref_files) << threads << " threads";
    for (const auto& f : ref_files)
      EXPECT_EQ(read_all(tmp.path + "/t1/" + f), read_all(out + "/" + f))
          << f << " differs with " << threads << " threads";
  }
}

TEST(ThreadsTest, CriteoWorkflowSameBytesForAnyThreadCount) {
  expect_same_bytes_for_threads(json::parse(kCriteo), 0);
}

TEST(ThreadsTest, FeatureOpsFiltersAndTwoPassesSameBytesForAnyThreadCount) {
  expect_same_bytes_for_threads(json::parse(kFeatures), 0);
}

TEST(ThreadsTest, MemoryBudgetSameBytesForAnyThreadCount) {
  expect_same_bytes_for_threads(json::parse(kCriteo), 1);  // 1 MB: the counts spill
}

// The input parsed once and kept between the passes (input_cache_mb) gives the bytes of the
// input parsed again for every pass: kept whole (default size; compacted, as parsed, or auto:
// as parsed since the row count says they fit), dropped part-way through the first pass (1 MB,
// less than the parsed rows), and never kept (0); with 1 to 3 batches read ahead; with filters, feature ops and two fit passes, and with malformed
// rows skipped in the training and validation parts.
TEST(ThreadsTest, InputCacheSameBytesKeptDroppedOrOff) {
  TempDir tmp("input_cache");
  const std::string input = tmp.path + "/in.tsv";
  std::string text = criteo_text(30000, 5);
  for (int line : {25000, 9000}) {  // malformed rows: one validates, one trains (skip mode)
    size_t p = 0;
    for (int i = 1; i < line; ++i) p = text.find('\n', p) + 1;
    text.insert(p, "1\tx\t3\n");
  }
  std::ofstream(input) << text;
  ThreadsGuard guard;
  set_num_threads(3);
  struct Case {
    int64_t cache_mb;
    CacheForm form;
    int read_ahead;
    HugePages huge = HugePages::Auto;
  };
  const CacheForm kAuto = CacheForm::Auto, kCompact = CacheForm::Compact,
                  kParsed = CacheForm::Parsed;
  // Auto with huge pages off keeps the rows as parsed (they fit), with them on compacted.
  const Case cases[] = {{0, kAuto, 0},     {-1, kCompact, 0}, {1, kCompact, 0}, {1, kParsed, 0},
                        {-1, kParsed, 0},  {-1, kAuto, 0, HugePages::Off},
                        {-1, kAuto, 0, HugePages::On},    {-1, kAuto, 0},   {-1, kCompact, 1},
                        {-1, kParsed, 2},  {0, kAuto, 3}};
  for (const char* wf : {kCriteo, kFeatures}) {
    std::vector<std::string> ref_files;
    int64_t ref_skipped = -1;
    int64_t compact_bytes = 0;
    for (size_t c = 0; c < std::size(cases); ++c) {
      const Case& k = cases[c];
      const std::string name = "cache " + std::to_string(k.cache_mb) + " MB, form " +
                               std::to_string(static_cast<int>(k.form)) + ", read ahead " +
                               std::to_string(k.read_ahead) + ", huge pages " +
                               std::to_string(static_cast<int>(k.huge));
      const std::string out = tmp.path + "/c" + std::to_string(c);
      EtlOptions o = options(input, out, json::parse(wf));
      o.read.on_error = io::OnError::Skip;
      o.input_cache_mb = k.cache_mb;
      o.input_cache_form = k.form;
      o.read_ahead = k.read_ahead;
      o.input_cache_huge_pages = k.huge;
      o.overwrite = true;
      EtlResult r = run_etl(o);
      EXPECT_EQ(r.skipped_rows, 2) << name;
      if (k.cache_mb == -1) {
        EXPECT_GT(r.input_cache_bytes, int64_t{1} << 20) << "the parsed rows were not kept";
        if (k.form == kCompact && k.read_ahead == 0) compact_bytes = r.input_cache_bytes;
        // As parsed (Auto without huge pages: the row count says they fit): 8 bytes per key
        // and per offset. Auto with huge pages: compacted.
        const bool parsed = k.form == kParsed || (k.form == kAuto && k.huge == HugePages::Off);
        if (parsed) EXPECT_GT(r.input_cache_bytes, 2 * compact_bytes) << name;
        if (k.form == kAuto && k.huge == HugePages::On)
          EXPECT_EQ(r.input_cache_bytes, compact_bytes) << name;
        EXPECT_EQ(r.input_cache_compact, !parsed && (k.form != kAuto || r.input_cache_huge_pages))
            << name;
      } else {
        EXPECT_EQ(r.input_cache_bytes, 0) << name;
      }
      if (c == 0) {
        ref_files = list_dir(out);
        ref_skipped = r.skipped_rows;
        EXPECT_GT(ref_files.size(), 4u);
        continue;
      }
      EXPECT_EQ(r.skipped_rows, ref_skipped);
      EXPECT_EQ(list_dir(out), ref_files) << name;
      for (const auto& f : ref_files)
        EXPECT_EQ(read_all(tmp.path + "/c0/" + f), read_all(out + "/" + f))
            << f << " differs with " << name;
    }
  }
}

// The fit with several batches in flight (EtlOptions::fit_window) gives the bytes of one batch
// at a time (window 1), over many small batches (100-row chunks), with the kept input
// compacted by the fit's side tasks, kept as parsed, dropped part-way (1 MB) or off, with
// filters, feature ops and two fit passes.
TEST(ThreadsTest, FitWindowSameBytesAsOneBatchAtATime) {
  TempDir tmp("fit_window");
  const std::string input = tmp.path + "/in.tsv";
  std::ofstream(input) << criteo_text(20000, 6);
  ThreadsGuard guard;
  set_num_threads(4);
  struct Case {
    int64_t cache_mb;
    CacheForm form;
  };
  const Case forms[] = {{-1, CacheForm::Compact}, {-1, CacheForm::Parsed}, {1, CacheForm::Compact},
                        {0, CacheForm::Auto}};
  for (const char* wf : {kCriteo, kFeatures}) {
    for (size_t f = 0; f < std::size(forms); ++f) {
      std::vector<std::string> ref_files;
      for (int window : {1, 2, 3, 16}) {
        const std::string name = "form case " + std::to_string(f) + ", window " +
                                 std::to_string(window);
        const std::string out = tmp.path + "/w" + std::to_string(window);
        EtlOptions o = options(input, out, json::parse(wf));
        o.read.chunk_rows = 100;
        // A row count instead of a ratio: the cache starts keeping without a count of the rows,
        // so 1 MB is dropped part-way through the first pass, batches in flight.
        o.train_rows = 17000;
        o.input_cache_mb = forms[f].cache_mb;
        o.input_cache_form = forms[f].form;
        o.fit_window = window;
        o.overwrite = true;
        EtlResult r = run_etl(o);
        EXPECT_EQ(r.input_cache_bytes > 0, forms[f].cache_mb == -1) << name;
        if (window == 1) {
          ref_files = list_dir(out);
          EXPECT_GT(ref_files.size(), 4u);
          continue;
        }
        EXPECT_EQ(list_dir(out), ref_files) << name;
        for (const auto& file : ref_files)
          EXPECT_EQ(read_all(tmp.path + "/w1/" + file), read_all(out + "/" + file))
              << file << " differs with " << name;
      }
    }
  }
}

TEST(ThreadsTest, BadFitWindowIsAnError) {
  TempDir tmp("fit_window_bad");
  const std::string input = tmp.path + "/in.tsv";
  std::ofstream(input) << criteo_text(100, 6);
  for (int w : {-1, 65}) {
    EtlOptions o = options(input, tmp.path + "/out", json::parse(kCriteo));
    o.fit_window = w;
    try {
      run_etl(o);
      ADD_FAILURE() << "fit_window " << w << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fit_window must be in [0, 64]"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(file_exists(tmp.path + "/out/dataset.json"));
  }
}

std::string error_of(const EtlOptions& o) {
  try {
    run_etl(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// EtlOptions::read.parse_ahead (the reader's window of pieces) outside [0, 4096] is an error
// naming the option, before anything is written; any good value gives the default's output.
TEST(ThreadsTest, BadParseAheadIsAnError) {
  TempDir tmp("parse_ahead");
  const std::string input = tmp.path + "/in.tsv";
  std::ofstream(input) << criteo_text(100, 6);
  for (int v : {-1, -3, 4097}) {
    EtlOptions o = options(input, tmp.path + "/out", json::parse(kCriteo));
    o.read.parse_ahead = v;
    const std::string e = error_of(o);
    EXPECT_NE(e.find("read.parse_ahead must be in [0, 4096]"), std::string::npos)
        << v << ": " << e;
    EXPECT_FALSE(file_exists(tmp.path + "/out/dataset.json")) << v;
  }
  run_etl(options(input, tmp.path + "/b", json::parse(kCriteo)));
  for (int v : {1, 3, 4096}) {
    const std::string a = tmp.path + "/a" + std::to_string(v);
    EtlOptions o = options(input, a, json::parse(kCriteo));
    o.read.parse_ahead = v;
    run_etl(o);
    for (const auto& f : list_dir(tmp.path + "/b"))
      EXPECT_EQ(read_all(a + "/" + f), read_all(tmp.path + "/b/" + f)) << v << " " << f;
  }
}

// A parse error late in the input and a transform error (a dense value left missing) earlier:
// the earlier one is reported, with any thread count; either alone is reported as itself.
TEST(ThreadsTest, FirstErrorInInputOrderWinsForAnyThreadCount) {
  TempDir tmp("threads_errors");
  std::string text = criteo_text(20000, 4, /*missing=*/0);
  auto line_start = [&](int line) {  // 1-based
    size_t p = 0;
    for (int i = 1; i < line; ++i) p = text.find('\n', p) + 1;
    return p;
  };
  std::string with_parse = text;
  with_parse.insert(line_start(15000), "1\t2\t3\n");
  std::string both = with_parse;
  {  // I1 of line 4000 (after "<label>\t") left empty
    const size_t b = line_start(4000) + 2, e = both.find('\t', b);
    both.erase(b, e - b);
  }
  const std::string parse_file = tmp.path + "/parse.tsv", both_file = tmp.path + "/both.tsv";
  std::ofstream(parse_file) << with_parse;
  std::ofstream(both_file) << both;
  // No FillMissing: a missing I1 is an error of the transform pass (the fit skips NaNs).
  const json wf = json::parse(R"({"pipeline": [
    {"columns": "@dense", "ops": [{"op": "Clip", "min": 0}, {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify"}]}]})");
  ThreadsGuard guard;
  std::string parse_ref, both_ref;
  for (int threads : {1, 4, 8}) {
    set_num_threads(threads);
    EtlOptions o = options(parse_file, tmp.path + "/o" + std::to_string(threads), wf);
    o.train_rows = 10000;  // the fit stops before both bad lines; the transform meets them
    const std::string parse_msg = error_of(o);
    o.inputs = {both_file};
    const std::string both_msg = error_of(o);
    EXPECT_NE(parse_msg.find(parse_file + ":15000: expected 40 fields, got 3"), std::string::npos)
        << parse_msg;
    EXPECT_NE(both_msg.find("line 4000"), std::string::npos) << both_msg;
    EXPECT_EQ(both_msg.find("15000"), std::string::npos) << both_msg;
    if (threads == 1) {
      parse_ref = parse_msg;
      both_ref = both_msg;
    }
    EXPECT_EQ(parse_msg, parse_ref);
    EXPECT_EQ(both_msg, both_ref);
    EXPECT_FALSE(file_exists(o.output_dir + "/dataset.json"));
  }
}

}  // namespace
}  // namespace dlrec::etl
