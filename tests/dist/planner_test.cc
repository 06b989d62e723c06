#include "dlrec/dist/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "dlrec/io/synthetic_batch.h"
#include "test_errors.h"
#include "test_files.h"

namespace dlrec::dist {
namespace {

using dlrec::testing::error_of;
using dlrec::testing::expect_error;

// The MLPerf DLRM v1 model's 26 tables on Criteo 1TB with max_ind_range 40M (issue 18).
const std::vector<int64_t>& kCriteo1TB = io::criteo_1tb_cardinalities();

constexpr int64_t kH100 = 80'000'000'000;  // bytes (80 GB)

std::vector<TableSpec> criteo_tables(int64_t dim, bool adagrad) {
  std::vector<TableSpec> t;
  for (size_t i = 0; i < kCriteo1TB.size(); ++i) {
    TableSpec s;
    s.name = "cat_" + std::to_string(i);
    s.rows = kCriteo1TB[i];
    s.dim = dim;
    s.value_bytes = 4;
    s.state_bytes_per_row = adagrad ? dim * 4 : 0;
    t.push_back(s);
  }
  return t;
}

PlannerOptions options(int ranks, int64_t memory) {
  PlannerOptions o;
  o.ranks = ranks;
  o.memory_per_rank = memory;
  o.batch_per_rank = 16384;
  o.dense_bytes = 10'000'000;
  return o;
}

// Every table is covered exactly once (rows and columns) and no rank is over its budget.
void check_plan(const Plan& p, const std::vector<TableSpec>& specs, const PlannerOptions& o) {
  ASSERT_EQ(p.tables.size(), specs.size());
  ASSERT_EQ(static_cast<int>(p.per_rank.size()), o.ranks);
  std::vector<int64_t> rank_bytes(o.ranks, 0);
  for (size_t t = 0; t < specs.size(); ++t) {
    const TablePlan& tp = p.tables[t];
    const TableSpec& s = specs[t];
    EXPECT_EQ(tp.name, s.name);
    int64_t rows = 0, cols = 0;
    for (const Shard& sh : tp.shards) {
      ASSERT_GE(sh.rank, 0);
      ASSERT_LT(sh.rank, o.ranks);
      rank_bytes[sh.rank] += sh.bytes;
      if (tp.kind == ShardingKind::RowWise) {
        EXPECT_EQ(sh.col_begin, 0);
        EXPECT_EQ(sh.col_end, s.dim);
        EXPECT_EQ(sh.rows, sh.rank < s.rows ? (s.rows - sh.rank + o.ranks - 1) / o.ranks : 0);
        rows += sh.rows;
      } else if (tp.kind == ShardingKind::ColumnWise) {
        EXPECT_EQ(sh.rows, s.rows);
        EXPECT_EQ(sh.col_begin, cols) << s.name;  // contiguous, in order
        cols = sh.col_end;
      } else {
        EXPECT_EQ(sh.rows, s.rows);
        EXPECT_EQ(sh.col_end - sh.col_begin, s.dim);
      }
    }
    switch (tp.kind) {
      case ShardingKind::Replicated:
        EXPECT_EQ(static_cast<int>(tp.shards.size()), o.ranks);
        break;
      case ShardingKind::TableWise:
        EXPECT_EQ(tp.shards.size(), 1u);
        break;
      case ShardingKind::RowWise:
        EXPECT_EQ(rows, s.rows);
        break;
      case ShardingKind::ColumnWise:
        EXPECT_EQ(cols, s.dim);
        break;
      case ShardingKind::Hybrid:  // its pieces are checked by sharded_hybrid_planner_test.cc
        break;
    }
  }
  for (int r = 0; r < o.ranks; ++r) {
    EXPECT_EQ(rank_bytes[r], p.per_rank[r].bytes);
    EXPECT_LE(p.per_rank[r].bytes, o.usable_per_rank()) << "rank " << r;
  }
}

TEST(ShardPlanner, Criteo1TBDoesNotFitOneH100) {
  const auto specs = criteo_tables(128, false);
  int64_t total = 0;
  for (const auto& s : specs) total += s.bytes();
  EXPECT_NEAR(static_cast<double>(total), 96.2e9,
              0.1e9);  // the issue's 96 GB in fp32
  const std::string e = error_of([&] { plan_sharding(specs, options(1, kH100)); });
  EXPECT_NE(e.find("sharding plan: table 'cat_"), std::string::npos) << e;
  EXPECT_NE(e.find(" GB"), std::string::npos) << e;
  EXPECT_NE(e.find("does not fit"), std::string::npos) << e;
  EXPECT_NE(e.find("all 26 tables need 96.14 GB"), std::string::npos) << e;
}

TEST(ShardPlanner, Criteo1TBWithSgdOnTwoAndFourH100) {
  const auto specs = criteo_tables(128, false);
  for (int ranks : {2, 4}) {
    const PlannerOptions o = options(ranks, kH100);
    const Plan p = plan_sharding(specs, o);
    check_plan(p, specs, o);
    // The small tables are replicated, the large ones placed whole: they fit without a split.
    int replicated = 0;
    for (const auto& t : p.tables) {
      if (t.kind == ShardingKind::Replicated) {  // replicate "auto" on the CPU engine: <= 1 MiB
        ++replicated;
        EXPECT_NE(t.why.find("bytes (values + state) <= 1048576 (replicate: auto"),
                  std::string::npos)
            << t.why;
      }
      EXPECT_NE(t.kind, ShardingKind::RowWise);
    }
    EXPECT_GE(replicated, 10);  // 3, 4, 10, 14, 36, 63, 108, 155, 976, 1543 rows
    // Memory is balanced: no rank above 60 % of the usable memory with 2 ranks (96 / 2 / 72).
    for (const RankLoad& l : p.per_rank)
      EXPECT_LT(static_cast<double>(l.bytes), (ranks == 2 ? 0.75 : 0.5) * o.usable_per_rank());
    std::ostringstream os;
    print_plan(p, specs, os);
    if (ranks == 2) std::cout << os.str();  // the plan the issue asks to report
    EXPECT_NE(os.str().find("rank " + std::to_string(ranks - 1) + ": memory"), std::string::npos)
        << os.str();
    EXPECT_NE(os.str().find("cat_19"), std::string::npos);
  }
}

TEST(ShardPlanner, Criteo1TBWithAdagradNeedsFourH100) {
  const auto specs = criteo_tables(128, true);
  const std::string e2 = error_of([&] { plan_sharding(specs, options(2, kH100)); });
  EXPECT_NE(e2.find("does not fit"), std::string::npos) << e2;
  EXPECT_NE(e2.find("192."), std::string::npos) << e2;  // 192 GB with the Adagrad state
  const PlannerOptions o = options(4, kH100);
  const Plan p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  std::ostringstream os;
  print_plan(p, specs, os);
  std::cout << os.str();
  // Placed whole, two of the five ~40 GB tables would share a rank (66 GB); the planner splits one
  // so that no rank holds more than 1.25x the mean.
  int64_t most = 0, sum = 0;
  for (const RankLoad& l : p.per_rank) most = std::max(most, l.bytes), sum += l.bytes;
  EXPECT_LE(static_cast<double>(most), o.max_memory_imbalance * static_cast<double>(sum) / 4);
  EXPECT_NE(os.str().find("4 rank(s)"), std::string::npos) << os.str();
}

// The CUDA engine's plan (plan_gpu_tables): every table whole on one GPU, the GPU's budget the
// smaller of the configured and the free memory, less dense parameters and exchange buffers.
TEST(ShardPlannerGpu, Criteo1TBPlacesEveryTableWholeOnTwoAndFourGpus) {
  // The exchange of the MLPerf DLRM at 55,296 rows per GPU, bf16 rows, f32 gradients.
  const int64_t xb4 = gpu_exchange_bytes(4, 55296, 26, 26, 128, 1.0, 2, 4);
  EXPECT_GT(xb4, 1'000'000'000);  // [G, K, dim] on an owner of every table: GBs
  EXPECT_LT(xb4, 10'000'000'000);
  // An H100 "80GB" has 81,559 MiB (85.5 GB decimal): about 84.5 GB free after the dense part,
  // so the configured 80 GB is the budget. SGD on 2 and 4, Adagrad (192 GB) on 4: every table
  // whole (Adagrad: the fullest GPU holds a 39.5 GB and a 26.3 GB table, 65.7 GB).
  struct Case {
    bool adagrad;
    int ranks;
    int64_t free;
  };
  for (const Case& c : {Case{false, 2, 84'500'000'000}, Case{false, 4, 84'500'000'000},
                        Case{true, 4, 84'500'000'000}}) {
    const auto specs = criteo_tables(128, c.adagrad);
    PlannerOptions o = options(c.ranks, kH100);
    o.replicate_auto = false;  // the memory plan alone (the cost rule: the test below)
    o.replicate_max_bytes = 0;
    GpuMemory m;
    m.free_bytes = c.free;
    m.dense_bytes = 30'000'000;
    m.exchange_bytes = gpu_exchange_bytes(c.ranks, 55296, 26, 26, 128, 1.0, 2, 4);
    const Plan p = plan_gpu_tables(specs, o, m);
    int64_t sum = 0;
    for (size_t t = 0; t < specs.size(); ++t) {
      EXPECT_EQ(p.tables[t].kind, ShardingKind::TableWise) << specs[t].name;
      sum += specs[t].bytes();
    }
    const int64_t usable =
        static_cast<int64_t>(static_cast<double>(std::min(c.free, kH100)) * 0.9) - m.dense_bytes -
        m.exchange_bytes;
    int64_t placed = 0;
    for (const RankLoad& l : p.per_rank) {
      EXPECT_LE(l.bytes, usable);
      placed += l.bytes;
    }
    EXPECT_EQ(placed, sum);  // nothing replicated: each table on one GPU only
    std::ostringstream os;
    print_plan(p, specs, os);
    if (c.adagrad) std::cout << os.str();
  }
}

// Adagrad on 4 GPUs with 72 GB free each: five ~40 GB tables, and no GPU can take one of them
// beside the 26.3 GB one; whole tables cannot fit, so the GPU planner splits tables by rows
// (never by columns: the GPUs have no column-wise tables) into contiguous ranges, each with one
// zero row more, and every GPU's load stays within its budget.
TEST(ShardPlannerGpu, Criteo1TBWithAdagradOnFourSmallerGpusSplitsTablesByRows) {
  const auto specs = criteo_tables(128, true);
  GpuMemory m;
  m.free_bytes = 72'000'000'000;
  m.exchange_bytes = gpu_exchange_bytes(4, 55296, 26, 26, 128, 1.0, 2, 4);
  const PlannerOptions o = options(4, kH100);
  const Plan p = plan_gpu_tables(specs, o, m);
  int row_wise = 0;
  for (size_t t = 0; t < specs.size(); ++t) {
    const TablePlan& tp = p.tables[t];
    // The small tables are replicated by the cost rule (16,384 rows per GPU here).
    EXPECT_TRUE(tp.kind == ShardingKind::TableWise || tp.kind == ShardingKind::RowWise ||
                (tp.kind == ShardingKind::Replicated && specs[t].rows < 65536))
        << specs[t].name << " is " << sharding_kind_name(tp.kind);
    if (tp.kind != ShardingKind::RowWise) continue;
    ++row_wise;
    ASSERT_EQ(tp.shards.size(), 4u);
    int64_t rows = 0;
    for (const Shard& sh : tp.shards) {
      EXPECT_EQ(sh.rows, gpu_row_range_rows(specs[t].rows, 4, sh.rank));
      EXPECT_EQ(sh.col_begin, 0);
      EXPECT_EQ(sh.col_end, specs[t].dim);
      rows += sh.rows;
    }
    EXPECT_EQ(rows, specs[t].rows) << specs[t].name;
  }
  EXPECT_GE(row_wise, 1);
  const int64_t usable = static_cast<int64_t>(72'000'000'000 * 0.9) - m.exchange_bytes;
  for (const RankLoad& l : p.per_rank) EXPECT_LE(l.bytes, usable);
  std::ostringstream os;
  print_plan(p, specs, os);
  EXPECT_NE(os.str().find("row_wise"), std::string::npos) << os.str();
}

// A table larger than one GPU's share is planned row-wise on the GPUs (it was an error before
// the GPUs had row-wise tables), in contiguous ranges of rows.
TEST(ShardPlannerGpu, ATableLargerThanOneGpuIsPlannedRowWise) {
  std::vector<TableSpec> specs(2);
  specs[0] = {"big", 3125, 128, 4, 0, true, 0};   // 1.6 MB
  specs[1] = {"small", 100, 128, 4, 0, true, 0};  // 51 kB
  PlannerOptions o;
  o.ranks = 2;
  o.memory_per_rank = 1'000'000;
  o.headroom = 0;
  const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
  ASSERT_EQ(p.tables[0].kind, ShardingKind::RowWise);  // the CPU planner splits it by columns
  ASSERT_EQ(p.tables[0].shards.size(), 2u);
  EXPECT_EQ(p.tables[0].shards[0].rows, 1562);  // [0, 1562) and [1562, 3125)
  EXPECT_EQ(p.tables[0].shards[1].rows, 1563);
  EXPECT_EQ(p.tables[0].shards[1].bytes, 1564 * 128 * 4);  // with the zero row
  EXPECT_EQ(p.tables[1].kind, ShardingKind::TableWise);
  for (const RankLoad& l : p.per_rank) EXPECT_LE(l.bytes, 1'000'000);
  // Four GPUs: the ranges cover the table, sizes floor or ceil of rows / 4.
  EXPECT_EQ(gpu_row_range_rows(3125, 4, 0) + gpu_row_range_rows(3125, 4, 1) +
                gpu_row_range_rows(3125, 4, 2) + gpu_row_range_rows(3125, 4, 3),
            3125);
  // Half a GPU each is not enough for a 1.6 MB table split in two: the error names it.
  o.memory_per_rank = 700'000;
  expect_error([&] { plan_gpu_tables(specs, o, GpuMemory{}); },
               {"sharding plan: table 'big' (3125 x 128) needs 1.60 MB",
                "does not fit even split by rows over 2 GPU(s)", "sharding.memory_per_rank_gb"});
}

TEST(ShardPlannerGpu, APlanThatCannotFitNamesTheTableAndItsBytes) {
  const auto specs = criteo_tables(128, false);
  GpuMemory m;
  m.exchange_bytes = 2'000'000'000;
  // One GPU: cat_19 (39,979,771 x 128 fp32) alone is 20.47 GB; all tables 96 GB.
  expect_error([&] { plan_gpu_tables(specs, options(1, kH100), m); },
               {"sharding plan: table 'cat_", "does not fit", "96.14 GB", "on the GPUs"});
  // Four GPUs with 20 GB free each (16 GB for tables): 64 GB for 96 GB of tables.
  m.free_bytes = 20'000'000'000;
  expect_error([&] { plan_gpu_tables(specs, options(4, kH100), m); },
               {"sharding plan: table 'cat_", "does not fit", "free device memory",
                "2.00 GB of exchange buffers"});
  // Two GPUs with 10 GB free (7 GB for tables): cat_19 split in two is 10.2 GB per GPU.
  m.free_bytes = 10'000'000'000;
  expect_error([&] { plan_gpu_tables(specs, options(2, kH100), m); },
               {"table 'cat_19' (39979771 x 128) needs 20.47 GB",
                "does not fit even split by rows over 2 GPU(s)", "free device memory"});
  // Overrides: row-wise, column-wise and hybrid run on the GPUs.
  PlannerOptions o = options(2, kH100);
  o.overrides["cat_2"] = TableOverride{ShardingKind::RowWise, -1};
  o.overrides["cat_0"] = TableOverride{ShardingKind::ColumnWise, -1};
  const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
  EXPECT_EQ(p.tables[2].kind, ShardingKind::RowWise);
  EXPECT_TRUE(p.tables[2].overridden);
  EXPECT_EQ(p.tables[0].kind, ShardingKind::ColumnWise);
  EXPECT_EQ(p.tables[0].shards.size(), 2u);
  // Hybrid needs F (or the ids' frequency summary) and F within [1, rows - 1].
  o.overrides["cat_9"] = TableOverride{ShardingKind::Hybrid, -1};
  expect_error(
      [&] { plan_gpu_tables(specs, o, GpuMemory{}); },
      {"sharding.tables.cat_9: a hybrid table on the GPUs needs \"frequent_rows\"", "stats.json"});
  o.overrides["cat_9"].frequent_rows = specs[9].rows;
  expect_error([&] { plan_gpu_tables(specs, o, GpuMemory{}); },
               {"sharding.tables.cat_9.frequent_rows: 38532951 is out of range", "[1, 38532950]"});
}

// A hybrid override on the GPUs: the table placed on one GPU, which serves its ids >= F; every
// GPU holds the prefix [0, F) and one zero row, the owner the rest and one zero row more.
TEST(ShardPlannerGpu, HybridOverrideKeepsThePrefixOnEveryGpu) {
  const auto specs = criteo_tables(128, false);
  PlannerOptions o = options(4, kH100);
  o.overrides["cat_9"] = TableOverride{ShardingKind::Hybrid, -1};
  o.overrides["cat_9"].frequent_rows = 4096;
  const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
  const TablePlan& tp = p.tables[9];
  ASSERT_EQ(tp.kind, ShardingKind::Hybrid);
  EXPECT_EQ(tp.frequent_rows, 4096);
  ASSERT_GE(tp.rare_owner, 0);
  ASSERT_EQ(tp.shards.size(), 4u);
  const int64_t row = 128 * 4;
  for (const Shard& sh : tp.shards) {
    if (sh.rank == tp.rare_owner) {
      EXPECT_EQ(sh.rows, specs[9].rows);
      EXPECT_EQ(sh.bytes, (specs[9].rows + 2) * row);
    } else {
      EXPECT_EQ(sh.rows, 4096);
      EXPECT_EQ(sh.bytes, 4097 * row);
    }
    // Without a frequency summary the split of the table's ids is unknown, not zero.
    EXPECT_LT(sh.lookups, 0);
  }
  EXPECT_TRUE(p.to_json()["tables"][9]["shards"][0]["lookups"].is_null());
  std::ostringstream os;
  print_plan(p, specs, os);
  EXPECT_NE(os.str().find("unknown lookups"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("hybrid cat_9: ids [0, 4096) on every GPU, the others on GPU " +
                          std::to_string(tp.rare_owner) + "  (config)"),
            std::string::npos)
      << os.str();
}

// A column-wise override on the GPUs: pieces of 16-byte vectors of the exchange on distinct
// GPUs, together covering the columns, each with the values and Adagrad state of its columns.
TEST(ShardPlannerGpu, ColumnWiseOverrideSplitsColumns) {
  auto specs = criteo_tables(128, true);
  for (int value_bytes : {4, 2}) {
    PlannerOptions o = options(4, kH100);
    o.exchange_value_bytes = o.exchange_grad_bytes = value_bytes;
    o.overrides["cat_20"] = TableOverride{ShardingKind::ColumnWise, -1};
    const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
    check_plan(p, specs, o);
    const TablePlan& tp = p.tables[20];
    EXPECT_EQ(tp.kind, ShardingKind::ColumnWise);
    ASSERT_EQ(tp.shards.size(), 4u);
    std::vector<int> ranks;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(tp.shards[i].col_begin, 32 * static_cast<int64_t>(i));
      EXPECT_EQ(tp.shards[i].col_end, 32 * static_cast<int64_t>(i + 1));
      EXPECT_EQ(tp.shards[i].rows, kCriteo1TB[20]);
      EXPECT_EQ(tp.shards[i].bytes, kCriteo1TB[20] * 32 * (4 + 4));
      ranks.push_back(tp.shards[i].rank);
    }
    std::sort(ranks.begin(), ranks.end());
    EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3}));
    std::ostringstream os;
    print_plan(p, specs, os);
    EXPECT_NE(os.str().find("column_wise"), std::string::npos) << os.str();
    EXPECT_NE(os.str().find("cols [0, 32) of 128"), std::string::npos) << os.str();
  }
  // "pieces": 2 on 4 GPUs: two halves.
  PlannerOptions o = options(4, kH100);
  TableOverride ov{ShardingKind::ColumnWise, -1};
  ov.pieces = 2;
  o.overrides["cat_20"] = ov;
  const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
  ASSERT_EQ(p.tables[20].shards.size(), 2u);
  EXPECT_EQ(p.tables[20].shards[0].col_end, 64);
  EXPECT_EQ(p.tables[20].shards[1].col_begin, 64);
  EXPECT_NE(p.tables[20].shards[0].rank, p.tables[20].shards[1].rank);
  // The config key.
  const json cfg = json::parse(R"({"tables": {"cat_20": {"kind": "column_wise", "pieces": 3}}})");
  ConfigReader r(cfg, "sharding");
  EXPECT_EQ(read_planner_options(r, 4).overrides.at("cat_20").pieces, 3);
}

TEST(ShardPlannerGpu, BadColumnWiseOverridesAreClearErrors) {
  auto with = [](int64_t dim, int value_bytes, TableOverride ov, int ranks = 4,
                 bool splits = true) {
    std::vector<TableSpec> specs(1);
    specs[0].name = "emb.4";
    specs[0].rows = 1000;
    specs[0].dim = dim;
    specs[0].value_bytes = 4;
    specs[0].state_bytes_per_row = splits ? dim * 4 : 4;
    specs[0].state_splits_by_column = splits;
    PlannerOptions o = options(ranks, kH100);
    o.exchange_value_bytes = o.exchange_grad_bytes = value_bytes;
    o.overrides["emb.4"] = ov;
    return [specs, o] { plan_gpu_tables(specs, o, GpuMemory{}); };
  };
  const TableOverride cw{ShardingKind::ColumnWise, -1};
  expect_error(with(6, 4, cw), {"sharding.tables.emb.4.kind: \"column_wise\" on the GPUs",
                                "multiples of 4", "dim 6 is not a multiple of 4"});
  expect_error(with(4, 4, cw), {"multiples of 4", "dim 4 gives 1 piece(s)", "use table_wise"});
  expect_error(with(8, 2, cw),
               {"multiples of 8 (16-byte bf16/fp16 vectors)", "dim 8 gives 1 piece(s)"});
  TableOverride five = cw;
  five.pieces = 5;
  expect_error(with(128, 4, five), {"table 'emb.4' asks for 5 column pieces but the job has 4"});
  expect_error(with(8, 4, five), {"table 'emb.4' asks for 5 column pieces but the job has 4"});
  TableOverride three = cw;
  three.pieces = 3;
  expect_error(with(8, 4, three), {"dim 8 gives 2 piece(s), 3 asked"});
  TableOverride tw{ShardingKind::TableWise, -1};
  tw.pieces = 2;
  expect_error(with(128, 4, tw), {"table 'emb.4' gives pieces, which only column_wise takes"});
  expect_error(with(128, 4, cw, 4, false),
               {"'emb.4' cannot be split by columns", "rowwise_adagrad"});
  // "pieces": 1 is outside the config key's range.
  const json cfg = json::parse(R"({"tables": {"emb.4": {"kind": "column_wise", "pieces": 1}}})");
  ConfigReader r(cfg, "sharding");
  expect_error([&] { read_planner_options(r, 4); }, {"sharding.tables.emb.4.pieces"});
}

// The MLPerf DLRM's 26 tables on Criteo Kaggle (src/io/synthetic_batch.cc).
const std::vector<int64_t> kKaggle = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};

// replicate "auto" on the GPUs: a table is replicated when the all-reduce of its dense f32
// gradient, 2 (N - 1) / N x rows x dim x 4 bytes, is less than its exchange through the owner,
// (N - 1) / N x N x B x dim x (value + gradient bytes): at 55,296 rows per GPU in bf16 that is
// below 55,296 rows on 2 GPUs and 110,592 on 4 (fp32 exchanges 4 + 4 bytes: 110,592 on 2); the
// same with the replicas' all-reduce in bf16 (replica_reduce_bytes 2, what a bf16 run plans
// with: priced at 4 bytes a value).
TEST(ShardPlannerGpu, ReplicatesTablesWhoseAllReduceCostsLessThanTheExchange) {
  std::vector<TableSpec> specs;
  for (size_t i = 0; i < kKaggle.size(); ++i) {
    TableSpec s;
    s.name = "emb." + std::to_string(i);
    s.rows = kKaggle[i];
    s.dim = 128;
    specs.push_back(s);
  }
  struct Case {
    int ranks, bytes, reduce_bytes;
    int64_t below;
    int replicated;
  };
  // reduce_bytes 2: a bf16 run's replicas all-reduce in bf16; the rule prices them as before
  // (the same tables), their memory counts the 16-bit copy.
  for (const Case& c :
       {Case{2, 2, 4, 55296, 18}, Case{4, 2, 4, 110592, 19}, Case{2, 4, 4, 110592, 19},
        Case{2, 2, 2, 55296, 18}, Case{4, 2, 2, 110592, 19}}) {
    PlannerOptions o = options(c.ranks, kH100);
    o.batch_per_rank = 55296;
    o.exchange_value_bytes = o.exchange_grad_bytes = c.bytes;
    o.replica_reduce_bytes = c.reduce_bytes;
    const Plan p = plan_gpu_tables(specs, o, GpuMemory{});
    check_plan(p, specs, o);
    int replicated = 0;
    for (size_t t = 0; t < specs.size(); ++t) {
      const TablePlan& tp = p.tables[t];
      const ReplicationCost cost = replication_cost(specs[t], o);
      EXPECT_EQ(tp.kind == ShardingKind::Replicated, specs[t].rows < c.below) << tp.name;
      EXPECT_EQ(tp.kind == ShardingKind::Replicated, cost.priced < cost.exchange) << tp.name;
      EXPECT_DOUBLE_EQ(cost.all_reduce, cost.priced * c.reduce_bytes / 4) << tp.name;
      if (tp.kind != ShardingKind::Replicated) {
        EXPECT_TRUE(tp.why.empty());
        continue;
      }
      ++replicated;
      EXPECT_NE(tp.why.find("gradient all-reduce"), std::string::npos) << tp.why;
      ASSERT_EQ(static_cast<int>(tp.shards.size()), c.ranks);
      for (const Shard& sh : tp.shards)  // values + the dense f32 gradient (+ its bf16 copy)
        EXPECT_EQ(sh.bytes, specs[t].rows * 128 * (4 + 4 + (c.reduce_bytes == 2 ? 2 : 0)));
    }
    EXPECT_EQ(replicated, c.replicated);
    std::ostringstream os;
    print_plan(p, specs, os);
    EXPECT_NE(os.str().find("replicated emb.8: gradient all-reduce"), std::string::npos)
        << os.str();
  }
  // The sides of the rule for emb.12 (12,517 rows) on 2 GPUs in bf16.
  PlannerOptions o = options(2, kH100);
  o.batch_per_rank = 55296;
  o.exchange_value_bytes = o.exchange_grad_bytes = 2;
  const ReplicationCost c = replication_cost(specs[6], o);
  EXPECT_DOUBLE_EQ(c.all_reduce, 12517.0 * 128 * 4);
  EXPECT_DOUBLE_EQ(c.priced, 12517.0 * 128 * 4);
  EXPECT_DOUBLE_EQ(c.exchange, 0.5 * 110592 * 128 * 4);
  o.replica_reduce_bytes = 2;  // the bf16 all-reduce: priced as f32 (its dense pass)
  EXPECT_DOUBLE_EQ(replication_cost(specs[6], o).all_reduce, 12517.0 * 128 * 2);  // sent
  EXPECT_DOUBLE_EQ(replication_cost(specs[6], o).priced, 12517.0 * 128 * 4);
  o.replica_reduce_bytes = 3;
  expect_error([&] { plan_gpu_tables(specs, o, GpuMemory{}); },
               {"bytes per exchanged value must be 2 or 4, got 3"});
  o.replica_reduce_bytes = 4;
  // A size instead of auto: tables up to that many bytes (values + state), on the GPUs too.
  o.replicate_auto = false;
  o.replicate_max_bytes = 0;
  for (const TablePlan& tp : plan_gpu_tables(specs, o, GpuMemory{}).tables)
    EXPECT_EQ(tp.kind, ShardingKind::TableWise) << tp.name;
  o.replicate_max_bytes = 1000 * 128 * 4;
  int small = 0;
  for (const TablePlan& tp : plan_gpu_tables(specs, o, GpuMemory{}).tables)
    small += tp.kind == ShardingKind::Replicated;
  EXPECT_EQ(small, 11);  // 583, 305, 24, 633, 3, 27, 10, 4, 18, 15 and 105 rows
  // The replicas take at most half of a GPU's memory for tables: with 20 MB per GPU for
  // tables, the smallest cheap ones only.
  o.replicate_auto = true;
  o.memory_per_rank = 40'000'000;
  o.headroom = 0;
  GpuMemory dense;
  dense.dense_bytes = 20'000'000;
  std::vector<TableSpec> few(specs.begin(), specs.begin() + 9);
  few.erase(few.begin() + 2, few.begin() + 4);  // the two large tables out
  const Plan q = plan_gpu_tables(few, o, dense);
  int64_t replica_bytes = 0;
  for (const TablePlan& tp : q.tables)
    if (tp.kind == ShardingKind::Replicated) replica_bytes += tp.shards[0].bytes;
  EXPECT_GT(replica_bytes, 0);
  EXPECT_LE(replica_bytes, 10'000'000);
  EXPECT_EQ(q.tables[4].kind, ShardingKind::TableWise);  // emb.6, 12,517 rows: 12.8 MB replicated
  // A replicated override is taken on the GPUs.
  o = options(2, kH100);
  o.overrides["emb.2"] = TableOverride{ShardingKind::Replicated, -1};
  const Plan r = plan_gpu_tables(specs, o, GpuMemory{});
  EXPECT_EQ(r.tables[2].kind, ShardingKind::Replicated);
  EXPECT_TRUE(r.tables[2].overridden);
  EXPECT_TRUE(r.tables[2].why.empty());
}

TEST(ShardPlanner, OneRankPlacesEverythingWhole) {
  const auto specs = criteo_tables(16, false);  // 12 GB: fits one rank
  const PlannerOptions o = options(1, kH100);
  const Plan p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  for (const auto& t : p.tables) {
    EXPECT_EQ(t.kind, ShardingKind::TableWise);
    EXPECT_EQ(t.owner(), 0);
  }
}

TEST(ShardPlanner, SplitsATableLargerThanOneRank) {
  // Table "big" needs 1.6 MB, a rank has 1 MB: it is split; by columns when the dim allows.
  std::vector<TableSpec> specs(2);
  specs[0] = {"big", 3125, 128, 4, 0, true, 0};   // 1.6 MB
  specs[1] = {"small", 100, 128, 4, 0, true, 0};  // 51 kB
  PlannerOptions o;
  o.ranks = 2;
  o.memory_per_rank = 1'000'000;
  o.headroom = 0;
  o.replicate_max_bytes = 0;
  Plan p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  EXPECT_EQ(p.tables[0].kind, ShardingKind::ColumnWise);
  EXPECT_EQ(p.tables[0].shards.size(), 2u);
  EXPECT_EQ(p.tables[1].kind, ShardingKind::TableWise);
  // Row-wise Adagrad keeps one value per row: no column split, rows instead.
  specs[0].state_bytes_per_row = 4;
  specs[0].state_splits_by_column = false;
  p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  EXPECT_EQ(p.tables[0].kind, ShardingKind::RowWise);
  // A narrow table is split by rows too.
  specs[0] = {"big", 25000, 16, 4, 0, true, 0};
  p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  EXPECT_EQ(p.tables[0].kind, ShardingKind::RowWise);
}

TEST(ShardPlanner, BalancesLookups) {
  // Four equal tables, two of them hot: each rank gets one hot one.
  std::vector<TableSpec> specs;
  for (int i = 0; i < 4; ++i)
    specs.push_back({"t" + std::to_string(i), 1000, 16, 4, 0, true, i < 2 ? 1e6 : 1.0});
  PlannerOptions o;
  o.ranks = 2;
  o.memory_per_rank = 1'000'000'000;
  o.replicate_max_bytes = 0;
  const Plan p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  EXPECT_NE(p.tables[0].owner(), p.tables[1].owner());
  EXPECT_NEAR(p.per_rank[0].lookups, p.per_rank[1].lookups, 10.0);
}

TEST(ShardPlanner, ConfigOverridesThePlan) {
  auto specs = criteo_tables(64, false);
  const json cfg = parse_json(R"({
    "memory_per_rank_gb": 80, "headroom": 0.2,
    "tables": {"cat_0": {"kind": "row_wise"}, "cat_1": {"kind": "table_wise", "owner": 2},
               "cat_2": {"kind": "column_wise"}, "cat_3": {"kind": "data_parallel"}}})",
                              "test");
  ConfigReader r(cfg, "sharding");
  PlannerOptions o = read_planner_options(r, 4);
  EXPECT_DOUBLE_EQ(o.headroom, 0.2);
  const Plan p = plan_sharding(specs, o);
  check_plan(p, specs, o);
  EXPECT_EQ(p.tables[0].kind, ShardingKind::RowWise);
  EXPECT_EQ(p.tables[1].kind, ShardingKind::TableWise);
  EXPECT_EQ(p.tables[1].owner(), 2);
  EXPECT_EQ(p.tables[2].kind, ShardingKind::ColumnWise);
  EXPECT_EQ(p.tables[2].shards.size(), 4u);
  EXPECT_EQ(p.tables[3].kind, ShardingKind::Replicated);
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(p.tables[t].overridden);
  EXPECT_FALSE(p.tables[4].overridden);
  std::ostringstream os;
  print_plan(p, specs, os);
  EXPECT_NE(os.str().find("(config)"), std::string::npos);
  // The plan as JSON names every table's kind.
  const json j = p.to_json();
  EXPECT_EQ(j["tables"][0]["kind"], "row_wise");
  EXPECT_EQ(j["tables"][1]["shards"][0]["rank"], 2);
}

TEST(ShardPlanner, BadConfigIsAClearError) {
  auto read = [](const std::string& text, int ranks) {
    const json j = parse_json(text, "test");
    ConfigReader r(j, "sharding");
    return read_planner_options(r, ranks);
  };
  expect_error([&] { read(R"({"memory_per_rank": 80})", 2); },
               {"unknown config key 'sharding.memory_per_rank'", "memory_per_rank_gb"});
  expect_error([&] { read(R"({"tables": {"cat_0": {"kind": "rows"}}})", 2); },
               {"sharding.tables.cat_0.kind"});
  expect_error([&] { read(R"({"tables": {"cat_0": {"kind": "table_wise", "ownr": 1}}})", 2); },
               {"sharding.tables.cat_0.ownr", "owner"});
  expect_error([&] { read(R"({"headroom": 1.5})", 2); }, {"sharding.headroom"});
  expect_error([&] { read(R"({"tables": [1]})", 2); }, {"sharding.tables", "object"});
  // The replication rule: "auto" or bytes; not both keys.
  EXPECT_TRUE(read("{}", 2).replicate_auto);
  EXPECT_TRUE(read(R"({"replicate": "auto"})", 2).replicate_auto);
  const PlannerOptions sized = read(R"({"replicate": 4096})", 2);
  EXPECT_FALSE(sized.replicate_auto);
  EXPECT_EQ(sized.replicate_max_bytes, 4096);
  EXPECT_FALSE(read(R"({"replicate_max_bytes": 0})", 2).replicate_auto);
  expect_error([&] { read(R"({"replicate": "always"})", 2); },
               {"sharding.replicate", "\"auto\" or a size in bytes", "always"});
  expect_error([&] { read(R"({"replicate": -1})", 2); }, {"sharding.replicate", "-1"});
  expect_error([&] { read(R"({"replicate": 1.5})", 2); }, {"sharding.replicate"});
  expect_error([&] { read(R"({"replicate": "auto", "replicate_max_bytes": 1})", 2); },
               {"sharding.replicate", "sharding.replicate_max_bytes", "give one"});

  const auto specs = criteo_tables(64, false);
  PlannerOptions o = options(2, kH100);
  o.overrides["cat_1"] = {ShardingKind::TableWise, 3};
  expect_error([&] { plan_sharding(specs, o); }, {"'cat_1'", "owner 3", "2 rank(s)"});
  o.overrides.clear();
  o.overrides["cat_01"] = {ShardingKind::RowWise, -1};
  expect_error([&] { plan_sharding(specs, o); },
               {"sharding.tables.cat_01", "names no table", "did you mean"});
  o.overrides.clear();
  o.overrides["cat_1"] = {ShardingKind::RowWise, 1};
  expect_error([&] { plan_sharding(specs, o); }, {"'cat_1'", "only table_wise"});
  // Column-wise with a per-row optimizer state.
  auto rw = specs;
  rw[2].state_splits_by_column = false;
  o.overrides.clear();
  o.overrides["cat_2"] = {ShardingKind::ColumnWise, -1};
  expect_error([&] { plan_sharding(rw, o); }, {"'cat_2'", "cannot be split by columns"});
  // An owner that cannot hold the table.
  o.overrides.clear();
  o.overrides["cat_0"] = {ShardingKind::TableWise, 0};
  o.memory_per_rank = 5'000'000'000;
  expect_error([&] { plan_sharding(specs, o); }, {"'cat_0'", "configured owner", "does not fit"});
  // Dense parameters larger than the budget.
  o = options(2, 1'000'000);
  o.dense_bytes = 2'000'000;
  expect_error([&] { plan_sharding(specs, o); }, {"nothing is left for tables"});
  // Bad table specs.
  auto bad = specs;
  bad[3].rows = 0;
  expect_error([&] { plan_sharding(bad, options(2, kH100)); }, {"'cat_3'", "rows and dim"});
  bad = specs;
  bad[3].name = "cat_4";
  expect_error([&] { plan_sharding(bad, options(2, kH100)); }, {"two tables", "'cat_4'"});
}

TEST(ShardPlanner, ReadsIdsPerSampleFromEtlStats) {
  dlrec::testing::TempDir tmp("planner_stats");
  const std::string path = dlrec::testing::write_file(tmp.path, "stats.json", R"({
    "format": "dlrec-stats", "version": 1, "train_rows": 4, "valid_rows": 0,
    "columns": {"rows": 4, "dense": [], "categorical": [
      {"name": "c0", "rows": 4, "nulls": 0, "multi_hot": false, "values": 4, "cardinality": 9},
      {"name": "tags", "rows": 4, "nulls": 1, "multi_hot": true, "values": 10, "cardinality": 50},
      {"name": "gone", "rows": 4, "values": 4, "dropped": true}]}})");
  const auto ids = read_ids_per_sample(path);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_DOUBLE_EQ(ids.at("c0"), 1.0);
  EXPECT_DOUBLE_EQ(ids.at("tags"), 2.5);
  dlrec::testing::write_file(tmp.path, "bad.json", R"({"format": "dlrec-stats", "columns": {
    "categorical": [{"name": "c0", "rows": "4", "values": 4}]}})");
  expect_error([&] { read_ids_per_sample(tmp.path + "/bad.json"); },
               {"bad.json", "columns.categorical[0]", "'rows'"});
  dlrec::testing::write_file(tmp.path, "other.json", "{}");
  expect_error([&] { read_ids_per_sample(tmp.path + "/other.json"); },
               {"other.json", "not a dlrec-stats file"});
  expect_error([&] { read_ids_per_sample(tmp.path + "/missing.json"); }, {"missing.json"});
}

}  // namespace
}  // namespace dlrec::dist
