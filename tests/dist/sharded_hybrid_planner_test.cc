// The planner's hybrid embedding (src/dist/planner_hybrid.cc): the choice of the replicated
// prefix F from a table's frequency summary, the config override, the printout, the summary read
// from stats.json, and the bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "dlrec/dist/planner.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::dist {
namespace {

using dlrec::testing::expect_error;

// A Zipf-like summary of a table of `rows` ids: the fraction of lookups below f is
// log(1 + f) / log(1 + rows) (power law), or f / rows (uniform).
FrequencySummary summary(int64_t rows, bool power_law) {
  FrequencySummary s;
  s.values = 1'000'000'000;
  for (int64_t b = 1;; b = std::min(rows, b * 2)) {
    const double q = power_law ? std::log1p(static_cast<double>(b)) / std::log1p(double(rows))
                               : static_cast<double>(b) / static_cast<double>(rows);
    s.ids.push_back(b);
    s.values_below.push_back(static_cast<int64_t>(q * static_cast<double>(s.values)));
    if (b == rows) break;
  }
  return s;
}

TableSpec table(const std::string& name, int64_t rows, int64_t dim) {
  TableSpec t;
  t.name = name;
  t.rows = rows;
  t.dim = dim;
  t.lookups_per_step = 4 * 55296;  // one id per sample, 4 ranks of 55296 rows
  return t;
}

PlannerOptions options(int ranks) {
  PlannerOptions o;
  o.ranks = ranks;
  o.memory_per_rank = 80'000'000'000;
  o.batch_per_rank = 55296;
  o.replicate_max_bytes = 0;
  return o;
}

TEST(HybridPlanner, ChoosesAPrefixWhereTheAllReduceCostsLessThanTheExchange) {
  const std::vector<TableSpec> specs = {table("zipf", 4'000'000, 128),
                                        table("flat", 4'000'000, 128)};
  PlannerOptions o = options(4);
  o.frequency["zipf"] = summary(4'000'000, true);
  o.frequency["flat"] = summary(4'000'000, false);
  const Plan p = plan_sharding(specs, o);
  const TablePlan& z = p.tables[0];
  ASSERT_EQ(z.kind, ShardingKind::Hybrid);
  EXPECT_GT(z.frequent_rows, 0);
  EXPECT_LT(z.frequent_rows, 4'000'000);
  // The chosen F is the best of the summary's bounds, and it pays.
  const HybridCost c =
      hybrid_cost(specs[0], o.frequency["zipf"], 4, specs[0].lookups_per_step, z.frequent_rows);
  EXPECT_DOUBLE_EQ(c.allreduce_bytes, z.allreduce_bytes);
  EXPECT_LT(c.total(), z.unsplit_exchange_bytes);
  for (int64_t f : o.frequency["zipf"].ids)
    EXPECT_GE(hybrid_cost(specs[0], o.frequency["zipf"], 4, specs[0].lookups_per_step, f).total(),
              c.total() - 1e-6)
        << f;
  // A uniform table gains nothing: it stays as the planner placed it.
  EXPECT_EQ(p.tables[1].kind, ShardingKind::TableWise);
  // Every rank holds the prefix and a quarter of the rest; the loads add up.
  int64_t total = 0;
  for (const Shard& s : z.shards) {
    const int64_t rare = (4'000'000 - z.frequent_rows - s.rank + 3) / 4;
    EXPECT_EQ(s.rows, z.frequent_rows + rare);
    EXPECT_EQ(s.bytes, s.rows * 128 * 4);
    total += s.bytes;
  }
  int64_t loads = 0;
  for (const RankLoad& l : p.per_rank) loads += l.bytes;
  EXPECT_EQ(loads, total + specs[1].bytes());
  // The printout names F and the bytes.
  std::ostringstream os;
  print_plan(p, specs, os);
  EXPECT_NE(os.str().find("1 hybrid)"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("hybrid zipf: ids [0, " + std::to_string(z.frequent_rows) + ")"),
            std::string::npos)
      << os.str();
  EXPECT_NE(os.str().find("all-reduced"), std::string::npos);
  std::printf("%s", os.str().c_str());
  // "hybrid": "off", or one rank: no automatic hybrid.
  o.auto_hybrid = false;
  EXPECT_EQ(plan_sharding(specs, o).tables[0].kind, ShardingKind::TableWise);
  PlannerOptions one = options(1);
  one.frequency = o.frequency;
  EXPECT_EQ(plan_sharding(specs, one).tables[0].kind, ShardingKind::TableWise);
  // Not within memory: the prefix must fit on every rank beside the rest.
  PlannerOptions small = options(4);
  small.frequency = o.frequency;
  small.memory_per_rank = 2'000'000'000;  // 1.8 GB usable; each table is 2.05 GB
  const Plan ps = plan_sharding(specs, small);
  for (const RankLoad& l : ps.per_rank) EXPECT_LE(l.bytes, l.usable);
}

TEST(HybridPlanner, ConfigOverride) {
  const json cfg = parse_json(R"({"hybrid": "auto", "tables": {
      "a": {"kind": "hybrid", "frequent_rows": 1000}, "b": {"kind": "hybrid"}}})",
                              "test");
  ConfigReader r(cfg, "sharding");
  PlannerOptions o = read_planner_options(r, 2);
  o.memory_per_rank = 80'000'000'000;
  o.batch_per_rank = 4096;
  o.frequency["a"] = summary(100'000, true);
  o.frequency["b"] = summary(100'000, true);
  EXPECT_EQ(o.overrides["a"].kind, ShardingKind::Hybrid);
  EXPECT_EQ(o.overrides["a"].frequent_rows, 1000);
  EXPECT_EQ(o.overrides["b"].frequent_rows, -1);
  const std::vector<TableSpec> specs = {table("a", 100'000, 16), table("b", 100'000, 16)};
  const Plan p = plan_sharding(specs, o);
  EXPECT_EQ(p.tables[0].kind, ShardingKind::Hybrid);
  EXPECT_EQ(p.tables[0].frequent_rows, 1000);
  EXPECT_TRUE(p.tables[0].overridden);
  EXPECT_EQ(p.tables[1].kind, ShardingKind::Hybrid);
  EXPECT_GT(p.tables[1].frequent_rows, 0);
  EXPECT_EQ(p.to_json()["tables"][0]["frequent_rows"], 1000);
  // F may be every row (the table replicated, through the hybrid path).
  o.overrides["a"].frequent_rows = 100'000;
  EXPECT_EQ(plan_sharding(specs, o).tables[0].frequent_rows, 100'000);
}

TEST(HybridPlanner, BadInputIsAClearError) {
  const std::vector<TableSpec> specs = {table("emb.3", 1000, 16)};
  PlannerOptions o = options(2);
  o.overrides["emb.3"] = {ShardingKind::Hybrid, -1, 10};
  // No frequency summary: the ids are not known to be in frequency order.
  expect_error([&] { plan_sharding(specs, o); },
               {"table 'emb.3'", "hybrid", "no frequency summary", "stats.json"});
  o.frequency["emb.3"] = summary(1000, true);
  EXPECT_EQ(plan_sharding(specs, o).tables[0].frequent_rows, 10);
  // F out of range.
  o.overrides["emb.3"].frequent_rows = 1001;
  expect_error([&] { plan_sharding(specs, o); },
               {"sharding.tables.emb.3.frequent_rows", "1001", "[1, 1000]"});
  // frequent_rows or an owner with another kind.
  o.overrides["emb.3"] = {ShardingKind::RowWise, -1, 10};
  expect_error([&] { plan_sharding(specs, o); }, {"'emb.3'", "frequent_rows", "only hybrid"});
  o.overrides["emb.3"] = {ShardingKind::Hybrid, 1, -1};
  expect_error([&] { plan_sharding(specs, o); }, {"'emb.3'", "owner", "only table_wise"});
  // A summary that is not one.
  o.overrides["emb.3"] = {ShardingKind::Hybrid, -1, 10};
  o.frequency["emb.3"].values_below[2] = 0;
  expect_error([&] { plan_sharding(specs, o); }, {"'emb.3'", "values_below[2]", "non-decreasing"});
  // A hybrid table that does not fit.
  o.frequency["emb.3"] = summary(1000, true);
  o.memory_per_rank = 70'000;  // 63 kB usable; 10 + 495 rows of 64 bytes = 32 kB fit
  EXPECT_EQ(plan_sharding(specs, o).tables[0].kind, ShardingKind::Hybrid);
  o.overrides["emb.3"].frequent_rows = 600;  // 600 + 200 rows = 51 kB: fits
  EXPECT_EQ(plan_sharding(specs, o).tables[0].frequent_rows, 600);
  o.memory_per_rank = 55'000;  // 49.5 kB usable: does not
  expect_error([&] { plan_sharding(specs, o); },
               {"hybrid table 'emb.3'", "rank 0", "does not fit"});
  // Config keys.
  auto read = [](const char* text) {
    const json cfg = parse_json(text, "test");
    ConfigReader r(cfg, "sharding");
    return read_planner_options(r, 2);
  };
  expect_error([&] { read(R"({"tables": {"t": {"kind": "hybrid", "frequent_rows": 0}}})"); },
               {"sharding.tables.t.frequent_rows"});
  expect_error([&] { read(R"({"tables": {"t": {"kind": "hybird"}}})"); },
               {"sharding.tables.t.kind", "hybird"});
  expect_error([&] { read(R"({"hybrid": "yes"})"); }, {"sharding.hybrid", "yes"});
  expect_error(
      [&] { read(R"({"tables": {"t": {"kind": "row_wise", "frequent_rows": 5}}})").validate(); },
      {"'t'", "frequent_rows", "only hybrid"});
  // The GPUs: F below the table's rows (one GPU serves the ids >= F).
  PlannerOptions g = options(2);
  g.overrides["emb.3"] = {ShardingKind::Hybrid, -1, specs[3].rows};
  expect_error(
      [&] { plan_gpu_tables(specs, g, GpuMemory{}); },
      {"sharding.tables.emb.3.frequent_rows", "out of range for a hybrid table on the GPUs"});
}

// The GPUs' form (plan_gpu_tables): only overrides are hybrid; F from the override or, without
// it, the same choice as on the CPU from the frequency summary; the ids >= F on the GPU the
// table was placed on, which holds it whole, every other GPU its prefix.
TEST(HybridPlanner, GpuOverrideTakesFFromTheSummary) {
  const std::vector<TableSpec> specs = {table("zipf", 4'000'000, 128),
                                        table("other", 4'000'000, 128)};
  PlannerOptions o = options(4);
  o.frequency["zipf"] = summary(4'000'000, true);
  o.frequency["other"] = summary(4'000'000, true);
  o.overrides["zipf"] = {ShardingKind::Hybrid, -1, -1};
  const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
  const TablePlan& z = p.tables[0];
  ASSERT_EQ(z.kind, ShardingKind::Hybrid);
  EXPECT_EQ(p.tables[1].kind, ShardingKind::TableWise);  // a summary alone does not make it hybrid
  const int64_t cpu_f = choose_frequent_rows(specs[0], o.frequency["zipf"], 4,
                                             specs[0].lookups_per_step, o.usable_per_rank());
  EXPECT_GT(cpu_f, 0);
  EXPECT_EQ(z.frequent_rows, cpu_f);
  EXPECT_NEAR(z.frequent_fraction, o.frequency["zipf"].fraction_below(cpu_f), 1e-12);
  ASSERT_GE(z.rare_owner, 0);
  double lookups = 0;
  for (const Shard& sh : z.shards) {
    EXPECT_EQ(sh.rows, sh.rank == z.rare_owner ? 4'000'000 : cpu_f);
    lookups += sh.lookups;
  }
  EXPECT_NEAR(lookups, specs[0].lookups_per_step, 1e-6 * specs[0].lookups_per_step);
  std::ostringstream os;
  print_hybrid_tables(p, os);
  EXPECT_NE(
      os.str().find("hybrid zipf: ids [0, " + std::to_string(cpu_f) +
                    ") on every GPU, the others on GPU " + std::to_string(z.rare_owner) + " ("),
      std::string::npos)
      << os.str();
  EXPECT_NE(os.str().find("% of its lookups on every GPU"), std::string::npos) << os.str();
  // A uniform table: no prefix pays, which an override without F says.
  o.frequency["zipf"] = summary(4'000'000, false);
  expect_error([&] { plan_gpu_tables(specs, o, GpuMemory{}); },
               {"sharding.tables.zipf: hybrid does not pay for this table", "frequent_rows"});
}

TEST(HybridPlanner, ReadsTheFrequencySummaryFromEtlStats) {
  dlrec::testing::TempDir tmp("hybrid_stats");
  const std::string path = dlrec::testing::write_file(tmp.path, "stats.json", R"({
    "format": "dlrec-stats", "version": 1,
    "columns": {"rows": 10, "dense": [], "categorical": [
      {"name": "c0", "rows": 10, "nulls": 2, "values": 8, "cardinality": 5,
       "frequency": {"ids": [1, 2, 3, 4, 5], "values_below": [0, 1, 5, 7, 8], "values": 8}},
      {"name": "c1", "rows": 10, "nulls": 0, "values": 10, "cardinality": 3},
      {"name": "gone", "rows": 10, "dropped": true, "frequency": {}}]}})");
  const auto f = read_frequency_summaries(path);
  ASSERT_EQ(f.size(), 1u);
  const FrequencySummary& s = f.at("c0");
  EXPECT_EQ(s.values, 10);  // the 2 missing values are id 0
  EXPECT_EQ(s.values_below, (std::vector<int64_t>{2, 3, 7, 9, 10}));
  EXPECT_DOUBLE_EQ(s.fraction_below(3), 0.7);
  EXPECT_DOUBLE_EQ(s.fraction_below(0), 0.0);
  EXPECT_DOUBLE_EQ(s.fraction_below(99), 1.0);
  dlrec::testing::write_file(tmp.path, "bad.json", R"({"format": "dlrec-stats", "columns": {
    "categorical": [{"name": "c0", "frequency": {"ids": [2, 1], "values_below": [0, 0],
                                                 "values": 3}}]}})");
  expect_error([&] { read_frequency_summaries(tmp.path + "/bad.json"); },
               {"bad.json", "columns.categorical[0].frequency", "ascending"});
  dlrec::testing::write_file(tmp.path, "bad2.json", R"({"format": "dlrec-stats", "columns": {
    "categorical": [{"name": "c0", "frequency": {"ids": [1], "values": 3}}]}})");
  expect_error([&] { read_frequency_summaries(tmp.path + "/bad2.json"); },
               {"bad2.json", "values_below"});
}

}  // namespace
}  // namespace dlrec::dist
