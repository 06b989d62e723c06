// The op set beyond v1: FillMedian, NormalizeMinMax, Bucketize, Categorify num_buckets,
// HashBucket, HashedCross, DropLowCardinality, Rename, TargetEncoding, JoinGroupby, Filter.
// Expected values are computed by hand (docs/ETL.md gives the formulas).
#include <gtest/gtest.h>

#include "test_errors.h"

#include <random>

#include <cmath>
#include <cstring>
#include <limits>

#include "dlrec/core/error.h"
#include "dlrec/etl/op.h"
#include "dlrec/etl/workflow.h"

namespace dlrec::etl {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
using Keys = std::vector<uint64_t>;

// label, I1, I2, C1, C2 (one-hot), C3 (multi-hot)
io::Schema schema3() {
  io::Schema s;
  s.columns = {{"label", io::ColumnKind::Label, false},
               {"I1", io::ColumnKind::Dense, false},
               {"I2", io::ColumnKind::Dense, false},
               {"C1", io::ColumnKind::Categorical, false},
               {"C2", io::ColumnKind::Categorical, false},
               {"C3", io::ColumnKind::Categorical, true}};
  return s;
}

struct Rows {
  io::RawChunk c;
  Rows() { c.reset(2, 3); }
  Rows& row(float label, float i1, float i2, Keys c1, Keys c2, Keys c3 = {}) {
    c.label.push_back(label);
    c.dense.push_back(i1);
    c.dense.push_back(i2);
    const Keys* k[3] = {&c1, &c2, &c3};
    for (int j = 0; j < 3; ++j) {
      c.cat_values[j].insert(c.cat_values[j].end(), k[j]->begin(), k[j]->end());
      c.cat_offsets[j].push_back(static_cast<int64_t>(c.cat_values[j].size()));
    }
    ++c.rows;
    return *this;
  }
};

json step(json columns, json ops) { return {{"columns", columns}, {"ops", ops}}; }
json cats() { return step("@categorical", {{{"op", "Categorify"}}}); }

// Fits on `rows` (in as many passes as needed) and transforms them.
Workflow fit_on(const json& steps, const io::RawChunk& rows, io::Batch& out) {
  auto w = Workflow::from_config({{"pipeline", steps}}, schema3());
  w.fit_multipass([&] {
    auto done = std::make_shared<bool>(false);
    return ChunkSource([&rows, done](io::RawChunk& c) {
      if (*done) return false;
      c = rows;
      *done = true;
      return true;
    });
  });
  w.transform(rows, out);
  return w;
}

std::vector<float> dense_col(const io::Batch& b, int col) {
  std::vector<float> v;
  for (int64_t r = 0; r < b.rows; ++r) v.push_back(b.dense[r * b.num_dense + col]);
  return v;
}

using dlrec::testing::error_of;

// Reloads through text and checks the JSON and the transform are identical.
void expect_reload_identical(const Workflow& w, const io::RawChunk& rows) {
  json j = w.to_json();
  Workflow back = Workflow::from_json(json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.output_layout(), w.output_layout());
  EXPECT_EQ(back.dense_names(), w.dense_names());
  EXPECT_EQ(back.cat_names(), w.cat_names());
  io::Batch a, b;
  w.transform(rows, a);
  back.transform(rows, b);
  ASSERT_EQ(a.dense.size(), b.dense.size());
  EXPECT_EQ(std::memcmp(a.dense.data(), b.dense.data(), a.dense.size() * 4), 0);
  EXPECT_EQ(a.cat_offsets, b.cat_offsets);
  EXPECT_EQ(a.cat_indices, b.cat_indices);
}

std::vector<int64_t> ids(const io::Batch& b, int feature) { return b.cat_indices[feature]; }

// ---- dense

TEST(FillMedianTest, OddAndEvenCounts) {
  Rows r;
  r.row(0, kNaN, kNaN, {1}, {1}).row(0, 5, 2, {1}, {1}).row(0, 1, 9, {1}, {1});
  r.row(0, 3, 4, {1}, {1}).row(0, 100, kNaN, {1}, {1});
  io::Batch out;
  auto w = fit_on({step("@dense", {{{"op", "FillMedian"}}}), cats()}, r.c, out);
  // I1: {1, 3, 5, 100} -> (3 + 5) / 2 = 4; I2: {2, 4, 9} -> 4.
  EXPECT_EQ(dense_col(out, 0), (std::vector<float>{4, 5, 1, 3, 100}));
  EXPECT_EQ(dense_col(out, 1), (std::vector<float>{4, 2, 9, 4, 4}));
  EXPECT_EQ(w.to_json()["columns"][0]["ops"][0]["median"], 4.0);
  EXPECT_EQ(w.to_json()["columns"][0]["ops"][0]["exact"], true);
  expect_reload_identical(w, r.c);
}

TEST(FillMedianTest, NegativeValuesAndChainAfterClip) {
  Rows r;
  for (float x : {-7.0f, -1.0f, -0.0f, 2.0f, 50.0f, kNaN}) r.row(0, x, x, {1}, {1});
  io::Batch out;
  // I1: {-7, -1, 0, 2, 50} -> 0. I2 clipped to [-2, 3] first: {-2, -1, 0, 2, 3} -> 0 as well,
  // but Clip keeps NaN, so the median fills it.
  auto w = fit_on({step(json::array({"I1"}), {{{"op", "FillMedian"}}}),
                   step(json::array({"I2"}), {{{"op", "Clip"}, {"min", -2}, {"max", 3}},
                                              {{"op", "FillMedian"}},
                                              {{"op", "NormalizeMinMax"}}}),
                   cats()},
                  r.c, out);
  EXPECT_EQ(w.num_fit_passes(), 2);
  EXPECT_EQ(dense_col(out, 0).back(), 0.0f);
  // I2 after Clip + FillMedian: {-2, -1, 0, 2, 3, 0}; min -2, max 3 -> (x + 2) / 5.
  std::vector<float> want;
  for (double x : {-2.0, -1.0, 0.0, 2.0, 3.0, 0.0}) want.push_back(static_cast<float>((x + 2) / 5));
  EXPECT_EQ(dense_col(out, 1), want);
}

TEST(FillMedianTest, ApproximateBeyondDistinctLimitIsClose) {
  Rows r;
  const int n = (1 << 20) + 100001;  // distinct values beyond the exact limit
  for (int i = 0; i < n; ++i) r.row(0, static_cast<float>(i) * 0.5f, 1, {}, {});
  r.row(0, kNaN, 1, {}, {});
  io::Batch out;
  auto w = fit_on({step(json::array({"I1"}), {{{"op", "FillMedian"}}}), cats()}, r.c, out);
  const double exact = (n - 1) * 0.5 / 2;  // median of 0, 0.5, ..., (n - 1) / 2
  const json op = w.to_json()["columns"][0]["ops"][0];
  EXPECT_EQ(op["exact"], false);
  EXPECT_NEAR(op["median"].get<double>(), exact, exact * 1e-4);
  EXPECT_EQ(dense_col(out, 0).back(), op["median"].get<float>());
}

TEST(NormalizeMinMaxTest, HandComputedAndConstant) {
  Rows r;
  r.row(0, 2, 3, {1}, {1}).row(0, 4, 3, {1}, {1}).row(0, 10, 3, {1}, {1}).row(0, kNaN, 3, {1}, {1});
  io::Batch out;
  auto w = fit_on({step("@dense", {{{"op", "NormalizeMinMax"}}, {{"op", "FillMissing"}, {"value", -1}}}),
                   cats()},
                  r.c, out);
  EXPECT_EQ(dense_col(out, 0), (std::vector<float>{0, 0.25, 1, -1}));
  EXPECT_EQ(dense_col(out, 1), (std::vector<float>{0, 0, 0, 0}));  // constant: x - min
  json op = w.to_json()["columns"][0]["ops"][0];
  EXPECT_EQ(op["min"], 2.0);
  EXPECT_EQ(op["max"], 10.0);
  expect_reload_identical(w, r.c);
}

TEST(BucketizeTest, IdsLayoutAndNames) {
  Rows r;
  for (float x : {kNaN, -1.0f, 0.0f, 5.0f, 10.0f, 11.0f}) r.row(0, x, 1, {7}, {8});
  io::Batch out;
  auto w = fit_on({step(json::array({"I1"}), {{{"op", "Clip"}, {"max", 10.5}},
                                             {{"op", "Bucketize"}, {"boundaries", {0, 10}}}}),
                   cats()},
                  r.c, out);
  // Schema order: I1 comes first among the categorical features.
  EXPECT_EQ(w.dense_names(), (std::vector<std::string>{"I2"}));
  EXPECT_EQ(w.cat_names(), (std::vector<std::string>{"I1", "C1", "C2", "C3"}));
  io::ShardLayout l = w.output_layout();
  EXPECT_EQ(l.num_dense, 1);
  EXPECT_EQ(l.cardinalities, (std::vector<int64_t>{4, 3, 3, 2}));
  EXPECT_EQ(ids(out, 0), (std::vector<int64_t>{0, 1, 2, 2, 3, 3}));
  EXPECT_EQ(dense_col(out, 0), std::vector<float>(6, 1.0f));
  expect_reload_identical(w, r.c);

  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {step("@dense", {{{"op", "Bucketize"}, {"boundaries", {3, 3}}}}),
                                         cats()}}},
                          schema3());
  });
  EXPECT_NE(msg.find("strictly increasing"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {step("@dense", {{{"op", "Bucketize"}, {"boundaries", {3}}},
                                                         {{"op", "LogOp"}}}),
                                         cats()}}},
                          schema3());
  });
  EXPECT_NE(msg.find("follows 'Bucketize'"), std::string::npos) << msg;
}

// ---- categorical

TEST(CategorifyBucketsTest, OovHashedIntoBuckets) {
  Rows r;
  r.row(0, 0, 0, {5}, {1}).row(0, 0, 0, {5}, {1}).row(0, 0, 0, {6}, {1}).row(0, 0, 0, {}, {1});
  io::Batch out;
  auto w = fit_on({step(json::array({"C1"}), {{{"op", "Categorify"}, {"num_buckets", 3}}}),
                   step(json::array({"C2", "C3"}), {{{"op", "Categorify"}}})},
                  r.c, out);
  // vocab {5 -> 2, 6 -> 3}; buckets 4, 5, 6.
  EXPECT_EQ(w.output_layout().cardinalities[0], 2 + 2 + 3);
  EXPECT_EQ(ids(out, 0), (std::vector<int64_t>{2, 2, 3, 0}));
  Rows v;
  v.row(0, 0, 0, {5}, {1}).row(0, 0, 0, {99}, {1}).row(0, 0, 0, {1000}, {1});
  w.transform(v.c, out);
  EXPECT_EQ(ids(out, 0), (std::vector<int64_t>{2, 4 + static_cast<int64_t>(mix64(99) % 3),
                                               4 + static_cast<int64_t>(mix64(1000) % 3)}));
  expect_reload_identical(w, v.c);
}

TEST(HashBucketTest, NoFitMultiHot) {
  Rows r;
  r.row(0, 0, 0, {5}, {1}, {3, 4}).row(0, 0, 0, {}, {1}, {});
  auto w = Workflow::from_config(
      {{"pipeline", {step(json::array({"C1", "C3"}), {{{"op", "HashBucket"}, {"num_buckets", 10}}}),
                     step(json::array({"C2"}), {{{"op", "Categorify"}}})}}},
      schema3());
  w.fit_multipass([&] { return ChunkSource([](io::RawChunk&) { return false; }); });
  io::Batch out;
  w.transform(r.c, out);
  auto h = [](uint64_t k) { return 1 + static_cast<int64_t>(mix64(k) % 10); };
  EXPECT_EQ(ids(out, 0), (std::vector<int64_t>{h(5), 0}));
  EXPECT_EQ(ids(out, 2), (std::vector<int64_t>{h(3), h(4), 0}));
  EXPECT_EQ(w.output_layout().cardinalities, (std::vector<int64_t>{11, 2, 11}));  // C2 fitted on no rows
  EXPECT_NE(mix64(1), mix64(2));
  EXPECT_EQ(mix64(0), 0u);  // fmix64 fixes 0: documented, keys are hashes anyway
  expect_reload_identical(w, r.c);
}

TEST(HashedCrossTest, IdsNameAndErrors) {
  Rows r;
  r.row(0, 0, 0, {5}, {7}).row(0, 0, 0, {5}, {}).row(0, 0, 0, {6}, {7});
  io::Batch out;
  auto w = fit_on({cats(), step(json::array({"C1", "C2"}),
                                {{{"op", "HashedCross"}, {"num_buckets", 1000}}})},
                  r.c, out);
  EXPECT_EQ(w.cat_names(), (std::vector<std::string>{"C1", "C2", "C3", "C1_X_C2"}));
  EXPECT_EQ(w.output_layout().cardinalities.back(), 1001);
  auto cross = [](uint64_t a, uint64_t b) {
    uint64_t h = mix64(mix64(a) * 0x9E3779B97F4A7C15ULL + mix64(b));
    return 1 + static_cast<int64_t>(h % 1000);
  };
  EXPECT_EQ(ids(out, 3), (std::vector<int64_t>{cross(5, 7), 0, cross(6, 7)}));
  EXPECT_NE(cross(5, 7), cross(7, 5));
  expect_reload_identical(w, r.c);

  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C1", "C3"}),
                                                      {{{"op", "HashedCross"}, {"num_buckets", 9}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("'C3' is multi-hot"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C1"}),
                                                      {{{"op", "HashedCross"}, {"num_buckets", 9}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("needs 2 or more"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C1", "I1"}),
                                                      {{{"op", "HashedCross"}, {"num_buckets", 9}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("'I1' is dense"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config(
        {{"pipeline", {cats(), step(json::array({"C1", "C2"}),
                                    {{{"op", "HashedCross"}, {"num_buckets", 9}, {"name", "C3"}}})}}},
        schema3());
  });
  EXPECT_NE(msg.find("'C3' is produced twice"), std::string::npos) << msg;
}

TEST(DropLowCardinalityTest, DropsEmptyVocabularyAndRenames) {
  Rows r;
  r.row(0, 1, 2, {5}, {}, {1}).row(0, 1, 2, {6}, {}, {1});
  io::Batch out;
  auto w = fit_on({step("@categorical", {{{"op", "Categorify"}}, {{"op", "DropLowCardinality"}}}),
                   step(json::array({"C1"}), {{{"op", "Rename"}, {"name", "user"}}}),
                   step(json::array({"C3"}), {{{"op", "Rename"}, {"prefix", "x_"}}}),
                   step(json::array({"I2"}), {{{"op", "Rename"}, {"name", "price"}}})},
                  r.c, out);
  // C2: every value missing -> cardinality 2 < 3 -> dropped. C3: one key -> 3, kept.
  EXPECT_EQ(w.cat_names(), (std::vector<std::string>{"user", "x_C3"}));
  EXPECT_EQ(w.dense_names(), (std::vector<std::string>{"I1", "price"}));
  EXPECT_EQ(w.output_layout().cardinalities, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(out.num_cat(), 2);
  EXPECT_EQ(ids(out, 0), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.fit_stats()["categorical"][1]["dropped"], true);
  expect_reload_identical(w, r.c);

  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {step("@categorical", {{{"op", "DropLowCardinality"}},
                                                               {{"op", "Categorify"}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("put it after the encoder"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step("@dense", {{{"op", "Rename"}, {"name", "x"}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("'x' is produced twice"), std::string::npos) << msg;
}

// ---- joint vocabularies

TEST(CategorifyJointTest, ColumnsShareOneVocabulary) {
  Rows r;
  r.row(0, 0, 0, {7}, {8}).row(0, 0, 0, {7}, {7}).row(0, 0, 0, {8}, {7});
  r.row(0, 0, 0, {8}, {9}).row(0, 0, 0, {9}, {8}).row(0, 0, 0, {}, {});
  io::Batch out;
  auto w = fit_on({step(json::array({"C1", "C2"}),
                        {{{"op", "Categorify"}, {"freq_threshold", 2}, {"encode_type", "joint"}}}),
                   step(json::array({"C3"}), {{{"op", "Categorify"}}})},
                  r.c, out);
  // Joint counts: 7 -> 2 + 2, 8 -> 2 + 2, 9 -> 1 + 1: all reach 2; ties by key.
  EXPECT_EQ(out.cat_indices[0], (std::vector<int64_t>{2, 2, 3, 3, 4, 0}));
  EXPECT_EQ(out.cat_indices[1], (std::vector<int64_t>{3, 2, 2, 4, 3, 0}));
  EXPECT_EQ(w.output_layout().cardinalities[0], 5);
  EXPECT_EQ(w.output_layout().cardinalities[1], 5);
  json j = w.to_json();
  EXPECT_EQ(j["columns"][2]["ops"][0]["encode_type"], "joint");
  EXPECT_EQ(j["columns"][2]["ops"][0]["vocab"], j["columns"][3]["ops"][0]["vocab"]);
  expect_reload_identical(w, r.c);
  // Per column, 9 is seen once in each: out of vocabulary.
  io::Batch sep;
  fit_on({step(json::array({"C1", "C2"}), {{{"op", "Categorify"}, {"freq_threshold", 2}}}),
          step(json::array({"C3"}), {{{"op", "Categorify"}}})},
         r.c, sep);
  EXPECT_EQ(sep.cat_indices[0], (std::vector<int64_t>{2, 2, 3, 3, 1, 0}));
  EXPECT_EQ(sep.cat_indices[1], (std::vector<int64_t>{3, 2, 2, 1, 3, 0}));
  std::string msg = error_of([] {
    Workflow::from_config(
        {{"pipeline", {step("@categorical", {{{"op", "Categorify"}, {"encode_type", "jiont"}}})}}},
        schema3());
  });
  EXPECT_NE(msg.find("'pipeline[0].ops[0].encode_type' must be \"column\" or \"joint\", got "
                     "'jiont' (did you mean 'joint'?)"),
            std::string::npos)
      << msg;
}

// ---- features from statistics

TEST(TargetEncodingTest, SmoothedMeans) {
  Rows r;
  r.row(1, 0, 0, {5}, {1}).row(0, 0, 0, {5}, {1}).row(1, 0, 0, {5}, {1});
  r.row(0, 0, 0, {6}, {1}).row(1, 0, 0, {}, {1});
  io::Batch out;
  auto w = fit_on({cats(), step(json::array({"C1"}), {{{"op", "TargetEncoding"}, {"smoothing", 2}}})},
                  r.c, out);
  EXPECT_EQ(w.dense_names(), (std::vector<std::string>{"I1", "I2", "TE_C1_label"}));
  // mean = 3/5; key 5: (2 + 2 * 0.6) / (3 + 2) = 0.64; key 6: (0 + 1.2) / (1 + 2) = 0.4.
  const float m = static_cast<float>(0.6), a = static_cast<float>((2 + 2 * 0.6) / 5),
              b = static_cast<float>((0 + 2 * 0.6) / 3);
  EXPECT_EQ(dense_col(out, 2), (std::vector<float>{a, a, a, b, m}));
  Rows v;
  v.row(0, 0, 0, {77}, {1});  // unseen -> mean
  io::Batch vo;
  w.transform(v.c, vo);
  EXPECT_EQ(dense_col(vo, 2), (std::vector<float>{m}));
  expect_reload_identical(w, r.c);

  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C3"}), {{{"op", "TargetEncoding"}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("'C3' is multi-hot"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config(
        {{"pipeline", {cats(), step(json::array({"C1"}), {{{"op", "TargetEncoding"}, {"kfold", 1}}})}}},
        schema3());
  });
  EXPECT_NE(msg.find("'pipeline[1].ops[0].kfold' must be 0 (off) or at least 2"), std::string::npos)
      << msg;
  msg = error_of([] {
    Workflow::from_config(
        {{"pipeline", {cats(), step(json::array({"C1"}), {{{"op", "TargetEncoding"}, {"seed", 3}}})}}},
        schema3());
  });
  EXPECT_NE(msg.find("'pipeline[1].ops[0].seed' applies with kfold >= 2 only"), std::string::npos)
      << msg;
}

// K-fold: training row i (in fit order) is encoded with the statistics of the training rows of
// the other folds, fold = mix64(i ^ mix64(seed + 0x9E3779B97F4A7C15)) % kfold; other rows (and
// serving) use all training rows.
TEST(TargetEncodingTest, KFoldOutOfFold) {
  Rows r;
  std::mt19937 rng(5);
  for (int i = 0; i < 400; ++i) {
    Keys k;
    if (i % 13) k.push_back(rng() % 6);
    r.row(static_cast<float>(rng() % 3 == 0), 0, 0, k, {1});
  }
  const int64_t kfold = 4, seed = 9;
  const double smoothing = 3;
  io::Batch all;
  auto w = fit_on({cats(), step(json::array({"C1"}), {{{"op", "TargetEncoding"},
                                                       {"smoothing", smoothing},
                                                       {"kfold", kfold},
                                                       {"seed", seed}}})},
                  r.c, all);
  // The rows from 250 on are not training rows; rows 0..249 are training rows 100..349.
  const TrainRows train{100, 250};
  io::Batch out;
  std::vector<int64_t> kept;
  w.transform(r.c, out, &kept, false, &train);
  auto fold = [&](int64_t i) {
    return static_cast<int64_t>(mix64(static_cast<uint64_t>(i) ^ mix64(seed + 0x9E3779B97F4A7C15ULL)) %
                                kfold);
  };
  // Fit order: row i of the chunk is training row i.
  std::vector<int> folds_seen(kfold, 0);
  for (int64_t i = 0; i < r.c.rows; ++i) {
    const bool training = i < train.rows;
    const int64_t f = training ? fold(train.first + i) : -1;
    if (training) ++folds_seen[f];
    double tot = 0, n = 0, sum = 0, cnt = 0;
    const bool has_key = r.c.cat_offsets[0][i + 1] > r.c.cat_offsets[0][i];
    const uint64_t key = has_key ? r.c.cat_values[0][r.c.cat_offsets[0][i]] : 0;
    for (int64_t j = 0; j < r.c.rows; ++j) {
      if (training && fold(j) == f) continue;
      tot += r.c.label[j];
      ++n;
      const bool hk = r.c.cat_offsets[0][j + 1] > r.c.cat_offsets[0][j];
      if (has_key && hk && r.c.cat_values[0][r.c.cat_offsets[0][j]] == key) {
        sum += r.c.label[j];
        ++cnt;
      }
    }
    const double prior = tot / n;
    const float want = static_cast<float>(has_key ? (sum + smoothing * prior) / (cnt + smoothing) : prior);
    ASSERT_NEAR(dense_col(out, 2)[i], want, 1e-6) << "row " << i << " training " << training;
    // Without `train` (serving) every row gets the all-rows encoding.
    if (!training) {
      EXPECT_EQ(dense_col(out, 2)[i], dense_col(all, 2)[i]) << i;
    }
  }
  for (int f = 0; f < kfold; ++f) EXPECT_GT(folds_seen[f], 30) << "fold " << f;
  // Training rows differ from their all-rows encoding (no leak of their own label).
  EXPECT_NE(dense_col(out, 2)[0], dense_col(all, 2)[0]);
  // The reloaded workflow keeps the parameters; encoding training rows needs the fold state.
  json j = w.to_json();
  EXPECT_EQ(j["features"][0]["op"]["kfold"], kfold);
  EXPECT_EQ(j["features"][0]["op"]["seed"], seed);
  Workflow again = Workflow::from_json(j);
  io::Batch b;
  again.transform(r.c, b);
  EXPECT_EQ(b.dense, all.dense);
  std::string msg = error_of([&] { again.transform(r.c, b, &kept, false, &train); });
  EXPECT_NE(msg.find("per-fold statistics"), std::string::npos) << msg;
}

TEST(JoinGroupbyTest, CountSumMean) {
  Rows r;
  r.row(0, 1, 0, {5}, {1}).row(0, kNaN, 0, {5}, {1}).row(0, 3, 0, {5}, {1});
  r.row(0, 5, 0, {6}, {1}).row(0, 7, 0, {}, {1});
  io::Batch out;
  auto w = fit_on({step("@dense", {{{"op", "FillMissing"}}}), cats(),
                   step(json::array({"C1"}), {{{"op", "JoinGroupby"},
                                               {"cont_cols", {"I1"}},
                                               {"stats", {"count", "sum", "mean"}}}})},
                  r.c, out);
  EXPECT_EQ(w.dense_names(),
            (std::vector<std::string>{"I1", "I2", "C1_count", "C1_I1_sum", "C1_I1_mean"}));
  // key 5: 3 rows, I1 {1, 3} (NaN skipped: raw values) -> sum 4, mean 2; key 6: 1, 5, 5.
  EXPECT_EQ(dense_col(out, 2), (std::vector<float>{3, 3, 3, 1, 0}));
  EXPECT_EQ(dense_col(out, 3), (std::vector<float>{4, 4, 4, 5, 0}));
  EXPECT_EQ(dense_col(out, 4), (std::vector<float>{2, 2, 2, 5, 0}));
  expect_reload_identical(w, r.c);

  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C1"}),
                                                      {{{"op", "JoinGroupby"}, {"cont_cols", {"I3"}},
                                                        {"stats", {"sum"}}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("'I3' is not a dense column (did you mean 'I1'?)"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C1"}),
                                                      {{{"op", "JoinGroupby"}, {"cont_cols", {"I1"}},
                                                        {"stats", {"meen"}}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("did you mean 'mean'"), std::string::npos) << msg;
}

TEST(FilterTest, DropsRowsOnlyWhenAskedAndFitsOnKeptRows) {
  Rows r;
  r.row(0, -1, 100, {5}, {1}).row(1, 0, 2, {5}, {1}).row(0, kNaN, 100, {6}, {1}).row(1, 5, 4, {6}, {1});
  io::Batch out;
  auto w = fit_on({step(json::array({"I1"}), {{{"op", "Filter"}, {"min", 0}}}),
                   step("@dense", {{{"op", "FillMissing"}}}),
                   step(json::array({"I2"}), {{{"op", "NormalizeMinMax"}}}), cats()},
                  r.c, out);
  // Fitted on rows 1 and 3 only: I2 min 2, max 4; C1 vocabulary {5, 6} by count 1 each.
  EXPECT_EQ(out.rows, 4);  // no `kept`: every row (serving)
  std::vector<int64_t> kept;
  w.transform(r.c, out, &kept);
  EXPECT_EQ(kept, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(out.rows, 2);
  EXPECT_EQ(out.labels, (std::vector<float>{1, 1}));
  EXPECT_EQ(dense_col(out, 1), (std::vector<float>{0, 1}));
  EXPECT_EQ(w.fit_stats()["rows"], 2);
  EXPECT_EQ(w.fit_stats()["filtered_rows"], 2);
  expect_reload_identical(w, r.c);
  Workflow back = Workflow::from_json(w.to_json());
  io::Batch b2;
  std::vector<int64_t> kept2;
  back.transform(r.c, b2, &kept2);
  EXPECT_EQ(kept2, kept);

  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {cats(), step(json::array({"C1"}), {{{"op", "Filter"}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("applies to dense columns"), std::string::npos) << msg;
}

TEST(OpsConfigTest, UnknownNamesNearest) {
  std::string msg = error_of([] {
    Workflow::from_config({{"pipeline", {step("@categorical", {{{"op", "HashBuckett"}}})}}}, schema3());
  });
  EXPECT_NE(msg.find("did you mean 'HashBucket'"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {step("@categorical", {{{"op", "Categorify"}, {"num_bucket", 4}}})}}},
                          schema3());
  });
  EXPECT_NE(msg.find("did you mean 'num_buckets'"), std::string::npos) << msg;
  msg = error_of([] {
    Workflow::from_config({{"pipeline", {step("@dense", {{{"op", "FillMedain"}}}), cats()}}}, schema3());
  });
  EXPECT_NE(msg.find("did you mean 'FillMedian'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dlrec::etl

namespace dlrec::etl {
namespace {

// LogOp and the dense ops' contiguous (stride 1, vectorized) and strided loops give the same
// bits as the plain formula, for values in and out of LogOp's table: -0, +0, whole numbers at
// the table's edge, fractions, negatives, huge values, infinities, NaN.
TEST(DenseOpsExactTest, ContiguousAndStridedMatchTheFormula) {
  std::vector<float> vals = {-0.0f, 0.0f, 1.0f, 2.0f, 16383.0f, 16384.0f, 16385.0f, 0.5f,
                             -0.5f, -1.0f, -2.0f, 1e10f, -1e30f, 3.0e9f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(), 7.25f, 100.0f};
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i)
    vals.push_back(i % 3 ? static_cast<float>(rng() % 20000)
                         : std::ldexp(static_cast<float>(rng() % 1000), static_cast<int>(rng() % 40) - 20));
  auto bits = [](float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
  };
  const json ops[] = {{{"op", "LogOp"}},
                      {{"op", "FillMissing"}, {"value", 3.5}},
                      {{"op", "Clip"}, {"min", -1}, {"max", 5000}}};
  auto formula = [](const json& op, float x) -> float {
    const std::string name = op["op"];
    if (name == "LogOp") return std::log1p(x);
    if (name == "FillMissing") return std::isnan(x) ? 3.5f : x;
    x = x < -1.f ? -1.f : x;
    return x > 5000.f ? 5000.f : x;
  };
  for (const json& spec : ops) {
    SCOPED_TRACE(spec.dump());
    auto op = OpRegistry::global().create(spec, "test", false);
    auto* d = dynamic_cast<DenseOp*>(op.get());
    ASSERT_NE(d, nullptr);
    std::vector<float> flat = vals;
    d->transform(flat.data(), static_cast<int64_t>(flat.size()), 1);
    std::vector<float> strided(vals.size() * 3, 42.0f);
    for (size_t i = 0; i < vals.size(); ++i) strided[i * 3] = vals[i];
    d->transform(strided.data(), static_cast<int64_t>(vals.size()), 3);
    for (size_t i = 0; i < vals.size(); ++i) {
      const float want = formula(spec, vals[i]);
      ASSERT_EQ(bits(flat[i]), bits(want)) << "value " << vals[i];
      ASSERT_EQ(bits(strided[i * 3]), bits(want)) << "value " << vals[i];
      ASSERT_EQ(strided[i * 3 + 1], 42.0f);
    }
  }
}

}  // namespace
}  // namespace dlrec::etl
