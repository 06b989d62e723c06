// The CUDA engine's plan (plan_gpu_tables) and its memory estimates (include/dlrec/dist/
// planner.h, docs/DISTRIBUTED.md, "Sharding on the GPUs").
#include <algorithm>
#include <limits>
#include <map>
#include <string>

#include "dlrec/dist/planner.h"

namespace dlrec::dist {

namespace {

// Column-wise overrides on the GPUs: pieces of o.column_unit columns (16-byte vectors of the
// exchange), at least two (or the configured count) of them.
void check_gpu_column_wise(const std::vector<TableSpec>& tables, const PlannerOptions& o) {
  const int64_t unit = o.column_unit;
  const char* vec =
      o.exchange_value_bytes == 2 ? "16-byte bf16/fp16 vectors" : "16-byte fp32 vectors";
  for (const TableSpec& t : tables) {
    auto it = o.overrides.find(t.name);
    if (it == o.overrides.end() || it->second.kind != ShardingKind::ColumnWise) continue;
    if (it->second.pieces > o.ranks) continue;  // PlannerOptions::validate names it
    const int64_t want = std::max<int64_t>(2, it->second.pieces);
    if (t.dim % unit != 0)
      fail("sharding.tables.", t.name,
           ".kind: \"column_wise\" on the GPUs splits columns in "
           "multiples of ",
           unit, " (", vec, "): dim ", t.dim, " is not a multiple of ", unit,
           "; use table_wise or row_wise");
    if (t.dim / unit < want)
      fail("sharding.tables.", t.name,
           ".kind: \"column_wise\" on the GPUs splits columns in "
           "multiples of ",
           unit, " (", vec, "): dim ", t.dim, " gives ", t.dim / unit, " piece(s), ", want,
           " asked; use table_wise or row_wise");
  }
}

// The GPUs' hybrid tables (docs/DISTRIBUTED.md, "Hybrid tables on the GPUs"): a table placed
// table_wise on its owner keeps that owner for its ids >= F, and every GPU holds its prefix
// [0, F) (plus one zero row each: the prefix's and the owner's piece's). F is the override's
// frequent_rows or, with a frequency summary, hybrid_cost's choice.
void apply_gpu_hybrid(const std::vector<TableSpec>& tables, const PlannerOptions& o,
                      const std::map<std::string, int64_t>& hybrid, Plan& plan) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableSpec& s = tables[t];
    auto it = hybrid.find(s.name);
    if (it == hybrid.end()) continue;
    TablePlan& tp = plan.tables[t];
    DLREC_CHECK(tp.kind == ShardingKind::TableWise && tp.shards.size() == 1,
                "sharding: hybrid table '", s.name, "' was not placed on one GPU (bug)");
    const int owner = tp.shards[0].rank;
    static const FrequencySummary kNone;
    const auto fit = o.frequency.find(s.name);
    const FrequencySummary& freq = fit == o.frequency.end() ? kNone : fit->second;
    const double lookups =
        s.lookups_per_step > 0
            ? s.lookups_per_step
            : static_cast<double>(std::max<int64_t>(o.batch_per_rank, 1)) * std::max(o.ranks, 1);
    int64_t f = it->second;
    if (f < 0) {
      if (freq.empty())
        fail("sharding.tables.", s.name,
             ": a hybrid table on the GPUs needs \"frequent_rows\" or a frequency summary of its "
             "ids (the \"frequency\" of its column in the dataset's stats.json, `dlrec etl`)");
      f = choose_frequent_rows(s, freq, o.ranks, lookups, o.usable_per_rank());
      if (f == 0)
        fail("sharding.tables.", s.name,
             ": hybrid does not pay for this table (its frequency summary gives no prefix that "
             "sends fewer bytes than none); give \"frequent_rows\" or make it table_wise");
    }
    if (f < 1 || f >= s.rows)
      fail("sharding.tables.", s.name, ".frequent_rows: ", f,
           " is out of range for a hybrid table on the GPUs: [1, ", s.rows - 1, "] (the table has ",
           s.rows, " rows; ids >= frequent_rows are served by one GPU)");
    const int64_t row = s.rows > 0 ? s.bytes() / s.rows : 0;
    plan.per_rank[owner].bytes -= tp.shards[0].bytes;
    tp.shards.clear();
    for (int r = 0; r < plan.ranks; ++r) {
      const int64_t rows = r == owner ? s.rows : f;
      const int64_t bytes = (r == owner ? s.rows + 2 : f + 1) * row;
      Shard sh{r, rows, 0, s.dim, bytes, 0};
      const double q = freq.empty() ? 0 : freq.fraction_below(f);
      sh.lookups = freq.empty() ? -1 : lookups * (q / plan.ranks + (r == owner ? 1 - q : 0));
      tp.shards.push_back(sh);
      plan.per_rank[r].bytes += bytes;
      auto& l = plan.per_rank[r].tables;
      if (std::find(l.begin(), l.end(), static_cast<int>(t)) == l.end())
        l.push_back(static_cast<int>(t));
    }
    tp.kind = ShardingKind::Hybrid;
    tp.overridden = true;
    tp.rare_owner = owner;
    tp.frequent_rows = f;
    tp.frequent_fraction = freq.empty() ? -1 : freq.fraction_below(f);
    if (!freq.empty()) {
      const HybridCost c = hybrid_cost(s, freq, o.ranks, lookups, f);
      tp.allreduce_bytes = c.allreduce_bytes;
      tp.exchange_bytes = c.exchange_bytes;
      tp.unsplit_exchange_bytes = hybrid_cost(s, freq, o.ranks, lookups, 0).exchange_bytes;
    }
  }
}

}  // namespace

Plan plan_gpu_tables(const std::vector<TableSpec>& tables, PlannerOptions o, const GpuMemory& m) {
  // Replicas all-reduce a dense gradient (f32, held beside the table; a 16-bit copy of it in
  // bf16 runs): auto is the cost rule.
  o.replicate_by_cost = o.replicate_auto;
  o.replica_grad_bytes = o.replica_reduce_bytes == 4 ? 4 : 4 + o.replica_reduce_bytes;
  o.max_memory_imbalance = std::numeric_limits<double>::max();
  o.min_column_dim = int64_t{1} << 40;  // splits to fit are row-wise (column-wise: config only)
  o.column_unit = 16 / o.exchange_value_bytes;  // one 16-byte vector of the exchange
  o.auto_hybrid = false;                        // not on the GPUs yet
  const int64_t configured = o.memory_per_rank;
  if (m.free_bytes > 0) o.memory_per_rank = std::min(o.memory_per_rank, m.free_bytes);
  o.dense_bytes = m.dense_bytes + m.exchange_bytes;
  const std::string budget =
      format_bytes(static_cast<double>(o.memory_per_rank)) + " per GPU (" +
      (m.free_bytes > 0 && m.free_bytes < configured ? "free device memory"
                                                     : "sharding.memory_per_rank_gb") +
      ") less " + std::to_string(static_cast<int>(o.headroom * 100 + 0.5)) + " % headroom, " +
      format_bytes(static_cast<double>(m.dense_bytes)) + " of dense parameters and " +
      format_bytes(static_cast<double>(m.exchange_bytes)) + " of exchange buffers";
  // Hybrid overrides: placed as table_wise tables (their owner serves the ids >= F), then
  // made hybrid (apply_gpu_hybrid).
  std::map<std::string, int64_t> hybrid;
  for (auto& [name, ov] : o.overrides)
    if (ov.kind == ShardingKind::Hybrid) {
      hybrid[name] = ov.frequent_rows;
      ov = TableOverride{};
      ov.kind = ShardingKind::TableWise;
    }
  check_gpu_column_wise(tables, o);
  // A table whose rows split over every GPU still do not fit: named with what it needs.
  const int n = std::max(o.ranks, 1);
  auto share_of = [&](const TableSpec& t) {
    return ((t.rows + n - 1) / n + 1) * (t.rows > 0 ? t.bytes() / t.rows : 0);
  };
  const TableSpec* widest = nullptr;  // the table with the largest row-wise share
  for (const TableSpec& t : tables)
    if (!widest || share_of(t) > share_of(*widest)) widest = &t;
  if (widest && share_of(*widest) > o.usable_per_rank()) {
    const TableSpec& t = *widest;
    const int64_t share = share_of(t);
    fail("sharding plan: table '", t.name, "' (", t.rows, " x ", t.dim, ") needs ",
         format_bytes(static_cast<double>(t.bytes())),
         " (values and optimizer state) and does not fit even split by rows over ", n, " GPU(s) (",
         format_bytes(static_cast<double>(share)), " each): a GPU has ",
         format_bytes(static_cast<double>(std::max<int64_t>(o.usable_per_rank(), 0))),
         " for tables (", budget, ")");
  }
  Plan plan;
  try {
    plan = plan_sharding(tables, o);
  } catch (const Error& e) {
    fail(e.what(), " [on the GPUs: ", budget, "]");
  }
  // The GPUs split a row-wise table into contiguous row ranges (gpu_row_range), each with one
  // more row (a zero row the ids of other ranges are pooled from): the shards and the GPUs'
  // loads as allocated, checked against the budget again.
  for (size_t t = 0; t < tables.size(); ++t) {
    TablePlan& tp = plan.tables[t];
    if (tp.kind != ShardingKind::RowWise) continue;
    const int64_t per_row = tables[t].rows > 0 ? tables[t].bytes() / tables[t].rows : 0;
    for (Shard& sh : tp.shards) {
      const int64_t rows = gpu_row_range_rows(tables[t].rows, plan.ranks, sh.rank);
      const int64_t bytes = (rows + 1) * per_row;
      plan.per_rank[sh.rank].bytes += bytes - sh.bytes;
      sh.rows = rows;
      sh.bytes = bytes;
    }
  }
  apply_gpu_hybrid(tables, o, hybrid, plan);
  for (int r = 0; r < plan.ranks; ++r)
    DLREC_CHECK(plan.per_rank[r].bytes <= o.usable_per_rank(), "sharding plan: GPU ", r, " needs ",
                format_bytes(static_cast<double>(plan.per_rank[r].bytes)),
                " for its tables and row ranges and has ",
                format_bytes(static_cast<double>(o.usable_per_rank())), " (", budget, ")");
  return plan;
}

int64_t gpu_row_range_rows(int64_t rows, int ranks, int rank) {
  return rows * (rank + 1) / ranks - rows * rank / ranks;
}

int64_t gpu_exchange_bytes(int ranks, int64_t batch_per_rank, int64_t tables, int64_t owned,
                           int64_t dim, double ids_per_sample, int act_bytes, int grad_bytes) {
  const double n = ranks, B = static_cast<double>(std::max<int64_t>(batch_per_rank, 1));
  const double T = static_cast<double>(tables), G = n * B, K = static_cast<double>(owned);
  const double ids = G * T * std::max(ids_per_sample, 1.0);
  double b = 0;
  b += 4 * (n * (T * B + 1)) + 4 * ids;         // every rank's offsets and ids
  b += 4 * (T * G + 1) + 4 * ids;               // the global bags (offsets, ids)
  b += (4 + 8) * T * G;                         // their lengths and sources (scratch)
  b += 4 * (K * G + 1) + 4 * ids;               // the owner's bags
  b += K * G * dim * (act_bytes + grad_bytes);  // pooled rows and their gradients (owner)
  b += B * T * dim * (act_bytes + grad_bytes);  // received rows, gradients sent
  b += 32 * ids;                                // the fused update's sort and runs (estimate)
  b += 4 * (T * B + 1) + 4 * ids / n;           // own ids compacted to the tables that travel
  b += 32 * ids / n;                            // the replicated tables' own sort (their scratch)
  return static_cast<int64_t>(b);
}

}  // namespace dlrec::dist
