// The sharding planner: which rank holds which part of each embedding table.
//
// Given the tables (rows, dim, bytes per value, optimizer state per row, expected lookups per
// step), the number of ranks and each rank's memory budget, plan_sharding() chooses per table one
// of four kinds and places its shards (a fifth, hybrid, is applied on top of that placement by
// apply_hybrid, below):
//
//   kind         shards                          forward exchange (ids out, pooled back)
//   replicated   the whole table on every rank   none: each rank pools its own samples; the
//                                                backward all-gathers ids and pooled gradients
//                                                so that every rank applies the same update
//   table_wise   the whole table on one rank     ids to the owner, pooled [B, dim] back
//   row_wise     rows split over every rank:     each id to rank id % N (local row id / N),
//                rank r holds ids r, r+N, ...    partial sums [B, dim] back from every rank
//   column_wise  columns split over ranks        every id to every column owner, each sends
//                (contiguous, multiples of 4)    back its [B, cols] slice
//
// Row-wise buckets ids by modulo, not by contiguous blocks: after Categorify the frequent ids are
// the small ones, so blocks would send most lookups of a power-law feature to rank 0.
//
// How the plan is chosen (plan_sharding):
//   1. tables with an override take the kind (and owner) the config gives;
//   2. replicated tables (with one rank everything is table-wise), by `replicate`: a table of
//      at most `replicate_max_bytes` (values + optimizer state); or with the cost rule (the
//      GPUs' "auto", plan_gpu_tables) a table whose gradient all-reduce moves fewer bytes per
//      step than its pooled rows' exchange (replication_cost), smallest first while the
//      replicas take at most half of a rank's memory for tables;
//   3. the rest are placed table-wise, largest first, each on the rank where the larger of its
//      memory fraction and its lookup fraction after placement is smallest (LPT scheduling);
//   4. while a table does not fit on any rank, the largest table still placed whole is split
//      (column-wise when its dim gives every rank at least `min_column_dim` columns and the
//      optimizer's state is per value, else row-wise) and step 3 is redone;
//   5. when every table is split and one still does not fit, the plan fails naming the table,
//      the bytes it needs and what the ranks have left;
//   6. while the fullest rank holds more than `max_memory_imbalance` times the mean, the
//      largest table placed whole on it is split too, if that makes the fullest rank lighter
//      (whole tables cost the least communication, so they are split only to fit or balance).
// Memory per rank = budget * (1 - headroom) - dense_bytes (the replicated dense layers, their
// gradients and optimizer state), checked against every shard's values + optimizer state.
//
// Units: bytes are bytes (decimal GB in messages, as GPU memory is sold); lookups are ids per
// global step (over all ranks).
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "dlrec/core/config.h"

namespace dlrec::dist {

// Hybrid (planner_hybrid.cc): ids [0, F) replicated on every rank with their gradients
// all-reduced, ids >= F split by rows over every rank (rank (id - F) % N).
enum class ShardingKind { Replicated, TableWise, RowWise, ColumnWise, Hybrid };
// "replicated" | "table_wise" | "row_wise" | "column_wise" | "hybrid" ("data_parallel" is
// accepted for "replicated").
ShardingKind parse_sharding_kind(const std::string& s);
const char* sharding_kind_name(ShardingKind k);

// How often a table's ids occur in the training data, from the ETL (Categorify numbers the
// vocabulary by descending count, ties by key, so the frequent ids are a prefix of the id range):
// values_below[i] of the table's `values` training lookups have an id below ids[i] (ids
// ascending, values_below non-decreasing, the last at most `values`). Empty: unknown.
// PlannerOptions::frequency holds them by table name.
struct FrequencySummary {
  std::vector<int64_t> ids;
  std::vector<int64_t> values_below;
  int64_t values = 0;
  bool empty() const { return ids.empty(); }
  // The fraction of lookups with an id below `f` (exact at the summary's bounds, linear between).
  double fraction_below(int64_t f) const;
};

struct TableSpec {
  std::string name;
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t value_bytes = 4;          // bytes per value (4 fp32, 2 bf16/fp16)
  int64_t state_bytes_per_row = 0;  // optimizer state of one row of `dim` values
  // Whether the optimizer state is per value (sgd, momentum, adagrad, adam, ftrl): such a table
  // can be split by columns. Row-wise Adagrad keeps one value per row computed over the whole
  // row, so its tables are never split by columns.
  bool state_splits_by_column = true;
  double lookups_per_step = 0;  // expected ids per global step; <= 0: uniform (one per sample)
  int64_t bytes() const;        // values + state of the whole table
};

// A config override for one table (key "sharding.tables.<name>").
struct TableOverride {
  ShardingKind kind = ShardingKind::TableWise;
  int owner = -1;              // table_wise only; -1: the planner chooses
  int64_t frequent_rows = -1;  // hybrid only: ids [0, F) replicated; -1: the planner chooses
  int64_t pieces = -1;         // column_wise only: column pieces, 2..ranks; -1: one per rank
};

struct PlannerOptions {
  int ranks = 1;
  int64_t memory_per_rank = 0;  // bytes of device (or host) memory per rank; > 0
  double headroom = 0.1;        // fraction of memory_per_rank kept free, [0, 0.9]
  int64_t dense_bytes = 0;      // replicated dense parameters + gradients + state per rank
  int64_t batch_per_rank = 0;   // samples per rank and step (communication estimate); 0: 1
  // Which tables are replicated (config key "replicate": "auto" or a size in bytes; the older
  // key "replicate_max_bytes" is the size). Auto: on the CPU engine (plan_sharding) tables up to
  // replicate_max_bytes (1 MiB; its replicas all-gather sparse gradients, which never moves
  // fewer bytes than the table-wise exchange); on the GPUs (plan_gpu_tables) the cost rule
  // (replicate_by_cost: the replicas' dense gradients are all-reduced). A size: tables up to
  // that many bytes (values + state), on both.
  bool replicate_auto = true;
  int64_t replicate_max_bytes = int64_t{1} << 20;
  bool replicate_by_cost = false;  // the cost rule (plan_gpu_tables sets it for auto)
  // The table-wise exchange's bytes per value of the pooled rows and of their gradients (the
  // GPUs: 2 and 2 in bf16/fp16 runs, 4 and 4 in fp32), the bytes per value of the replicas'
  // gradient all-reduce (the GPUs: 2 in bf16 runs, 4 in fp32; the memory of the 16-bit copy:
  // the cost rule prices 4 either way, see replication_cost) and the bytes per value a replica
  // holds beside its values and state (plan_gpu_tables: its dense f32 gradient, 4, and in 16-bit
  // runs the rounded copy that is all-reduced, 2 more).
  int exchange_value_bytes = 4, exchange_grad_bytes = 4, replica_reduce_bytes = 4;
  int64_t replica_grad_bytes = 0;
  int64_t min_column_dim = 32;  // narrowest column shard of an auto split
  // Column pieces are multiples of this many columns (0: 4 when the dim allows, else 1;
  // plan_gpu_tables: 16 / exchange_value_bytes, one 16-byte vector of the exchange).
  int64_t column_unit = 0;
  // Step 6 of the planner: the fullest rank may hold this many times the mean table bytes
  // before the planner splits a table on it to even them out (>= 1).
  double max_memory_imbalance = 1.25;
  // Whether the planner may make a table with a frequency summary hybrid on its own (config key
  // "hybrid": "auto" | "off"); overrides apply either way.
  bool auto_hybrid = true;
  // Per table name, its ids' frequency summary (the ETL's stats.json, read_frequency_summaries):
  // what hybrid sharding needs. A table without one is never hybrid.
  std::map<std::string, FrequencySummary> frequency;
  // The same by categorical feature (index), for the CUDA engine, which names its tables itself
  // (GraphCuda::shard_tables files feature t's summary under its table "<layer>.<t>").
  std::vector<FrequencySummary> frequency_by_feature;
  std::map<std::string, TableOverride> overrides;  // by table name
  int64_t usable_per_rank() const;                 // bytes left for tables on each rank
  void validate() const;
};

// Reads the "sharding" config object:
//   { "memory_per_rank_gb": 80, "headroom": 0.1, "replicate_max_bytes": 1048576,
//     "min_column_dim": 32, "max_memory_imbalance": 1.25,
//     "tables": { "cat_3": {"kind": "table_wise", "owner": 1}, "cat_0": {"kind": "row_wise"} } }
// Ranks, dense bytes and the batch come from the job, not from this object. Unknown keys, kinds and
// out-of-range values are errors naming the key.
PlannerOptions read_planner_options(ConfigReader& r, int ranks);

// One piece of a table on one rank: `rows` rows (all of them, or for row-wise the ids rank, rank +
// N, ...) and columns [col_begin, col_end).
struct Shard {
  int rank = 0;
  int64_t rows = 0;  // rows held on this rank
  int64_t col_begin = 0, col_end = 0;
  int64_t bytes = 0;   // values + optimizer state
  // Expected ids this rank serves per global step; < 0: unknown (a GPU hybrid table without a
  // frequency summary: how its ids divide between the prefix and the owner is not known).
  double lookups = 0;
};

struct TablePlan {
  std::string name;
  ShardingKind kind = ShardingKind::TableWise;
  bool overridden = false;
  std::string why;            // why the planner replicated it (empty otherwise)
  std::vector<Shard> shards;  // replicated: one per rank; table_wise: one; else one per rank
  // Hybrid: the replicated id prefix [0, frequent_rows) and the expected bytes one rank sends
  // per step for the table: the all-reduce of the prefix's gradients and the exchange of the
  // rest (and, for the record, the exchange the table would cost with frequent_rows = 0).
  int64_t frequent_rows = 0;
  double frequent_fraction = 0;  // of the table's lookups, by the frequency summary
  double allreduce_bytes = 0, exchange_bytes = 0, unsplit_exchange_bytes = 0;
  // The GPUs' hybrid tables (plan_gpu_tables): the rank that holds and serves the ids >= F
  // (every rank holds the prefix); -1 otherwise.
  int rare_owner = -1;
  // Rank owning the table (table_wise), else -1.
  int owner() const { return kind == ShardingKind::TableWise ? shards.at(0).rank : -1; }
};

struct RankLoad {
  int64_t bytes = 0;        // tables and their optimizer state
  int64_t usable = 0;       // budget after headroom and dense parameters
  double lookups = 0;       // expected ids served per global step
  double comm_bytes = 0;    // estimated bytes this rank sends per step (forward + backward)
  std::vector<int> tables;  // indices into Plan::tables with a shard here
};

struct Plan {
  int ranks = 1;
  int64_t memory_per_rank = 0;
  int64_t dense_bytes = 0;
  std::vector<TablePlan> tables;  // in the order of the specs
  std::vector<RankLoad> per_rank;
  // The shard of table t on `rank` (nullptr if none).
  const Shard* shard_of(int t, int rank) const;
  // The plan as JSON (for logs and checkpoint manifests).
  json to_json() const;
};

Plan plan_sharding(const std::vector<TableSpec>& tables, const PlannerOptions& options);

// The cost rule's two sides for one table, in bytes per step: the ring all-reduce of its dense
// gradient, 2 (N - 1) / N x rows x dim x 4 (what each rank sends in f32; a bf16 run's all-reduce
// sends half that, but every GPU's dense pass over the replica costs about as much again:
// measured, bench/RESULTS.md issue 18, so `priced` counts 4 in every precision and `all_reduce`
// the bytes sent, replica_reduce_bytes a value), against the table-wise
// exchange through its owner, (N - 1) / N x G x dim x (exchange_value_bytes +
// exchange_grad_bytes) (G = N x batch_per_rank: the pooled rows it sends forward plus the
// gradients it receives backward; one pooled row per sample and table, whatever the ids per
// sample; the ids are all-gathered for every table either way). The rule replicates when
// priced < exchange.
struct ReplicationCost {
  double all_reduce = 0, exchange = 0, priced = 0;
};
ReplicationCost replication_cost(const TableSpec& table, const PlannerOptions& options);

// The plan as a table for the log: per rank its tables (kind, rows, columns, bytes, lookups) and
// its memory against the budget.
void print_plan(const Plan& plan, const std::vector<TableSpec>& tables, std::ostream& os);

// Hybrid embedding (planner_hybrid.cc, docs/DISTRIBUTED.md "Hybrid embedding").
// Expected bytes one rank sends per step for a hybrid table with the prefix [0, F) replicated:
// the ring all-reduce of the prefix's gradients (2 (N-1)/N x F x (dim + 1) floats: the gradient
// rows and a lookup count per row) and the exchange of the other lookups (8 bytes per id to its
// owner, dim floats of pooled partial sum back and dim floats of gradient out, for the
// (N-1)/N of them that live on another rank; an upper bound for bags of several ids).
struct HybridCost {
  double allreduce_bytes = 0, exchange_bytes = 0;
  double total() const { return allreduce_bytes + exchange_bytes; }
};
HybridCost hybrid_cost(const TableSpec& table, const FrequencySummary& frequency, int ranks,
                       double lookups_per_step, int64_t frequent_rows);
// The prefix F (one of the summary's bounds, or 0) that minimises hybrid_cost, with the F rows'
// values and state at most `max_bytes` per rank; 0 when no prefix sends fewer bytes than none.
int64_t choose_frequent_rows(const TableSpec& table, const FrequencySummary& frequency, int ranks,
                             double lookups_per_step, int64_t max_bytes);
// Called by plan_sharding on its placement: makes the tables with a "hybrid" override hybrid
// (their F from the config, or chosen) and, with options.auto_hybrid, every table_wise or
// row_wise table whose frequency summary (options.frequency) makes some F cheaper than its
// exchange, when its
// memory fits; updates the shards and rank loads. `lookups[t]`: table t's ids per step. Errors
// name the table: a hybrid override without a frequency summary, F out of [1, rows], a plan
// that does not fit.
void apply_hybrid(const std::vector<TableSpec>& tables, const PlannerOptions& options,
                  const std::vector<double>& lookups, std::vector<TablePlan>& plans,
                  std::vector<RankLoad>& loads);
// The frequency summary of each categorical column in an ETL output's stats.json (key
// "frequency" of columns.categorical[i], written by Categorify; missing values, id 0, added from
// "nulls"), by column name; columns without one are left out. Errors name the file and entry.
std::map<std::string, FrequencySummary> read_frequency_summaries(const std::string& stats_path);
// print_plan's lines for the hybrid tables: F, the expected all-reduce and exchange bytes per
// rank and step, and the exchange the table would cost without the replicated prefix.
void print_hybrid_tables(const Plan& plan, std::ostream& os);

// The CUDA engine's plan (docs/DISTRIBUTED.md, "Sharding on the GPUs"): every table is placed
// whole on one GPU or, when it does not fit whole, split by rows over all of them (no
// splits to balance; tables replicated by the cost rule or `replicate`), with the memory of a
// GPU taken as the smaller of memory_per_rank and `free_bytes` (the least free device memory
// over the ranks once the dense part is built; 0: unknown), less the headroom, the dense
// parameters (`dense_bytes`: weights, gradients, state) and the step's exchange buffers
// (`exchange_bytes`, gpu_exchange_bytes). A table that does not fit even split by rows over
// every GPU is an error naming the table, the bytes it needs and what a GPU has for tables.
// Row-wise tables (an automatic split to fit, or the config's "row_wise") are split into
// contiguous row ranges, GPU r holding rows [rows * r / N, rows * (r + 1) / N) of the table and
// one zero row. Column-wise tables come from the config only ("column_wise", optional "pieces"):
// pieces of column_unit = 16 / exchange_value_bytes columns (one 16-byte vector of the exchange),
// at least two; a dim that does not split so, and hybrid overrides, are errors. A replica counts
// its dense f32 gradient buffer (replica_grad_bytes = 4; 6 with replica_reduce_bytes = 2: the
// 16-bit copy too) beside its values and state.
struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t dense_bytes = 0;
  int64_t exchange_bytes = 0;
};
Plan plan_gpu_tables(const std::vector<TableSpec>& tables, PlannerOptions options,
                     const GpuMemory& memory);
// The rows of GPU `rank`'s range of a row-wise table of `rows` rows over `ranks` GPUs.
int64_t gpu_row_range_rows(int64_t rows, int ranks, int rank);
// Bytes of the table-wise exchange's buffers on one GPU for `batch_per_rank` rows per rank:
// every rank's ids and offsets, the global batch's bags, and the pooled rows and their
// gradients ([G, K, dim] on the owner, [B, T, dim] on the sample's rank) for an owner of
// `owned` of the `tables` tables; act_bytes and grad_bytes per value (2 or 4).
int64_t gpu_exchange_bytes(int ranks, int64_t batch_per_rank, int64_t tables, int64_t owned,
                           int64_t dim, double ids_per_sample, int act_bytes, int grad_bytes);

// The expected ids per sample of each categorical column, from an ETL output's stats.json
// (columns.categorical[i]: values / rows), by column name: the planner's lookups per step are
// these times the global batch. Dropped columns and columns without rows are left out. Errors
// name the file and the entry.
std::map<std::string, double> read_ids_per_sample(const std::string& stats_path);

// "1.50 GB" style (decimal units, as GPU memory is sold).
std::string format_bytes(double bytes);

}  // namespace dlrec::dist
