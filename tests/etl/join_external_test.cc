// JoinExternal: side tables (CSV, TSV, Parquet) left-joined on a key before the pipeline, carried
// inside workflow.json, and every bad input a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "dlrec/etl/run.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/parquet.h"
#include "dlrec/io/text_reader.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::etl {
namespace {

using dlrec::testing::expect_error;
using dlrec::testing::TempDir;
using dlrec::testing::write_file;

// The log: user, item (categorical), clicked (label).
io::Schema log_schema() {
  return io::Schema::from_json(json::parse(R"({"format": "csv", "columns": [
      {"name": "user", "kind": "categorical"}, {"name": "item", "kind": "categorical"},
      {"name": "clicked", "kind": "label"}]})"));
}

const char* kLog =
    "user,item,clicked\n"
    "u1,i1,1\n"
    "u2,i2,0\n"
    "u3,i1,1\n"  // u3 is not in the users table: missing age and country
    ",i2,0\n"    // no user at all: missing too
    "u1,i2,1\n";

const char* kUsers =
    "user,age,country\n"
    "u1,30,fr\n"
    "u2,,de\n"  // an empty age: a missing value, as in any input
    "u4,50,fr\n";

json users_schema() {
  return json::parse(R"({"format": "csv", "columns": [
      {"name": "user", "kind": "categorical"}, {"name": "age", "kind": "dense"},
      {"name": "country", "kind": "categorical"}]})");
}

json users_join(const std::string& path) {
  return {{"path", path}, {"on", "user"}, {"schema", users_schema()}};
}

json config_with(const json& joins) {
  return {{"join_external", joins},
          {"pipeline",
           {{{"columns", json::array({"age"})}, {"ops", {{{"op", "FillMissing"}, {"value", -1}}}}},
            {{"columns", "@categorical"}, {"ops", {{{"op", "Categorify"}}}}}}}};
}

io::RawChunk read_all_rows(const std::string& path, const io::Schema& schema) {
  io::RawChunk all, c;
  all.reset(schema.num_dense(), schema.num_cat());
  auto reader = io::open_reader({path}, schema, {});
  while (reader->next(c)) all.append(c);
  return all;
}

void fit_on(Workflow& w, const io::RawChunk& rows) {
  w.fit_multipass([&rows] {
    auto done = std::make_shared<bool>(false);
    return ChunkSource([&rows, done](io::RawChunk& c) {
      if (*done) return false;
      c = rows;
      *done = true;
      return true;
    });
  });
}

// Feature `name`'s one id per row.
std::vector<int64_t> ids_of(const Workflow& w, const io::Batch& b, const std::string& name) {
  const auto names = w.cat_names();
  const size_t t = std::find(names.begin(), names.end(), name) - names.begin();
  EXPECT_LT(t, names.size()) << name;
  std::vector<int64_t> v;
  for (int64_t r = 0; r < b.rows; ++r) {
    EXPECT_EQ(b.cat_offsets[t][r + 1] - b.cat_offsets[t][r], 1);
    v.push_back(b.cat_indices[t][b.cat_offsets[t][r]]);
  }
  return v;
}

void expect_joined(const Workflow& w, const io::Batch& b) {
  ASSERT_EQ(b.rows, 5);
  EXPECT_EQ(w.dense_names(), std::vector<std::string>({"age"}));
  EXPECT_EQ(w.cat_names(), std::vector<std::string>({"user", "item", "country"}));
  // Left join: u1 -> 30, u2 -> missing age, u3 and no user -> missing (FillMissing -1).
  EXPECT_EQ(b.dense, std::vector<float>({30, -1, -1, -1, 30}));
  const auto country = ids_of(w, b, "country");
  EXPECT_GE(country[0], 2);
  EXPECT_GE(country[1], 2);
  EXPECT_NE(country[0], country[1]);  // fr, de
  EXPECT_EQ(country[2], 0);           // u3: no row in the side table
  EXPECT_EQ(country[3], 0);           // no key
  EXPECT_EQ(country[4], country[0]);  // u1 again
  EXPECT_EQ(b.labels, std::vector<float>({1, 0, 1, 0, 1}));
}

TEST(JoinExternal, LeftJoinGivesMissingValuesForUnknownKeys) {
  TempDir dir("join_left");
  const std::string users = write_file(dir.path, "users.csv", kUsers);
  const io::RawChunk rows = read_all_rows(write_file(dir.path, "log.csv", kLog), log_schema());
  Workflow w = Workflow::from_config(config_with(json::array({users_join(users)})), log_schema());
  // The workflow's schema stays the input's: readers and the server parse user, item, clicked.
  EXPECT_EQ(w.schema().columns.size(), 3u);
  fit_on(w, rows);
  io::Batch b;
  w.transform(rows, b);
  expect_joined(w, b);
  // The side table's size is reported (stats.json "columns": fit_stats()).
  const json s = w.fit_stats().at("join_external");
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].at("rows"), 3);
  EXPECT_EQ(s[0].at("columns"), json::array({"age", "country"}));
  EXPECT_GT(s[0].at("memory_bytes").get<int64_t>(), 3 * 8);
}

TEST(JoinExternal, ReloadedWorkflowJoinsWithoutTheSideFile) {
  TempDir dir("join_reload");
  const std::string users = write_file(dir.path, "users.csv", kUsers);
  const io::RawChunk rows = read_all_rows(write_file(dir.path, "log.csv", kLog), log_schema());
  Workflow w = Workflow::from_config(config_with(json::array({users_join(users)})), log_schema());
  fit_on(w, rows);
  w.save(dir.path + "/workflow.json");
  std::remove(users.c_str());  // serving has only the model directory
  const Workflow again = Workflow::load(dir.path + "/workflow.json");
  io::Batch a, b;
  w.transform(rows, a);
  again.transform(rows, b);
  expect_joined(again, b);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.cat_indices, b.cat_indices);
  // The embedded table records where it came from.
  const json j = again.to_json().at("join_external")[0];
  EXPECT_EQ(j.at("path"), users);
  EXPECT_EQ(j.at("file_bytes"), std::string(kUsers).size());
  EXPECT_EQ(j.at("rows"), 3);
}

TEST(JoinExternal, TsvAndParquetSideTablesJoinLikeCsv) {
  TempDir dir("join_formats");
  const io::RawChunk rows = read_all_rows(write_file(dir.path, "log.csv", kLog), log_schema());
  // TSV: the same rows with tabs.
  std::string tsv = kUsers;
  std::replace(tsv.begin(), tsv.end(), ',', '\t');
  json tsv_join = users_join(write_file(dir.path, "users.tsv", tsv));
  tsv_join["schema"]["delimiter"] = "tab";
  // Parquet: string keys hash as the CSV's do (cat_encoding string).
  io::ParquetColumnData user, age, country;
  user.rows = age.rows = country.rows = 3;
  user.strings = {"u1", "u2", "u4"};
  age.reals = {30, 0, 50};
  age.valid = {1, 0, 1};
  country.strings = {"fr", "de", "fr"};
  const std::string pq = dir.path + "/users.parquet";
  io::write_parquet(pq,
                    {{"user", io::ParquetType::ByteArray},
                     {"age", io::ParquetType::Double},
                     {"country", io::ParquetType::ByteArray}},
                    {user, age, country});
  for (const json& join : {tsv_join, users_join(pq)}) {
    Workflow w = Workflow::from_config(config_with(json::array({join})), log_schema());
    fit_on(w, rows);
    io::Batch b;
    w.transform(rows, b);
    SCOPED_TRACE(join.at("path").get<std::string>());
    expect_joined(w, b);
  }
}

TEST(JoinExternal, ChainedAndColumnSubset) {
  TempDir dir("join_chain");
  const io::RawChunk rows = read_all_rows(write_file(dir.path, "log.csv", kLog), log_schema());
  write_file(dir.path, "users.csv", kUsers);
  write_file(dir.path, "countries.csv", "country,gdp\nfr,3\nde,4\n");
  // Only "country" from users (base_dir resolves the relative paths), then a table keyed by it.
  json users = users_join("users.csv");
  users["columns"] = {"country"};
  json countries = {{"path", "countries.csv"},
                    {"on", "country"},
                    {"schema", json::parse(R"({"format": "csv", "columns": [
                        {"name": "country", "kind": "categorical"},
                        {"name": "gdp", "kind": "dense"}]})")}};
  json cfg = {{"join_external", {users, countries}},
              {"pipeline",
               {{{"columns", json::array({"gdp"})}, {"ops", {{{"op", "FillMissing"}}}}},
                {{"columns", "@categorical"}, {"ops", {{{"op", "Categorify"}}}}}}}};
  Workflow w = Workflow::from_config(cfg, log_schema(), dir.path);
  fit_on(w, rows);
  io::Batch b;
  w.transform(rows, b);
  EXPECT_EQ(w.dense_names(), std::vector<std::string>({"gdp"}));
  EXPECT_EQ(b.dense, std::vector<float>({3, 4, 0, 0, 3}));
}

TEST(JoinExternal, BadSideTablesAreClearErrors) {
  TempDir dir("join_errors");
  const std::string users = write_file(dir.path, "users.csv", kUsers);
  auto build = [&](const json& join) {
    return [&, join] { Workflow::from_config(config_with(json::array({join})), log_schema()); };
  };
  // A duplicate key: both lines named.
  const std::string dup =
      write_file(dir.path, "dup.csv", "user,age,country\nu1,1,fr\nu2,2,de\nu1,3,it\n");
  expect_error(build(users_join(dup)),
               {"join_external[0]", "dup.csv", "duplicate key", "'user'", "line 2 and line 4"});
  // The join key is not a column of the input schema.
  json j = users_join(users);
  j["on"] = "usr";
  expect_error(build(j), {"join_external[0]", "key column 'usr'"});
  {
    json bad_side = users_join(users);
    bad_side["on"] = "country";  // in the side table, not in the input
    expect_error(build(bad_side),
                 {"join_external[0]", "join key 'country' is not a column of the input schema"});
  }
  // Cannot be read: no file, a malformed row (file, line and column named).
  expect_error(build(users_join(dir.path + "/nope.csv")), {"nope.csv", "no such file"});
  const std::string bad =
      write_file(dir.path, "bad.csv", "user,age,country\nu1,30,fr\nu2,old,de\n");
  expect_error(build(users_join(bad)), {"join_external[0]", "bad.csv", "3", "age"});
  // An empty key.
  const std::string nokey = write_file(dir.path, "nokey.csv", "user,age,country\n,30,fr\n");
  expect_error(build(users_join(nokey)), {"nokey.csv", "line 2", "key 'user' is empty"});
  // A column clash with the input.
  const std::string clash = write_file(dir.path, "clash.csv", "user,item\nu1,x\n");
  json c = {{"path", clash}, {"on", "user"}, {"schema", json::parse(R"({"format": "csv",
      "columns": [{"name": "user", "kind": "categorical"}, {"name": "item",
      "kind": "categorical"}]})")}};
  expect_error(build(c), {"column 'item'", "clashes"});
  // A label in the side table, a multi-hot key, an unknown column to keep, no schema.
  json lab = users_join(users);
  lab["schema"]["columns"][1]["kind"] = "label";
  expect_error(build(lab), {"'age' is a label"});
  json multi = users_join(users);
  multi["schema"]["columns"][0]["multi_hot"] = true;
  expect_error(build(multi), {"key column 'user' must be a one-hot categorical"});
  json keep = users_join(users);
  keep["columns"] = {"contry"};
  expect_error(build(keep), {"'contry'", "did you mean 'country'"});
  json noschema = users_join(users);
  noschema.erase("schema");
  expect_error(build(noschema), {"needs its \"schema\""});
  json enc = users_join(users);
  enc["schema"]["cat_encoding"] = "hex";
  expect_error(build(enc), {"cat_encoding differs"});
  // Unknown keys are errors naming the nearest.
  json typo = users_join(users);
  typo["colums"] = {"age"};
  expect_error(build(typo), {"colums"});
  expect_error([&] { Workflow::from_config(config_with(json::object()), log_schema()); },
               {"'join_external' must be a list"});
}

TEST(JoinExternal, TamperedEmbeddedTableIsRejected) {
  TempDir dir("join_tamper");
  const std::string users = write_file(dir.path, "users.csv", kUsers);
  const io::RawChunk rows = read_all_rows(write_file(dir.path, "log.csv", kLog), log_schema());
  Workflow w = Workflow::from_config(config_with(json::array({users_join(users)})), log_schema());
  fit_on(w, rows);
  const json good = w.to_json();
  json j = good;
  j["join_external"][0]["keys"].push_back(7);
  expect_error([&] { Workflow::from_json(j); }, {"join_external[0]", "'keys'"});
  j = good;
  j["join_external"][0]["categorical"][0]["offsets"][1] = 5;
  expect_error([&] { Workflow::from_json(j); }, {"malformed offsets"});
  j = good;
  j["join_external"][0]["keys"][1] = j["join_external"][0]["keys"][0];
  expect_error([&] { Workflow::from_json(j); }, {"duplicate key", "row 0 and row 1"});
  j = good;
  j["join_external"][0]["dense"][0]["values"][0] = "x";
  expect_error([&] { Workflow::from_json(j); }, {"non-number"});
  j = good;
  j["join_external"][0]["dense"][0]["values"][0] = 1e300;
  expect_error([&] { Workflow::from_json(j); }, {"out of float's range"});
  j = good;
  j["join_external"][0]["rows"] = -1;
  expect_error([&] { Workflow::from_json(j); }, {"rows"});
}

TEST(JoinExternal, MemoryBudgetCountsTheSideTables) {
  TempDir dir("join_budget");
  std::string text = "user,age,country\n";
  for (int i = 0; i < 20000; ++i) text += "u" + std::to_string(i) + ",1,c\n";
  const std::string users = write_file(dir.path, "users.csv", text);
  Workflow w = Workflow::from_config(config_with(json::array({users_join(users)})), log_schema());
  expect_error([&] { w.set_fit_memory(1 << 20, dir.path); },
               {"side tables (join_external)", "not spilled"});
  w.set_fit_memory(int64_t{64} << 20, dir.path);  // room enough
}

TEST(JoinExternal, RunEtlResolvesPathsBesideTheInput) {
  TempDir dir("join_run");
  write_file(dir.path, "users.csv", kUsers);
  EtlOptions o;
  o.inputs = {write_file(dir.path, "log.csv", kLog)};
  o.schema = log_schema();
  o.workflow = config_with(json::array({users_join("users.csv")}));
  o.output_dir = dir.path + "/out";
  o.valid_ratio = 0.2;
  EtlResult r = run_etl(o);
  EXPECT_EQ(r.train_rows, 4);
  EXPECT_EQ(r.valid_rows, 1);
  const json stats = read_json_file(o.output_dir + "/stats.json");
  EXPECT_EQ(stats.at("columns").at("join_external")[0].at("rows"), 3);
  const Workflow w = Workflow::load(o.output_dir + "/workflow.json");
  EXPECT_EQ(w.cat_names(), std::vector<std::string>({"user", "item", "country"}));
}

}  // namespace
}  // namespace dlrec::etl
