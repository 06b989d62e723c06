// Labels derived by the workflow: the Binarize op and the config's "label" key (a dense column's
// value after its ops becomes the label and leaves the features).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "dlrec/etl/workflow.h"
#include "test_errors.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::error_of;
using dlrec::testing::expect_error;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// user (categorical), rating (dense), age (dense): a ratings log with no label column.
io::Schema ratings_schema() {
  io::Schema s;
  s.columns = {{"user", io::ColumnKind::Categorical, false},
               {"rating", io::ColumnKind::Dense, false},
               {"age", io::ColumnKind::Dense, false}};
  return s;
}

// Rows of (user, rating, age), as the text reader gives them: labels 0 (the schema has none).
io::RawChunk ratings(const std::vector<std::tuple<uint64_t, float, float>>& rows) {
  io::RawChunk c;
  c.reset(2, 1);
  c.first_line = 2;
  for (const auto& [user, rating, age] : rows) {
    c.label.push_back(0);
    c.dense.push_back(rating);
    c.dense.push_back(age);
    c.cat_values[0].push_back(user);
    c.cat_offsets[0].push_back(static_cast<int64_t>(c.cat_values[0].size()));
    ++c.rows;
  }
  return c;
}

json binarize(double threshold, const std::string& compare) {
  return {{"op", "Binarize"}, {"threshold", threshold}, {"compare", compare}};
}

json config(json label_ops, json label = "rating") {
  // `config({op})` is an array of one op under g++ but the op itself under clang (copy
  // initialisation from a one-element list): make it the list of ops either way.
  if (label_ops.is_object()) label_ops = json::array({label_ops});
  json j = {{"pipeline",
             {{{"columns", json::array({"rating"})}, {"ops", label_ops}},
              {{"columns", "@categorical"}, {"ops", {{{"op", "Categorify"}}}}}}}};
  if (!label.is_null()) j["label"] = label;
  return j;
}

Workflow fitted(const json& cfg, const io::RawChunk& rows) {
  Workflow w = Workflow::from_config(cfg, ratings_schema());
  w.fit_multipass([&rows] {
    auto done = std::make_shared<bool>(false);
    return ChunkSource([&rows, done](io::RawChunk& c) {
      if (*done) return false;
      c = rows;
      *done = true;
      return true;
    });
  });
  return w;
}

TEST(BinarizeTest, EveryComparison) {
  const io::RawChunk rows = ratings({{1, 1, 0}, {2, 3, 0}, {1, 4, 0}, {2, 5, 0}});
  const std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"gt", {0, 0, 1, 1}}, {"ge", {0, 1, 1, 1}}, {"lt", {1, 0, 0, 0}},
      {"le", {1, 1, 0, 0}}, {"eq", {0, 1, 0, 0}}, {"ne", {1, 0, 1, 1}}};
  for (const auto& [cmp, want] : cases) {
    Workflow w = fitted(config({binarize(3, cmp)}), rows);
    io::Batch out;
    w.transform(rows, out);
    EXPECT_EQ(out.labels, want) << cmp;
    // The label column is not a feature: only age is left.
    EXPECT_EQ(w.dense_names(), std::vector<std::string>{"age"}) << cmp;
    EXPECT_EQ(out.dense, (std::vector<float>{0, 0, 0, 0})) << cmp;
    EXPECT_EQ(w.label_name(), "rating");
    EXPECT_EQ(w.derived_label_column(), "rating");
    // workflow.json carries the label and reloads to the same transform.
    Workflow back = Workflow::from_json(json::parse(w.to_json().dump()));
    EXPECT_EQ(back.to_json(), w.to_json());
    EXPECT_EQ(back.derived_label_column(), "rating");
    io::Batch again;
    back.transform(rows, again);
    EXPECT_EQ(again.labels, want) << cmp;
  }
}

TEST(BinarizeTest, AsAFeatureAndMissingStaysMissing) {
  // On a feature column (no "label" key): 1/0 values, a missing one stays missing (NaN), so
  // FillMissing after it decides.
  const io::RawChunk rows = ratings({{1, 4, 20}, {2, kNaN, 40}});
  json cfg = {{"pipeline",
               {{{"columns", json::array({"rating"})},
                 {"ops", {binarize(3, "gt"), {{"op", "FillMissing"}, {"value", -1}}}}},
                {{"columns", "@categorical"}, {"ops", {{{"op", "Categorify"}}}}}}}};
  Workflow w = fitted(cfg, rows);
  io::Batch out;
  w.transform(rows, out);
  EXPECT_EQ(w.dense_names(), (std::vector<std::string>{"rating", "age"}));
  EXPECT_EQ(out.dense, (std::vector<float>{1, 20, -1, 40}));
  EXPECT_EQ(w.derived_label_column(), "");
}

TEST(BinarizeTest, BadConfigs) {
  auto make = [](json op) { Workflow::from_config(config({op}), ratings_schema()); };
  expect_error([&] { make(binarize(3, "gte")); },
               {"'gte' is not one of: gt, ge, lt, le, eq, ne", "did you mean 'gt'"});
  expect_error([&] { make({{"op", "Binarize"}, {"compare", "gt"}}); }, {"threshold", "required"});
  expect_error([&] { make({{"op", "Binarize"}, {"threshold", "3"}}); }, {"threshold"});
  expect_error([&] { make({{"op", "Binarize"}, {"threshold", 3}, {"compare", 1}}); },
               {"compare", "wrong type"});
  expect_error([&] { make({{"op", "Binarize"}, {"threshold", 3}, {"cmp", "gt"}}); },
               {"unknown config key", "cmp"});
  // On a categorical column.
  expect_error(
      [] {
        Workflow::from_config(
            {{"pipeline",
              {{{"columns", json::array({"user"})}, {"ops", json::array({binarize(3, "gt")})}}}}},
            ratings_schema());
      },
      {"op 'Binarize'", "applies to dense columns", "'user' is categorical"});
}

TEST(LabelKeyTest, DefaultCompareIsGreaterThan) {
  const io::RawChunk rows = ratings({{1, 3, 0}, {1, 3.5, 0}});
  Workflow w = fitted(config({{{"op", "Binarize"}, {"threshold", 3}}}), rows);
  io::Batch out;
  w.transform(rows, out);
  EXPECT_EQ(out.labels, (std::vector<float>{0, 1}));
}

TEST(LabelKeyTest, RegressionTargetWithFittedOps) {
  // A regression target: the rating normalized (fitted on the training rows), no Binarize.
  const io::RawChunk rows = ratings({{1, 1, 0}, {2, 3, 0}, {1, 5, 0}});
  Workflow w = fitted(config({{{"op", "Normalize"}}}), rows);
  io::Batch out;
  w.transform(rows, out);
  ASSERT_EQ(out.labels.size(), 3u);
  const float sd = std::sqrt(8.f / 3.f);
  EXPECT_NEAR(out.labels[0], -2 / sd, 1e-6);
  EXPECT_NEAR(out.labels[1], 0, 1e-6);
  EXPECT_NEAR(out.labels[2], 2 / sd, 1e-6);
}

TEST(LabelKeyTest, NotFiniteLabelNamesTheRow) {
  const io::RawChunk rows = ratings({{1, 4, 0}, {1, 2, 0}, {2, kNaN, 0}});
  Workflow w = fitted(config({binarize(3, "gt")}), rows);
  io::Batch out;
  expect_error([&] { w.transform(rows, out); }, {"label (column 'rating')", "line 4"});
  // Filled, it passes.
  Workflow filled =
      fitted(config({{{"op", "FillMissing"}, {"value", 0}}, binarize(3, "gt")}), rows);
  filled.transform(rows, out);
  EXPECT_EQ(out.labels, (std::vector<float>{1, 0, 0}));
  // LogOp of a value below -1.
  const io::RawChunk neg = ratings({{1, -2, 0}});
  Workflow logw = fitted(config({{{"op", "LogOp"}}}), neg);
  expect_error([&] { logw.transform(neg, out); }, {"label (column 'rating')", "raw value -2"});
}

TEST(LabelKeyTest, ServingWithoutLabelsLeavesThemZero) {
  // The server passes no labels (an empty RawChunk::label) and NaN for the absent rating.
  const io::RawChunk rows = ratings({{1, 4, 0}, {2, 1, 0}});
  Workflow w = fitted(config({binarize(3, "gt")}), rows);
  io::RawChunk req = ratings({{1, kNaN, 30}});
  req.label.clear();
  io::Batch out;
  w.transform(req, out);
  EXPECT_EQ(out.labels, std::vector<float>{0});
  EXPECT_EQ(out.dense, std::vector<float>{30});
}

TEST(LabelKeyTest, BadLabelKeys) {
  auto make = [](json label) {
    Workflow::from_config(config({binarize(3, "gt")}, label), ratings_schema());
  };
  expect_error([&] { make("ratin"); }, {"unknown column 'ratin'", "did you mean 'rating'"});
  expect_error([&] { make("user"); }, {"'user' is categorical", "label must be numeric"});
  expect_error([&] { make(3); }, {"'label' must be a column name"});
  // Bucketize would make the label categorical.
  expect_error(
      [] {
        Workflow::from_config(config({{{"op", "Bucketize"}, {"boundaries", {3}}}}),
                              ratings_schema());
      },
      {"is the label", "Bucketize"});
  // TargetEncoding reads the raw label: refused with a derived one.
  json te = config({binarize(3, "gt")});
  te["pipeline"].push_back(
      {{"columns", json::array({"user"})}, {"ops", {{{"op", "TargetEncoding"}}}}});
  expect_error([&] { Workflow::from_config(te, ratings_schema()); },
               {"TargetEncoding", "not supported yet"});
  // The schema's own label column named explicitly is the default.
  io::Schema with_label = ratings_schema();
  with_label.columns.insert(with_label.columns.begin(), {"click", io::ColumnKind::Label, false});
  json plain = config({binarize(3, "gt")}, "click");
  Workflow w = Workflow::from_config(plain, with_label);
  EXPECT_EQ(w.derived_label_column(), "");
  EXPECT_EQ(w.label_name(), "click");
  // A skipped column.
  io::Schema skipped = ratings_schema();
  skipped.columns.push_back({"ts", io::ColumnKind::Skip, false});
  expect_error([&] { Workflow::from_config(config({}, "ts"), skipped); }, {"'ts' is skipped"});
}

}  // namespace
}  // namespace dlrec::etl
