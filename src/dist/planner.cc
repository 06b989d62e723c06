#include "dlrec/dist/planner.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>

#include "planner_stats.h"

namespace dlrec::dist {

ShardingKind parse_sharding_kind(const std::string& s) {
  if (s == "replicated" || s == "data_parallel") return ShardingKind::Replicated;
  if (s == "table_wise") return ShardingKind::TableWise;
  if (s == "row_wise") return ShardingKind::RowWise;
  if (s == "column_wise") return ShardingKind::ColumnWise;
  if (s == "hybrid") return ShardingKind::Hybrid;
  fail("unknown sharding kind '", s,
       "' (expected replicated, data_parallel, table_wise, row_wise, "
       "column_wise or hybrid)");
}

const char* sharding_kind_name(ShardingKind k) {
  switch (k) {
    case ShardingKind::Replicated:
      return "replicated";
    case ShardingKind::TableWise:
      return "table_wise";
    case ShardingKind::RowWise:
      return "row_wise";
    case ShardingKind::ColumnWise:
      return "column_wise";
    case ShardingKind::Hybrid:
      return "hybrid";
  }
  return "?";
}

int64_t TableSpec::bytes() const { return rows * (dim * value_bytes + state_bytes_per_row); }

int64_t PlannerOptions::usable_per_rank() const {
  return static_cast<int64_t>(static_cast<double>(memory_per_rank) * (1.0 - headroom)) -
         dense_bytes;
}

void PlannerOptions::validate() const {
  DLREC_CHECK(ranks >= 1 && ranks <= 65536, "sharding: ranks must be in [1, 65536], got ", ranks);
  DLREC_CHECK(memory_per_rank > 0, "sharding: memory_per_rank must be > 0 bytes, got ",
              memory_per_rank);
  DLREC_CHECK(headroom >= 0 && headroom <= 0.9, "sharding: headroom must be in [0, 0.9], got ",
              headroom);
  DLREC_CHECK(dense_bytes >= 0, "sharding: dense_bytes must be >= 0, got ", dense_bytes);
  DLREC_CHECK(batch_per_rank >= 0, "sharding: batch_per_rank must be >= 0");
  DLREC_CHECK(replicate_max_bytes >= 0, "sharding: replicate_max_bytes must be >= 0");
  DLREC_CHECK(min_column_dim >= 1, "sharding: min_column_dim must be >= 1");
  for (int b : {exchange_value_bytes, exchange_grad_bytes, replica_reduce_bytes})
    DLREC_CHECK(b == 2 || b == 4, "sharding: bytes per exchanged value must be 2 or 4, got ", b);
  DLREC_CHECK(max_memory_imbalance >= 1, "sharding: max_memory_imbalance must be >= 1, got ",
              max_memory_imbalance);
  DLREC_CHECK(usable_per_rank() > 0, "sharding: nothing is left for tables on a rank: ",
              format_bytes(static_cast<double>(memory_per_rank)), " with ", headroom * 100,
              " % headroom and ", format_bytes(static_cast<double>(dense_bytes)),
              " of dense parameters");
  for (const auto& [name, o] : overrides) {
    DLREC_CHECK(o.owner < ranks, "sharding: table '", name, "' has owner ", o.owner,
                " but the job has ", ranks, " rank(s)");
    DLREC_CHECK(o.owner < 0 || o.kind == ShardingKind::TableWise, "sharding: table '", name,
                "' names an owner, which only table_wise takes (kind ", sharding_kind_name(o.kind),
                ")");
    DLREC_CHECK(o.frequent_rows < 0 || o.kind == ShardingKind::Hybrid, "sharding: table '", name,
                "' gives frequent_rows, which only hybrid takes (kind ", sharding_kind_name(o.kind),
                ")");
    DLREC_CHECK(o.pieces < 0 || o.kind == ShardingKind::ColumnWise, "sharding: table '", name,
                "' gives pieces, which only column_wise takes (kind ", sharding_kind_name(o.kind),
                ")");
    DLREC_CHECK(o.pieces <= ranks, "sharding: table '", name, "' asks for ", o.pieces,
                " column pieces but the job has ", ranks, " rank(s)");
  }
  DLREC_CHECK(column_unit >= 0 && column_unit <= 1024, "sharding: column_unit must be in [0, 1024]",
              ", got ", column_unit);
}

PlannerOptions read_planner_options(ConfigReader& r, int ranks) {
  PlannerOptions o;
  o.ranks = ranks;
  const double gb = r.get_range("memory_per_rank_gb", 80.0, 1e-6, 1e6);
  o.memory_per_rank = static_cast<int64_t>(gb * 1e9);
  o.headroom = r.get_range("headroom", 0.1, 0.0, 0.9);
  // "replicate": "auto" or bytes; "replicate_max_bytes": bytes (the older key).
  if (r.has("replicate") && r.has("replicate_max_bytes"))
    fail("config keys '", r.key_path("replicate"), "' and '", r.key_path("replicate_max_bytes"),
         "' both set the replication rule: give one");
  if (r.has("replicate")) {
    const json& v = r.raw("replicate");
    if (v.is_string() && v.get<std::string>() == "auto") {
      o.replicate_auto = true;
    } else if (v.is_number_integer() && v.get<int64_t>() >= 0 &&
               v.get<int64_t>() <= (int64_t{1} << 50)) {
      o.replicate_auto = false;
      o.replicate_max_bytes = v.get<int64_t>();
    } else {
      fail("config key '", r.key_path("replicate"), "' must be \"auto\" or a size in bytes in [0, ",
           int64_t{1} << 50, "], got ", v.dump());
    }
  } else if (r.has("replicate_max_bytes")) {
    o.replicate_auto = false;
    o.replicate_max_bytes =
        r.get_int_range("replicate_max_bytes", o.replicate_max_bytes, 0, int64_t{1} << 50);
  }
  o.min_column_dim = r.get_int_range("min_column_dim", o.min_column_dim, 1, 1 << 20);
  o.max_memory_imbalance = r.get_range("max_memory_imbalance", o.max_memory_imbalance, 1.0, 1e6);
  o.auto_hybrid = r.get_choice("hybrid", "auto", {"auto", "off"}) == "auto";
  if (r.has("tables")) {
    const json& t = r.raw("tables");
    if (!t.is_object()) fail("config key '", r.key_path("tables"), "' must be an object");
    for (auto it = t.begin(); it != t.end(); ++it) {
      if (!it.value().is_object())
        fail("config key '", r.key_path("tables") + "." + it.key(), "' must be an object");
      ConfigReader tr(it.value(), r.key_path("tables") + "." + it.key());
      TableOverride ov;
      ov.kind = parse_sharding_kind(tr.get_choice(
          "kind", "table_wise",
          {"replicated", "data_parallel", "table_wise", "row_wise", "column_wise", "hybrid"}));
      ov.owner = static_cast<int>(tr.get_int_range("owner", -1, -1, 65535));
      ov.frequent_rows = tr.get_int_range("frequent_rows", -1, 1, int64_t{1} << 40);
      ov.pieces = tr.get_int_range("pieces", -1, 2, 65535);
      tr.finish();
      o.overrides[it.key()] = ov;
    }
  }
  r.finish();
  return o;
}

void fail_bad_stats(const std::string& stats_path, const std::string& why) {
  fail("'", stats_path, "': ", why, " (expected the stats.json of `dlrec etl`)");
}

const json& stats_categorical_columns(const json& stats, const std::string& stats_path) {
  if (!stats.is_object() || stats.value("format", std::string()) != "dlrec-stats")
    fail_bad_stats(stats_path, "not a dlrec-stats file");
  if (!stats.contains("columns") || !stats["columns"].is_object() ||
      !stats["columns"].contains("categorical") || !stats["columns"]["categorical"].is_array())
    fail_bad_stats(stats_path, "no columns.categorical array");
  return stats["columns"]["categorical"];
}

std::map<std::string, double> read_ids_per_sample(const std::string& stats_path) {
  const json j = read_json_file(stats_path);
  auto bad = [&](const std::string& why) -> void { fail_bad_stats(stats_path, why); };
  const json* cat = &stats_categorical_columns(j, stats_path);
  std::map<std::string, double> out;
  for (size_t i = 0; i < cat->size(); ++i) {
    const json& c = (*cat)[i];
    const std::string where = "columns.categorical[" + std::to_string(i) + "]";
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() || !c.contains("rows") ||
        !c["rows"].is_number() || !c.contains("values") || !c["values"].is_number())
      bad(where + " needs a string 'name' and numbers 'rows' and 'values'");
    const double rows = c["rows"].get<double>(), values = c["values"].get<double>();
    if (!(rows >= 0) || !(values >= 0)) bad(where + " has negative 'rows' or 'values'");
    if (c.value("dropped", false) || rows == 0) continue;
    out[c["name"].get<std::string>()] = values / rows;
  }
  return out;
}

std::string format_bytes(double b) {
  const char* unit[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (std::abs(b) >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

const Shard* Plan::shard_of(int t, int rank) const {
  for (const Shard& s : tables.at(t).shards)
    if (s.rank == rank) return &s;
  return nullptr;
}

json Plan::to_json() const {
  json j;
  j["ranks"] = ranks;
  j["memory_per_rank"] = memory_per_rank;
  j["dense_bytes"] = dense_bytes;
  json ts = json::array();
  for (const TablePlan& t : tables) {
    json jt;
    jt["name"] = t.name;
    jt["kind"] = sharding_kind_name(t.kind);
    jt["overridden"] = t.overridden;
    if (t.kind == ShardingKind::Hybrid) {
      jt["frequent_rows"] = t.frequent_rows;
      jt["allreduce_bytes"] = t.allreduce_bytes;
      jt["exchange_bytes"] = t.exchange_bytes;
    }
    json sh = json::array();
    for (const Shard& s : t.shards)
      sh.push_back({{"rank", s.rank},
                    {"rows", s.rows},
                    {"col_begin", s.col_begin},
                    {"col_end", s.col_end},
                    {"bytes", s.bytes},
                    {"lookups", s.lookups < 0 ? json(nullptr) : json(s.lookups)}});
    jt["shards"] = sh;
    ts.push_back(jt);
  }
  j["tables"] = ts;
  json rs = json::array();
  for (const RankLoad& r : per_rank)
    rs.push_back({{"bytes", r.bytes},
                  {"usable", r.usable},
                  {"lookups", r.lookups},
                  {"comm_bytes", r.comm_bytes}});
  j["per_rank"] = rs;
  return j;
}

namespace {

// The column ranges of a column-wise split into at most `k` pieces: multiples of `unit` columns
// (PlannerOptions::column_unit; 0: 4 when the dim allows it, vector width, else single columns).
std::vector<std::pair<int64_t, int64_t>> column_ranges(int64_t dim, int64_t k, int64_t unit) {
  if (unit <= 0) unit = dim % 4 == 0 ? 4 : 1;
  const int64_t units = dim / unit;
  k = std::max<int64_t>(1, std::min(k, units));
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t i = 0; i < k; ++i) r.push_back({units * i / k * unit, units * (i + 1) / k * unit});
  return r;
}

std::string describe(const TableSpec& t) {
  return detail::concat("'", t.name, "' (", t.rows, " rows x ", t.dim, ", ", t.value_bytes,
                        " bytes per value + ", t.state_bytes_per_row,
                        " bytes of optimizer state per row)");
}

// The planner's working state: rank loads and the tables' plans, rebuilt on every attempt.
class Placer {
 public:
  Placer(const std::vector<TableSpec>& specs, const PlannerOptions& o) : specs_(specs), o_(o) {
    n_ = o.ranks;
    batch_ = static_cast<double>(std::max<int64_t>(1, o.batch_per_rank));
    reset();
  }

  void reset() {
    loads_.assign(n_, RankLoad{});
    for (RankLoad& l : loads_) l.usable = o_.usable_per_rank();
    tables_.assign(specs_.size(), TablePlan{});
    for (size_t t = 0; t < specs_.size(); ++t) tables_[t].name = specs_[t].name;
  }

  double lookups(int t) const {
    const double l = specs_[t].lookups_per_step;
    return l > 0 ? l : batch_ * n_;
  }

  // Places a shard of `rows` x [c0, c1) on `rank`; false (nothing changed) if it does not fit
  // unless `force`.
  bool add(int t, int rank, int64_t rows, int64_t c0, int64_t c1, double lk, bool force) {
    const int64_t bytes = need(t, rows, c1 - c0);
    RankLoad& l = loads_[rank];
    const int64_t replica = tables_[t].kind == ShardingKind::Replicated
                                ? o_.replica_grad_bytes * rows * (c1 - c0)
                                : 0;  // a replica's dense gradient buffer (GPUs)
    if (!force && l.bytes + bytes + replica > l.usable) return false;
    l.bytes += replica;
    tables_[t].shards.push_back(Shard{rank, rows, c0, c1, bytes + replica, lk});
    l.bytes += bytes;
    l.lookups += lk;
    l.tables.push_back(t);
    return true;
  }

  // The bytes a shard of table t of `rows` x `cols` needs: the state in proportion to the columns
  // (row-wise Adagrad's one value per row is whole on every shard holding the row).
  int64_t need(int t, int64_t rows, int64_t cols) const {
    const TableSpec& s = specs_[t];
    const int64_t st = s.state_splits_by_column ? (s.state_bytes_per_row * cols + s.dim - 1) / s.dim
                                                : s.state_bytes_per_row;
    return rows * (cols * s.value_bytes + st);
  }

  [[noreturn]] void fail_fit(int t, int64_t need_bytes, const char* how) const {
    int64_t most_free = 0, total_free = 0;
    for (const RankLoad& l : loads_) {
      most_free = std::max(most_free, l.usable - l.bytes);
      total_free += l.usable - l.bytes;
    }
    int64_t all = 0;
    for (const TableSpec& s : specs_) all += s.bytes();
    fail("sharding plan: table ", describe(specs_[t]), " needs ",
         format_bytes(static_cast<double>(need_bytes)), " ", how,
         " and does not fit: the most free memory on any of ", n_, " rank(s) is ",
         format_bytes(static_cast<double>(most_free)), " (", format_bytes(o_.memory_per_rank),
         " per rank less ", o_.headroom * 100, " % headroom and ",
         format_bytes(static_cast<double>(o_.dense_bytes)), " of dense parameters); all ",
         specs_.size(), " tables need ", format_bytes(static_cast<double>(all)),
         " with their optimizer state, ", format_bytes(static_cast<double>(total_free)),
         " is free over all ranks. Use more ranks, a smaller dim or a lighter "
         "optimizer.");
  }

  void place_replicated(int t) {
    tables_[t].kind = ShardingKind::Replicated;
    const TableSpec& s = specs_[t];
    for (int r = 0; r < n_; ++r)
      if (!add(t, r, s.rows, 0, s.dim, lookups(t) / n_, false))
        fail_fit(t, s.bytes() + o_.replica_grad_bytes * s.rows * s.dim,
                 "on every rank (replicated)");
  }

  void place_row_wise(int t) {
    tables_[t].kind = ShardingKind::RowWise;
    const TableSpec& s = specs_[t];
    for (int r = 0; r < n_; ++r) {
      const int64_t rows = r < s.rows ? (s.rows - r + n_ - 1) / n_ : 0;
      if (!add(t, r, rows, 0, s.dim, lookups(t) * rows / static_cast<double>(s.rows), false))
        fail_fit(t, need(t, rows, s.dim), "per rank split by rows");
    }
  }

  // Column shards go to the least loaded ranks (by bytes) at the time of the split.
  void place_column_wise(int t, int64_t pieces) {
    tables_[t].kind = ShardingKind::ColumnWise;
    const TableSpec& s = specs_[t];
    const auto ranges = column_ranges(s.dim, pieces, o_.column_unit);
    std::vector<int> order(n_);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return loads_[a].bytes < loads_[b].bytes; });
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [c0, c1] = ranges[i];
      if (!add(t, order[i], s.rows, c0, c1, lookups(t), false))
        fail_fit(t, need(t, s.rows, c1 - c0), "per rank split by columns");
    }
  }

  // Whole-table placement: the rank minimising max(memory fraction, lookup fraction) after
  // placement, among the ranks where it fits. False if it fits nowhere.
  bool place_table_wise(int t, double total_lookups) {
    tables_[t].kind = ShardingKind::TableWise;
    const int64_t b = specs_[t].bytes();
    int best = -1;
    double best_score = 0;
    for (int r = 0; r < n_; ++r) {
      const RankLoad& l = loads_[r];
      if (l.bytes + b > l.usable) continue;
      const double mem = static_cast<double>(l.bytes + b) / static_cast<double>(l.usable);
      const double lk = total_lookups > 0 ? (l.lookups + lookups(t)) * n_ / total_lookups : 0;
      const double score = std::max(mem, lk);
      if (best < 0 || score < best_score - 1e-12) {
        best = r;
        best_score = score;
      }
    }
    if (best < 0) return false;
    add(t, best, specs_[t].rows, 0, specs_[t].dim, lookups(t), true);
    return true;
  }

  // Bytes each rank sends per step for table t (forward and backward), by kind.
  void add_comm(int t) {
    const TableSpec& s = specs_[t];
    const TablePlan& p = tables_[t];
    const double ids = lookups(t) / n_ * 8.0;  // this rank's ids, int64
    // One column of this rank's pooled rows (forward) and of their gradients (backward), in the
    // exchange's types (f32 unless the GPUs' bf16/fp16 runs set 2 bytes).
    const double fwd = batch_ * o_.exchange_value_bytes, bwd = batch_ * o_.exchange_grad_bytes;
    const int n1 = n_ - 1;
    for (int r = 0; r < n_; ++r) {
      double c = 0;
      switch (p.kind) {
        case ShardingKind::Replicated:
          // The GPUs all-reduce the dense gradient; the CPU engine all-gathers ids and pooled
          // gradients.
          c = o_.replicate_by_cost ? replication_cost(s, o_).all_reduce : n1 * (ids + bwd * s.dim);
          break;
        case ShardingKind::TableWise:
          c = p.owner() == r ? n1 * fwd * s.dim : ids + bwd * s.dim;
          break;
        case ShardingKind::RowWise:
          c = ids * n1 / n_ + n1 * (fwd + bwd) * s.dim;
          break;
        case ShardingKind::Hybrid:  // planner_hybrid.cc's estimate, per rank
          c = p.allreduce_bytes + p.exchange_bytes;
          break;
        case ShardingKind::ColumnWise: {
          const Shard* own = nullptr;
          for (const Shard& sh : p.shards)
            if (sh.rank == r) own = &sh;
          const int64_t own_cols = own ? own->col_end - own->col_begin : 0;
          const double others = static_cast<double>(p.shards.size()) - (own ? 1 : 0);
          c = others * ids + n1 * fwd * own_cols + bwd * (s.dim - own_cols);
          break;
        }
      }
      loads_[r].comm_bytes += c;
    }
  }

  int ranks() const { return n_; }
  std::vector<RankLoad>& loads() { return loads_; }
  std::vector<TablePlan>& tables() { return tables_; }

 private:
  const std::vector<TableSpec>& specs_;
  const PlannerOptions& o_;
  int n_;
  double batch_;
  std::vector<RankLoad> loads_;
  std::vector<TablePlan> tables_;
};

void validate_specs(const std::vector<TableSpec>& tables, const PlannerOptions& o) {
  std::set<std::string> names;
  for (const TableSpec& t : tables) {
    DLREC_CHECK(!t.name.empty(), "sharding: a table has no name");
    DLREC_CHECK(names.insert(t.name).second, "sharding: two tables are named '", t.name, "'");
    DLREC_CHECK(t.rows > 0 && t.dim > 0, "sharding: table '", t.name,
                "' must have rows and dim > 0, got ", t.rows, " x ", t.dim);
    DLREC_CHECK(t.value_bytes >= 1 && t.value_bytes <= 8 && t.state_bytes_per_row >= 0,
                "sharding: table '", t.name, "' has bad value or state bytes");
    DLREC_CHECK(t.rows <= (int64_t{1} << 40) && t.dim <= (1 << 20), "sharding: table '", t.name,
                "' is too large (", t.rows, " x ", t.dim, ")");
  }
  std::vector<std::string> all(names.begin(), names.end());
  for (const auto& [name, ov] : o.overrides) {
    if (!names.count(name)) {
      const std::string near = nearest_name(name, all);
      fail("sharding: config key 'sharding.tables.", name, "' names no table of the model",
           near.empty() ? std::string() : " (did you mean '" + near + "'?)");
    }
  }
  for (const TableSpec& t : tables) {
    auto it = o.overrides.find(t.name);
    if (it != o.overrides.end() && it->second.kind == ShardingKind::ColumnWise)
      DLREC_CHECK(t.state_splits_by_column, "sharding: table '", t.name,
                  "' cannot be split by columns: its optimizer keeps one state "
                  "value per whole "
                  "row (rowwise_adagrad); use row_wise or table_wise");
  }
}

// Step 2 of plan_sharding: the tables replicated automatically (those without an override) and
// why, by the cost rule (replicate_by_cost; smallest first while the replicas take at most half
// of a rank's memory for tables) or by size (replicate_max_bytes).
void choose_replicated(const std::vector<TableSpec>& specs, const PlannerOptions& o,
                       const std::vector<int>& by_size, std::vector<char>* rep,
                       std::vector<std::string>* why) {
  const int n = o.ranks;
  const int T = static_cast<int>(specs.size());
  if (n > 1 && o.replicate_auto && o.replicate_by_cost) {
    // Smallest first, while the replicas take at most half of a rank's memory for tables.
    int64_t taken = 0;
    for (auto it = by_size.rbegin(); it != by_size.rend(); ++it) {
      const int t = *it;
      if (o.overrides.count(specs[t].name)) continue;
      const ReplicationCost c = replication_cost(specs[t], o);
      const int64_t need = specs[t].bytes() + o.replica_grad_bytes * specs[t].rows * specs[t].dim;
      if (!(c.priced < c.exchange) || taken + need > o.usable_per_rank() / 2) continue;
      taken += need;
      (*rep)[t] = 1;
      (*why)[t] = "gradient all-reduce " + format_bytes(c.priced) + " (as f32) < exchange " +
                  format_bytes(c.exchange) + " per step";
    }
  } else if (n > 1) {
    for (int t = 0; t < T; ++t)
      if (!o.overrides.count(specs[t].name) && specs[t].bytes() <= o.replicate_max_bytes) {
        (*rep)[t] = 1;
        (*why)[t] = detail::concat(
            specs[t].bytes(), " bytes (values + state) <= ", o.replicate_max_bytes,
            o.replicate_auto ? " (replicate: auto on the CPU engine)" : " (replicate)");
      }
  }
}

}  // namespace

Plan plan_sharding(const std::vector<TableSpec>& specs, const PlannerOptions& o) {
  o.validate();
  validate_specs(specs, o);
  const int n = o.ranks;
  const int T = static_cast<int>(specs.size());
  Placer pl(specs, o);
  double total_lookups = 0;
  for (int t = 0; t < T; ++t) total_lookups += pl.lookups(t);

  // Largest first (ties by name order of the specs: stable).
  std::vector<int> by_size(T);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](int a, int b) { return specs[a].bytes() > specs[b].bytes(); });
  auto override_of = [&](int t) -> const TableOverride* {
    auto it = o.overrides.find(specs[t].name);
    return it == o.overrides.end() ? nullptr : &it->second;
  };
  // 2. The tables replicated automatically (not overridden), with the reason the plan prints.
  std::vector<char> rep(T, 0);
  std::vector<std::string> why(T);
  choose_replicated(specs, o, by_size, &rep, &why);
  auto replicate = [&](int t) { return rep[t] != 0; };
  auto can_split_columns = [&](int t) {
    return specs[t].state_splits_by_column && specs[t].dim / o.min_column_dim >= 2;
  };

  // One placement with the automatic splits `split`: the table that fit nowhere, or -1.
  auto attempt = [&](const std::vector<char>& split) -> int {
    pl.reset();
    // 1. Overrides, then replicated small tables, then split tables, all largest first.
    for (int t : by_size) {
      const TableOverride* ov = override_of(t);
      if (!ov) continue;
      pl.tables()[t].overridden = true;
      switch (ov->kind) {
        case ShardingKind::Replicated:
          pl.place_replicated(t);
          break;
        case ShardingKind::RowWise:
        case ShardingKind::Hybrid:  // made hybrid by apply_hybrid once everything is placed
          pl.place_row_wise(t);
          break;
        case ShardingKind::ColumnWise:
          pl.place_column_wise(t, ov->pieces > 0 ? ov->pieces : n);
          break;
        case ShardingKind::TableWise:
          if (ov->owner >= 0) {
            pl.tables()[t].kind = ShardingKind::TableWise;
            if (!pl.add(t, ov->owner, specs[t].rows, 0, specs[t].dim, pl.lookups(t), false))
              pl.fail_fit(t, specs[t].bytes(), "on its configured owner rank");
          }
          break;
      }
    }
    for (int t : by_size)
      if (!override_of(t) && replicate(t)) pl.place_replicated(t);
    for (int t : by_size) {
      if (!split[t]) continue;
      if (can_split_columns(t))
        pl.place_column_wise(t, std::min<int64_t>(n, specs[t].dim / o.min_column_dim));
      else
        pl.place_row_wise(t);
    }
    // 2. Whole tables, largest first.
    for (int t : by_size) {
      const TableOverride* ov = override_of(t);
      const bool whole =
          ov ? (ov->kind == ShardingKind::TableWise && ov->owner < 0) : !replicate(t) && !split[t];
      if (whole && !pl.place_table_wise(t, total_lookups)) return t;
    }
    return -1;
  };
  // The largest automatic whole table (on `rank`, or anywhere for -1) not yet split.
  auto largest_whole = [&](const std::vector<char>& split, int rank) {
    for (int t : by_size)
      if (!split[t] && !override_of(t) && !replicate(t) &&
          (rank < 0 || pl.tables()[t].owner() == rank))
        return t;
    return -1;
  };

  std::vector<char> split(T, 0);  // automatic splits decided so far
  for (;;) {
    const int failed = attempt(split);
    if (failed < 0) break;
    // 3. Split the largest table still placed whole, or give up.
    const int victim = n > 1 ? largest_whole(split, -1) : -1;
    if (victim < 0) pl.fail_fit(failed, specs[failed].bytes(), "on one rank (table_wise)");
    split[victim] = 1;
  }
  // 4. Balance: while the fullest rank holds more than max_memory_imbalance x the mean, split the
  // largest whole table on it, as long as that makes the fullest rank lighter.
  auto fullest = [&](int* rank) {
    int64_t most = -1, sum = 0;
    for (int r = 0; r < n; ++r) {
      sum += pl.loads()[r].bytes;
      if (pl.loads()[r].bytes > most) most = pl.loads()[r].bytes, *rank = r;
    }
    return std::make_pair(most, static_cast<double>(sum) / n);
  };
  for (int iter = 0; iter < T && n > 1; ++iter) {
    int heavy = 0;
    const auto [most, mean] = fullest(&heavy);
    if (static_cast<double>(most) <= o.max_memory_imbalance * mean) break;
    const int victim = largest_whole(split, heavy);
    if (victim < 0) break;
    const auto saved_loads = pl.loads();
    const auto saved_tables = pl.tables();
    std::vector<char> trial = split;
    trial[victim] = 1;
    int ignored = 0;
    if (attempt(trial) < 0 && fullest(&ignored).first < most) {
      split = trial;
      continue;
    }
    pl.loads() = saved_loads;
    pl.tables() = saved_tables;
    break;
  }

  Plan plan;
  plan.ranks = n;
  plan.memory_per_rank = o.memory_per_rank;
  plan.dense_bytes = o.dense_bytes;
  std::vector<double> lookups(T);
  for (int t = 0; t < T; ++t) lookups[t] = pl.lookups(t);
  apply_hybrid(specs, o, lookups, pl.tables(), pl.loads());  // planner_hybrid.cc
  for (int t = 0; t < T; ++t) pl.add_comm(t);
  for (int t = 0; t < T; ++t)
    if (rep[t]) pl.tables()[t].why = why[t];
  plan.tables = std::move(pl.tables());
  plan.per_rank = std::move(pl.loads());
  for (RankLoad& l : plan.per_rank) std::sort(l.tables.begin(), l.tables.end());
  return plan;
}

ReplicationCost replication_cost(const TableSpec& t, const PlannerOptions& o) {
  const double n = std::max(o.ranks, 1), part = (n - 1) / n;
  const double G = n * static_cast<double>(std::max<int64_t>(o.batch_per_rank, 1));
  const double dim = static_cast<double>(t.dim);
  ReplicationCost c;
  // The rule prices 4 bytes per value in every precision: a bf16 run's all-reduce sends 2, but
  // each GPU's dense pass over the replica (rounding, the update) costs about that again
  // (measured, bench/RESULTS.md: replicating the tables the 2-byte rule adds was slower).
  c.priced = 2 * part * static_cast<double>(t.rows) * dim * 4;
  c.all_reduce = c.priced * o.replica_reduce_bytes / 4;
  c.exchange = part * G * dim * (o.exchange_value_bytes + o.exchange_grad_bytes);
  return c;
}

void print_plan(const Plan& plan, const std::vector<TableSpec>& tables, std::ostream& os) {
  char line[512];
  int counts[5] = {0, 0, 0, 0, 0};
  for (const TablePlan& t : plan.tables) ++counts[static_cast<int>(t.kind)];
  os << "sharding plan: " << plan.tables.size() << " tables on " << plan.ranks << " rank(s) ("
     << counts[0] << " replicated, " << counts[1] << " table_wise, " << counts[2] << " row_wise, "
     << counts[3] << " column_wise, " << counts[4] << " hybrid), "
     << format_bytes(static_cast<double>(plan.memory_per_rank)) << " per rank\n";
  for (int r = 0; r < plan.ranks; ++r) {
    const RankLoad& l = plan.per_rank[r];
    const double total = static_cast<double>(l.bytes + plan.dense_bytes);
    std::snprintf(line, sizeof line,
                  "rank %d: memory %s (tables %s + dense %s) of %s usable (%.1f %%), %zu "
                  "table shard(s), %.0f lookups/step, ~%s sent/step\n",
                  r, format_bytes(total).c_str(),
                  format_bytes(static_cast<double>(l.bytes)).c_str(),
                  format_bytes(static_cast<double>(plan.dense_bytes)).c_str(),
                  format_bytes(static_cast<double>(l.usable + plan.dense_bytes)).c_str(),
                  100.0 * total / static_cast<double>(l.usable + plan.dense_bytes), l.tables.size(),
                  l.lookups, format_bytes(l.comm_bytes).c_str());
    os << line;
    for (int t : l.tables) {
      const Shard* s = plan.shard_of(t, r);
      const TablePlan& tp = plan.tables[t];
      char lookups[32];
      if (s->lookups < 0)  // a hybrid table's split without a frequency summary
        std::snprintf(lookups, sizeof lookups, "%12s", "unknown");
      else
        std::snprintf(lookups, sizeof lookups, "%12.0f", s->lookups);
      std::snprintf(line, sizeof line,
                    "  %-16s %-11s %12" PRId64 " rows x cols [%" PRId64 ", %" PRId64 ") of %" PRId64
                    "  %10s  %s lookups%s\n",
                    tp.name.c_str(), sharding_kind_name(tp.kind), s->rows, s->col_begin, s->col_end,
                    tables[t].dim, format_bytes(static_cast<double>(s->bytes)).c_str(), lookups,
                    tp.overridden ? "  (config)" : "");
      os << line;
    }
  }
  for (const TablePlan& tp : plan.tables)
    if (!tp.why.empty()) os << "  replicated " << tp.name << ": " << tp.why << "\n";
  print_hybrid_tables(plan, os);  // planner_hybrid.cc
}

}  // namespace dlrec::dist
