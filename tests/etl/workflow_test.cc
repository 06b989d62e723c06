#include "dlrec/etl/workflow.h"

#include <gtest/gtest.h>

#include "test_errors.h"
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/key_map.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"

namespace dlrec::etl {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// label, I1, I2, C1 (one-hot), C2 (multi-hot)
io::Schema small_schema() {
  io::Schema s;
  s.columns = {{"label", io::ColumnKind::Label, false},
               {"I1", io::ColumnKind::Dense, false},
               {"I2", io::ColumnKind::Dense, false},
               {"C1", io::ColumnKind::Categorical, false},
               {"C2", io::ColumnKind::Categorical, true}};
  return s;
}

// Builds a chunk row by row.
struct ChunkBuilder {
  io::RawChunk c;
  ChunkBuilder(int nd, int nc) { c.reset(nd, nc); }
  ChunkBuilder& row(float label, std::vector<float> dense,
                    std::vector<std::vector<uint64_t>> cats) {
    c.label.push_back(label);
    c.dense.insert(c.dense.end(), dense.begin(), dense.end());
    for (int k = 0; k < c.num_cat; ++k) {
      c.cat_values[k].insert(c.cat_values[k].end(), cats[k].begin(), cats[k].end());
      c.cat_offsets[k].push_back(static_cast<int64_t>(c.cat_values[k].size()));
    }
    ++c.rows;
    return *this;
  }
};

// A source that yields `chunks` once.
ChunkSource source_of(const std::vector<io::RawChunk>& chunks) {
  auto i = std::make_shared<size_t>(0);
  return [&chunks, i](io::RawChunk& out) {
    if (*i >= chunks.size()) return false;
    out = chunks[(*i)++];
    return true;
  };
}

using dlrec::testing::error_of;

json cat_step(json op = {{"op", "Categorify"}}) {
  return {{"columns", "@categorical"}, {"ops", json::array({op})}};
}

json config_with(json dense_ops, json cat_op = {{"op", "Categorify"}}) {
  return {{"pipeline", json::array({{{"columns", "@dense"}, {"ops", dense_ops}}, cat_step(cat_op)})}};
}

std::vector<float> dense_col(const io::Batch& b, int col) {
  std::vector<float> v;
  for (int64_t r = 0; r < b.rows; ++r) v.push_back(b.dense[r * b.num_dense + col]);
  return v;
}

// ---- dense ops

TEST(DenseOpsTest, FillMissingClipLog) {
  auto w = Workflow::from_config(
      config_with({{{"op", "FillMissing"}, {"value", 2}},
                   {{"op", "Clip"}, {"min", 0}, {"max", 5}},
                   {{"op", "LogOp"}}}),
      small_schema());
  ChunkBuilder b(2, 2);
  for (float x : {kNaN, -3.0f, 0.0f, 1.0f, 9.0f}) b.row(1, {x, x}, {{7}, {7}});
  std::vector<io::RawChunk> chunks = {b.c};
  w.fit(source_of(chunks));
  io::Batch out;
  w.transform(b.c, out);
  std::vector<float> want = {std::log1p(2.0f), 0.0f, 0.0f, std::log1p(1.0f), std::log1p(5.0f)};
  EXPECT_EQ(dense_col(out, 0), want);
  EXPECT_EQ(dense_col(out, 1), want);
  EXPECT_EQ(out.labels, std::vector<float>(5, 1.0f));
}

TEST(DenseOpsTest, ClipOneSidedAndValidation) {
  auto w = Workflow::from_config(
      {{"pipeline", json::array({{{"columns", json::array({"I1"})},
                                  {"ops", json::array({{{"op", "Clip"}, {"max", 1.5}}})}},
                                 {{"columns", json::array({"I2"})},
                                  {"ops", json::array({{{"op", "Clip"}, {"min", -1}}})}},
                                 cat_step()})}},
      small_schema());
  ChunkBuilder b(2, 2);
  b.row(0, {-7, -7}, {{1}, {1}}).row(0, {7, 7}, {{1}, {1}});
  std::vector<io::RawChunk> chunks = {b.c};
  w.fit(source_of(chunks));
  io::Batch out;
  w.transform(b.c, out);
  EXPECT_EQ(dense_col(out, 0), (std::vector<float>{-7, 1.5}));
  EXPECT_EQ(dense_col(out, 1), (std::vector<float>{-1, 7}));

  std::string msg = error_of([] {
    Workflow::from_config(config_with({{{"op", "Clip"}}}), small_schema());
  });
  EXPECT_NE(msg.find("Clip needs \"min\" and/or \"max\""), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config(config_with({{{"op", "Clip"}, {"min", 3}, {"max", 1}}}), small_schema());
  });
  EXPECT_NE(msg.find("greater than max"), std::string::npos) << msg;
}

TEST(DenseOpsTest, NormalizeHandComputed) {
  // Normalize first (NaN ignored by fit, kept by transform), then FillMissing.
  auto w = Workflow::from_config(
      config_with({{{"op", "Normalize"}}, {{"op", "FillMissing"}, {"value", 0}}}), small_schema());
  ChunkBuilder a(2, 2), b(2, 2);
  a.row(0, {1, 10}, {{1}, {1}}).row(0, {2, 10}, {{1}, {1}});
  b.row(0, {3, 10}, {{1}, {1}}).row(0, {4, 10}, {{1}, {1}}).row(0, {kNaN, kNaN}, {{1}, {1}});
  std::vector<io::RawChunk> chunks = {a.c, b.c};
  w.fit(source_of(chunks));
  io::Batch out;
  w.transform(a.c, out);
  const double sd = std::sqrt(1.25);  // population std of 1..4
  EXPECT_FLOAT_EQ(out.dense[0], static_cast<float>((1 - 2.5) / sd));
  EXPECT_FLOAT_EQ(out.dense[2], static_cast<float>((2 - 2.5) / sd));
  EXPECT_EQ(out.dense[1], 0.0f);  // constant column: std 1, mean 10
  w.transform(b.c, out);
  EXPECT_FLOAT_EQ(out.dense[2], static_cast<float>((4 - 2.5) / sd));
  EXPECT_EQ(out.dense[4], 0.0f);  // missing -> FillMissing after Normalize
  json j = w.to_json();
  json norm = j["columns"][0]["ops"][0];
  EXPECT_EQ(norm["op"], "Normalize");
  EXPECT_DOUBLE_EQ(norm["mean"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(norm["std"].get<double>(), sd);
  EXPECT_EQ(norm["count"].get<int64_t>(), 4);
}

TEST(DenseOpsTest, NormalizeStreamingEqualsTwoPass) {
  // Large offset, small spread: the naive sum-of-squares formula would lose most digits.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  io::Schema s;
  s.columns = {{"x", io::ColumnKind::Dense, false}};
  std::vector<io::RawChunk> chunks;
  std::vector<float> all;
  size_t sizes[] = {1, 1000, 37, 4096, 12345, 2, 30000};
  for (size_t n : sizes) {
    ChunkBuilder b(1, 0);
    for (size_t i = 0; i < n; ++i) {
      float v = 100000.0f + noise(rng);
      all.push_back(v);
      b.row(0, {v}, {});
    }
    chunks.push_back(b.c);
  }
  long double mean = 0;
  for (float v : all) mean += v;
  mean /= all.size();
  long double m2 = 0;
  for (float v : all) m2 += (v - mean) * (v - mean);
  const double sd = static_cast<double>(std::sqrt(m2 / all.size()));

  auto w = Workflow::from_config(
      {{"pipeline", json::array({{{"columns", "@dense"}, {"ops", {{{"op", "Normalize"}}}}}})}}, s);
  w.fit(source_of(chunks));
  json op = w.to_json()["columns"][0]["ops"][0];
  EXPECT_NEAR(op["mean"].get<double>(), static_cast<double>(mean), 1e-9 * 100000);
  EXPECT_NEAR(op["std"].get<double>(), sd, 1e-9 * sd * 1000);
  EXPECT_NEAR(op["std"].get<double>() / sd, 1.0, 1e-9);
}

TEST(DenseOpsTest, ChainedFittedOpsNeedTwoPasses) {
  io::Schema s;
  s.columns = {{"x", io::ColumnKind::Dense, false}};
  json cfg = {{"pipeline", json::array({{{"columns", "@dense"},
                                         {"ops", {{{"op", "Normalize"}},
                                                  {{"op", "Clip"}, {"min", 0}},
                                                  {{"op", "Normalize"}}}}}})}};
  auto w = Workflow::from_config(cfg, s);
  EXPECT_EQ(w.num_fit_passes(), 2);
  ChunkBuilder b(1, 0);
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f, 5.0f}) b.row(0, {v}, {});
  std::vector<io::RawChunk> chunks = {b.c};
  EXPECT_NE(error_of([&] { w.fit(source_of(chunks)); }).find("fit_multipass"), std::string::npos);
  int opened = 0;
  w.fit_multipass([&] {
    ++opened;
    return source_of(chunks);
  });
  EXPECT_EQ(opened, 2);
  // After Normalize + Clip(min 0): {0, 0, 0, 0.707, 1.414}; the second Normalize is fitted on
  // those, so its output has mean 0 and std 1.
  io::Batch out;
  w.transform(b.c, out);
  double m = 0, q = 0;
  for (float v : out.dense) m += v;
  m /= 5;
  for (float v : out.dense) q += (v - m) * (v - m);
  EXPECT_NEAR(m, 0.0, 1e-6);
  EXPECT_NEAR(std::sqrt(q / 5), 1.0, 1e-6);
}

// ---- Categorify

// Keys: 10 x5, 20 x3, 30 x3, 40 x1; two rows missing.
std::vector<io::RawChunk> categorify_chunks() {
  std::vector<uint64_t> keys = {10, 20, 10, 30, 40, 30, 10, 20, 10, 30, 20, 10};
  ChunkBuilder a(2, 2), b(2, 2);
  for (size_t i = 0; i < keys.size(); ++i)
    (i < 5 ? a : b).row(0, {0, 0}, {{keys[i]}, {keys[i]}});
  a.row(0, {0, 0}, {{}, {}});
  b.row(0, {0, 0}, {{}, {}});
  return {a.c, b.c};
}

Workflow categorify(json op) {
  auto w = Workflow::from_config(config_with(json::array(), op), small_schema());
  auto chunks = categorify_chunks();
  w.fit(source_of(chunks));
  return w;
}

std::vector<int64_t> encode_c1(const Workflow& w, const std::vector<uint64_t>& keys) {
  ChunkBuilder b(2, 2);
  for (uint64_t k : keys) b.row(0, {0, 0}, {{k}, {k}});
  b.row(0, {0, 0}, {{}, {}});  // missing -> 0
  io::Batch out;
  w.transform(b.c, out);
  return out.cat_indices[0];
}

TEST(CategorifyTest, FrequencyOrderTiesByKeyReservedIds) {
  auto w = categorify({{"op", "Categorify"}});
  // 10 (5) -> 2, then 20 and 30 (3 each, tie by key) -> 3, 4, then 40 (1) -> 5.
  EXPECT_EQ(encode_c1(w, {10, 20, 30, 40, 99}), (std::vector<int64_t>{2, 3, 4, 5, 1, 0}));
  EXPECT_EQ(w.output_layout().cardinalities, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(w.to_json()["columns"][2]["ops"][0]["vocab"], json({10, 20, 30, 40}));
}

TEST(CategorifyTest, FreqThreshold) {
  auto w = categorify({{"op", "Categorify"}, {"freq_threshold", 3}});
  EXPECT_EQ(encode_c1(w, {10, 20, 30, 40, 99}), (std::vector<int64_t>{2, 3, 4, 1, 1, 0}));
  EXPECT_EQ(w.output_layout().cardinalities[0], 5);
  w = categorify({{"op", "Categorify"}, {"freq_threshold", 4}});
  EXPECT_EQ(encode_c1(w, {10, 20, 30, 40}), (std::vector<int64_t>{2, 1, 1, 1, 0}));
  w = categorify({{"op", "Categorify"}, {"freq_threshold", 100}});
  EXPECT_EQ(encode_c1(w, {10, 20}), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(w.output_layout().cardinalities[0], 2);
}

TEST(CategorifyTest, MaxSizeKeepsMostFrequent) {
  auto w = categorify({{"op", "Categorify"}, {"max_size", 2}});
  EXPECT_EQ(encode_c1(w, {10, 20, 30, 40}), (std::vector<int64_t>{2, 3, 1, 1, 0}));
  EXPECT_EQ(w.output_layout().cardinalities[0], 4);
}

TEST(CategorifyTest, MultiHotElementWiseMissingIsSingleZero) {
  auto w = categorify({{"op", "Categorify"}});
  ChunkBuilder b(2, 2);
  b.row(0, {0, 0}, {{10}, {10, 20}}).row(0, {0, 0}, {{}, {}}).row(0, {0, 0}, {{40}, {99, 10, 30}});
  io::Batch out;
  w.transform(b.c, out);
  EXPECT_EQ(out.cat_offsets[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(out.cat_indices[0], (std::vector<int64_t>{2, 0, 5}));
  EXPECT_EQ(out.cat_offsets[1], (std::vector<int64_t>{0, 2, 3, 6}));
  EXPECT_EQ(out.cat_indices[1], (std::vector<int64_t>{2, 3, 0, 1, 2, 4}));
  EXPECT_EQ(w.output_layout().multi_hot, (std::vector<bool>{false, true}));
}

TEST(CategorifyTest, OneHotWithSeveralValuesIsAnError) {
  auto w = categorify({{"op", "Categorify"}});
  ChunkBuilder b(2, 2);
  b.row(0, {0, 0}, {{10}, {10}}).row(0, {0, 0}, {{10, 20}, {10}});
  b.c.first_line = 100;
  io::Batch out;
  std::string msg = error_of([&] { w.transform(b.c, out); });
  EXPECT_NE(msg.find("'C1' is one-hot but line 101 holds 2 values"), std::string::npos) << msg;
}

TEST(CategorifyTest, LargeParallelTransformMatchesSerialLookup) {
  // Many rows (several transform blocks) with missing values sprinkled in.
  std::mt19937_64 rng(1);
  ChunkBuilder b(2, 2);
  std::vector<uint64_t> keys;
  for (int i = 0; i < 50000; ++i) {
    uint64_t k = rng() % 1000;
    if (k == 7) k = ~uint64_t{0};  // the hash map's marker key is a normal key
    bool missing = rng() % 10 == 0;
    b.row(0, {0, 0}, {missing ? std::vector<uint64_t>{} : std::vector<uint64_t>{k},
                      missing ? std::vector<uint64_t>{} : std::vector<uint64_t>{k, k + 1}});
    keys.push_back(missing ? 12345678 : k);
  }
  auto w = Workflow::from_config(config_with(json::array()), small_schema());
  std::vector<io::RawChunk> chunks = {b.c};
  w.fit(source_of(chunks));
  json vocab = w.to_json()["columns"][2]["ops"][0]["vocab"];
  KeyMap<int64_t> ref;
  for (size_t i = 0; i < vocab.size(); ++i) ref[vocab[i].get<uint64_t>()] = 2 + i;
  io::Batch out;
  w.transform(b.c, out);
  ASSERT_EQ(out.cat_indices[0].size(), keys.size());
  for (size_t r = 0; r < keys.size(); ++r) {
    int64_t want = keys[r] == 12345678 ? 0 : *ref.find(keys[r]);
    ASSERT_EQ(out.cat_indices[0][r], want) << r;
  }
}

// ---- config errors

TEST(WorkflowConfigTest, UnknownOpNamesNearest) {
  std::string msg = error_of([] {
    Workflow::from_config(config_with(json::array(), {{"op", "Categorfy"}}), small_schema());
  });
  EXPECT_NE(msg.find("unknown op 'Categorfy'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'Categorify'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pipeline[1].ops[0]"), std::string::npos) << msg;
}

TEST(WorkflowConfigTest, UnknownColumnNamesNearest) {
  json cfg = {{"pipeline", json::array({{{"columns", json::array({"I3"})},
                                         {"ops", {{{"op", "LogOp"}}}}},
                                        cat_step()})}};
  std::string msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("unknown column 'I3'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'I1'"), std::string::npos) << msg;
  cfg["pipeline"][0]["columns"] = "@dens";
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("did you mean '@dense'"), std::string::npos) << msg;
  cfg["pipeline"][0]["columns"] = json::array({"label"});
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("'label' is a label column"), std::string::npos) << msg;
}

TEST(WorkflowConfigTest, UnknownKeysNameNearest) {
  std::string msg = error_of([] {
    Workflow::from_config(config_with(json::array(), {{"op", "Categorify"}, {"freq_treshold", 3}}),
                          small_schema());
  });
  EXPECT_NE(msg.find("unknown config key 'pipeline[1].ops[0].freq_treshold'"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("did you mean 'freq_threshold'"), std::string::npos) << msg;

  json cfg = config_with(json::array());
  cfg["pipeline"][0]["colums"] = cfg["pipeline"][0]["columns"];
  cfg["pipeline"][0].erase("columns");
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("columns"), std::string::npos) << msg;

  cfg = config_with(json::array());
  cfg["pipelines"] = json::array();
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("unknown config key 'pipelines' (did you mean 'pipeline'?)"),
            std::string::npos)
      << msg;

  // Fitted state is not a user setting.
  msg = error_of([] {
    Workflow::from_config(config_with({{{"op", "Normalize"}, {"mean", 3}}}), small_schema());
  });
  EXPECT_NE(msg.find("unknown config key 'pipeline[0].ops[0].mean'"), std::string::npos) << msg;
}

TEST(WorkflowConfigTest, WrongColumnTypeAndMissingEncoder) {
  json cfg = {{"pipeline", json::array({{{"columns", "@categorical"},
                                         {"ops", {{{"op", "Normalize"}}}}}})}};
  std::string msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("applies to dense columns, but 'C1' is categorical"), std::string::npos)
      << msg;
  cfg = {{"pipeline", json::array({{{"columns", "@dense"}, {"ops", {{{"op", "Categorify"}}}}}})}};
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("applies to categorical columns, but 'I1' is dense"), std::string::npos)
      << msg;
  cfg = {{"pipeline", json::array({{{"columns", json::array({"C1"})},
                                    {"ops", {{{"op", "Categorify"}}}}}})}};
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("categorical column 'C2' has no encoder"), std::string::npos) << msg;
  cfg = {{"pipeline", json::array({cat_step(), cat_step()})}};
  msg = error_of([&] { Workflow::from_config(cfg, small_schema()); });
  EXPECT_NE(msg.find("follows its encoder"), std::string::npos) << msg;
}

TEST(WorkflowConfigTest, NonFiniteAfterPipelineNamesColumn) {
  auto w = Workflow::from_config(config_with(json::array()), small_schema());  // pass-through
  ChunkBuilder b(2, 2);
  b.row(0, {1, 2}, {{1}, {1}}).row(0, {3, kNaN}, {{1}, {1}});
  b.c.first_line = 10;
  std::vector<io::RawChunk> chunks = {b.c};
  w.fit(source_of(chunks));
  io::Batch out;
  std::string msg = error_of([&] { w.transform(b.c, out); });
  EXPECT_NE(msg.find("dense column 'I2' is missing (NaN) at line 11"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FillMissing"), std::string::npos) << msg;

  auto w2 = Workflow::from_config(config_with({{{"op", "LogOp"}}}), small_schema());
  ChunkBuilder c(2, 2);
  c.row(0, {-1, 0}, {{1}, {1}});
  chunks = {c.c};
  w2.fit(source_of(chunks));
  msg = error_of([&] { w2.transform(c.c, out); });
  EXPECT_NE(msg.find("dense column 'I1' is -inf"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Clip"), std::string::npos) << msg;
}

TEST(WorkflowConfigTest, TransformBeforeFitIsAnError) {
  auto w = Workflow::from_config(config_with(json::array()), small_schema());
  EXPECT_FALSE(w.fitted());
  ChunkBuilder b(2, 2);
  b.row(0, {1, 2}, {{1}, {1}});
  io::Batch out;
  EXPECT_NE(error_of([&] { w.transform(b.c, out); }).find("not fitted"), std::string::npos);
}

// ---- fitted state

Workflow fitted_full_workflow(std::vector<io::RawChunk>& chunks) {
  std::mt19937_64 rng(5);
  for (int k = 0; k < 3; ++k) {
    ChunkBuilder b(2, 2);
    for (int i = 0; i < 3000; ++i) {
      float x = rng() % 7 == 0 ? kNaN : static_cast<float>(rng() % 1000) / 7.0f - 3.0f;
      std::vector<uint64_t> c1, c2;
      if (rng() % 9) c1.push_back(rng() % 50 + (uint64_t{1} << 63));
      for (uint64_t h = rng() % 4; h > 0; --h) c2.push_back(rng() % 300);
      b.row(static_cast<float>(rng() % 2), {x, x * 3}, {c1, c2});
    }
    chunks.push_back(b.c);
  }
  json cfg = {{"pipeline", json::array({{{"columns", json::array({"I1"})},
                                         {"ops", {{{"op", "FillMissing"}, {"value", 0.1}},
                                                  {{"op", "Clip"}, {"min", 0}},
                                                  {{"op", "LogOp"}},
                                                  {{"op", "Normalize"}}}}},
                                        {{"columns", json::array({"I2"})},
                                         {"ops", {{{"op", "Normalize"}},
                                                  {{"op", "FillMissing"}, {"value", -1}}}}},
                                        cat_step({{"op", "Categorify"},
                                                  {"freq_threshold", 20},
                                                  {"max_size", 200}})})}};
  auto w = Workflow::from_config(cfg, small_schema());
  w.fit(source_of(chunks));
  return w;
}

void expect_bit_identical(const io::Batch& a, const io::Batch& b) {
  ASSERT_EQ(a.rows, b.rows);
  ASSERT_EQ(a.dense.size(), b.dense.size());
  EXPECT_EQ(std::memcmp(a.dense.data(), b.dense.data(), a.dense.size() * 4), 0);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.cat_offsets, b.cat_offsets);
  EXPECT_EQ(a.cat_indices, b.cat_indices);
}

TEST(WorkflowStateTest, JsonRoundTripTransformsBitIdentically) {
  std::vector<io::RawChunk> chunks;
  Workflow w = fitted_full_workflow(chunks);
  json j = w.to_json();
  Workflow back = Workflow::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.output_layout(), w.output_layout());
  // Through text as well (doubles must survive printing).
  Workflow text = Workflow::from_json(json::parse(j.dump()));
  for (const auto& c : chunks) {
    io::Batch a, b, t;
    w.transform(c, a);
    back.transform(c, b);
    text.transform(c, t);
    expect_bit_identical(a, b);
    expect_bit_identical(a, t);
  }
}

TEST(WorkflowStateTest, SaveLoad) {
  std::vector<io::RawChunk> chunks;
  Workflow w = fitted_full_workflow(chunks);
  std::string path = std::string(::testing::TempDir()) + "wf_" + std::to_string(::getpid()) +
                     ".json";
  w.save(path);
  Workflow back = Workflow::load(path);
  io::Batch a, b;
  w.transform(chunks[1], a);
  back.transform(chunks[1], b);
  expect_bit_identical(a, b);
  EXPECT_EQ(back.dense_names(), (std::vector<std::string>{"I1", "I2"}));
  EXPECT_EQ(back.cat_names(), (std::vector<std::string>{"C1", "C2"}));
  std::remove(path.c_str());

  json j = w.to_json();
  j["version"] = 9;
  EXPECT_NE(error_of([&] { Workflow::from_json(j); }).find("unsupported version 9"),
            std::string::npos);
  j = w.to_json();
  j["columns"][2]["ops"][0].erase("vocab");
  EXPECT_NE(error_of([&] { Workflow::from_json(j); }).find("vocab"), std::string::npos);
}

TEST(WorkflowStateTest, FitStats) {
  auto w = Workflow::from_config(config_with({{{"op", "FillMissing"}}}), small_schema());
  ChunkBuilder b(2, 2);
  b.row(0, {1, kNaN}, {{5}, {}}).row(0, {-2, kNaN}, {{}, {6, 7}}).row(0, {7, kNaN}, {{5}, {6}});
  std::vector<io::RawChunk> chunks = {b.c};
  w.fit(source_of(chunks));
  json s = w.fit_stats();
  EXPECT_EQ(s["rows"], 3);
  EXPECT_EQ(s["dense"][0]["nulls"], 0);
  EXPECT_EQ(s["dense"][0]["min"], -2.0);
  EXPECT_EQ(s["dense"][0]["max"], 7.0);
  EXPECT_EQ(s["dense"][0]["mean"], 2.0);
  EXPECT_EQ(s["dense"][1]["nulls"], 3);
  EXPECT_TRUE(s["dense"][1]["mean"].is_null());
  EXPECT_EQ(s["categorical"][0]["nulls"], 1);
  EXPECT_EQ(s["categorical"][0]["cardinality"], 3);
  EXPECT_EQ(s["categorical"][1]["nulls"], 1);
  EXPECT_EQ(s["categorical"][1]["values"], 3);
  EXPECT_EQ(s["categorical"][1]["cardinality"], 4);
}

TEST(KeyMapTest, InsertFindGrowAllKeys) {
  KeyMap<int64_t> m;
  std::mt19937_64 rng(9);
  std::vector<uint64_t> keys = {0, ~uint64_t{0}, 1, ~uint64_t{0} - 1};
  for (int i = 0; i < 10000; ++i) keys.push_back(rng());
  for (size_t i = 0; i < keys.size(); ++i) m[keys[i]] = static_cast<int64_t>(i);
  EXPECT_EQ(m.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(*m.find(keys[i]), static_cast<int64_t>(i));
  EXPECT_EQ(m.find(12345), nullptr);
  size_t n = 0;
  m.for_each([&](uint64_t, int64_t) { ++n; });
  EXPECT_EQ(n, keys.size());
}

}  // namespace
}  // namespace dlrec::etl

namespace dlrec::etl {
namespace {

// fit + transform speed on parsed Criteo-like chunks (no parsing, no I/O). Run with
// --gtest_also_run_disabled_tests --gtest_filter='*WorkflowThroughput*'.
TEST(WorkflowPerfTest, DISABLED_WorkflowThroughput) {
  const int rows = 1 << 20, chunk_rows = 1 << 16;
  io::Schema s;
  s.columns.push_back({"label", io::ColumnKind::Label, false});
  for (int i = 1; i <= 13; ++i) s.columns.push_back({"I" + std::to_string(i), io::ColumnKind::Dense, false});
  for (int i = 1; i <= 26; ++i)
    s.columns.push_back({"C" + std::to_string(i), io::ColumnKind::Categorical, false});
  std::mt19937_64 rng(1);
  std::vector<io::RawChunk> chunks;
  for (int r0 = 0; r0 < rows; r0 += chunk_rows) {
    ChunkBuilder b(13, 26);
    std::vector<float> d(13);
    std::vector<std::vector<uint64_t>> c(26);
    for (int r = 0; r < chunk_rows; ++r) {
      for (auto& x : d) x = rng() % 10 ? static_cast<float>(rng() % 1000) : kNaN;
      for (int k = 0; k < 26; ++k) {
        uint64_t u = rng();
        c[k].assign(1, (u % 4 == 0 ? (u >> 8) % 1000000 : (u >> 8) % 100) * 2654435761u);
        if (u % 30 == 1) c[k].clear();
      }
      b.row(0, d, c);
    }
    chunks.push_back(b.c);
  }
  json cfg = {{"pipeline",
               json::array({{{"columns", "@dense"},
                             {"ops", {{{"op", "FillMissing"}}, {{"op", "Clip"}, {"min", 0}},
                                      {{"op", "LogOp"}}}}},
                            {{"columns", "@categorical"},
                             {"ops", {{{"op", "Categorify"}, {"freq_threshold", 2}}}}}})}};
  auto w = Workflow::from_config(cfg, s);
  Timer t;
  w.fit(source_of(chunks));
  double fit_s = t.seconds();
  t.reset();
  io::Batch out;
  for (const auto& c : chunks) w.transform(c, out);
  double tr_s = t.seconds();
  // ~265 bytes per Criteo text row.
  std::printf("threads %d: fit %.0f krows/s (%.0f MB/s of text), transform %.0f krows/s (%.0f MB/s)\n",
              num_threads(), rows / fit_s / 1e3, rows * 265 / fit_s / 1e6, rows / tr_s / 1e3,
              rows * 265 / tr_s / 1e6);
}

}  // namespace
}  // namespace dlrec::etl
