// Hybrid embedding in the planner (docs/DISTRIBUTED.md, "Hybrid embedding"): the frequent id
// prefix [0, F) of a table is replicated on every rank with its gradients all-reduced, the other
// ids are split by rows. F is where the all-reduce of the prefix's gradients costs the least
// beside the exchange of the lookups it takes out of the all-to-all.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "dlrec/dist/planner.h"
#include "planner_stats.h"

namespace dlrec::dist {

double FrequencySummary::fraction_below(int64_t f) const {
  if (f <= 0 || ids.empty() || values <= 0) return 0;
  int64_t prev_id = 0, prev_below = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (f <= ids[i]) {
      const double w = static_cast<double>(f - prev_id) / static_cast<double>(ids[i] - prev_id);
      const double below =
          static_cast<double>(prev_below) + w * static_cast<double>(values_below[i] - prev_below);
      return below / static_cast<double>(values);
    }
    prev_id = ids[i];
    prev_below = values_below[i];
  }
  return static_cast<double>(values_below.back()) / static_cast<double>(values);
}

namespace {

// Ids of a row split of `rows` rows that rank r of n holds (r, r + n, ...).
int64_t split_rows(int64_t rows, int r, int n) { return r < rows ? (rows - r + n - 1) / n : 0; }

int64_t row_bytes(const TableSpec& s) { return s.dim * s.value_bytes + s.state_bytes_per_row; }

void check_summary(const FrequencySummary& f, const std::string& what) {
  DLREC_CHECK(f.ids.size() == f.values_below.size(), what, ": ", f.ids.size(), " ids but ",
              f.values_below.size(), " values_below");
  DLREC_CHECK(f.values >= 0, what, ": negative values");
  for (size_t i = 0; i < f.ids.size(); ++i) {
    DLREC_CHECK(f.ids[i] > (i ? f.ids[i - 1] : 0), what, ": ids must be positive and ascending (",
                "ids[", i, "] = ", f.ids[i], ")");
    DLREC_CHECK(
        f.values_below[i] >= (i ? f.values_below[i - 1] : 0) && f.values_below[i] <= f.values, what,
        ": values_below[", i, "] = ", f.values_below[i],
        " must be non-decreasing and at most values (", f.values, ")");
  }
}

}  // namespace

HybridCost hybrid_cost(const TableSpec& s, const FrequencySummary& freq, int ranks, double lookups,
                       int64_t frequent_rows) {
  HybridCost c;
  if (ranks <= 1) return c;
  const double n = ranks, remote = (n - 1) / n;
  const double rare = lookups * (1.0 - freq.fraction_below(frequent_rows));
  c.exchange_bytes = rare / n * remote * (8.0 + 2.0 * 4.0 * static_cast<double>(s.dim));
  c.allreduce_bytes =
      2.0 * remote * static_cast<double>(frequent_rows) * static_cast<double>(s.dim + 1) * 4.0;
  return c;
}

int64_t choose_frequent_rows(const TableSpec& s, const FrequencySummary& freq, int ranks,
                             double lookups, int64_t max_bytes) {
  int64_t best = 0;
  double best_cost = hybrid_cost(s, freq, ranks, lookups, 0).total();
  for (int64_t f : freq.ids) {
    if (f > s.rows || f * row_bytes(s) > max_bytes) break;
    const double c = hybrid_cost(s, freq, ranks, lookups, f).total();
    if (c < best_cost) best = f, best_cost = c;
  }
  return best;
}

void apply_hybrid(const std::vector<TableSpec>& specs, const PlannerOptions& o,
                  const std::vector<double>& lookups, std::vector<TablePlan>& plans,
                  std::vector<RankLoad>& loads) {
  const int n = o.ranks;
  for (size_t t = 0; t < specs.size(); ++t) {
    const TableSpec& s = specs[t];
    TablePlan& tp = plans[t];
    static const FrequencySummary kNone;
    const auto fit = o.frequency.find(s.name);
    const FrequencySummary& freq = fit == o.frequency.end() ? kNone : fit->second;
    auto it = o.overrides.find(s.name);
    const bool forced = it != o.overrides.end() && it->second.kind == ShardingKind::Hybrid;
    const bool candidate = o.auto_hybrid && n > 1 && !tp.overridden && !freq.empty() &&
                           (tp.kind == ShardingKind::TableWise || tp.kind == ShardingKind::RowWise);
    if (!forced && !candidate) continue;
    if (forced && freq.empty())
      fail("sharding: table '", s.name, "' is hybrid but has no frequency summary: hybrid needs ",
           "its ids numbered by descending frequency (Categorify's vocabulary order) and their ",
           "counts (the \"frequency\" of its column in the dataset's stats.json, `dlrec etl`)");
    check_summary(freq, "sharding: table '" + s.name + "': frequency summary");
    // Take the placeholder shards (row_wise or table_wise) off the ranks.
    const std::vector<Shard> old = tp.shards;
    auto put = [&](const std::vector<Shard>& shards, int sign) {
      for (const Shard& sh : shards) {
        RankLoad& l = loads[sh.rank];
        l.bytes += sign * sh.bytes;
        l.lookups += sign * sh.lookups;
        auto at = std::find(l.tables.begin(), l.tables.end(), static_cast<int>(t));
        if (sign < 0 && at != l.tables.end()) l.tables.erase(at);
        if (sign > 0 && at == l.tables.end()) l.tables.push_back(static_cast<int>(t));
      }
    };
    put(old, -1);
    int64_t f = forced ? it->second.frequent_rows : -1;
    if (f > s.rows)
      fail("sharding.tables.", s.name, ".frequent_rows: ", f, " is out of range [1, ", s.rows,
           "] (the table has ", s.rows, " rows)");
    if (f < 0) {
      int64_t room = INT64_MAX;  // the least memory a rank has for the prefix
      for (int r = 0; r < n; ++r)
        room = std::min(room,
                        loads[r].usable - loads[r].bytes - split_rows(s.rows, r, n) * row_bytes(s));
      f = choose_frequent_rows(s, freq, n, lookups[t], std::max<int64_t>(0, room));
    }
    if (f == 0 && !forced) {
      put(old, +1);
      continue;
    }
    const double q = freq.fraction_below(f);
    std::vector<Shard> shards;
    bool fits = true;
    for (int r = 0; r < n; ++r) {
      const int64_t rare = split_rows(s.rows - f, r, n);
      Shard sh{r, f + rare, 0, s.dim, (f + rare) * row_bytes(s), 0};
      sh.lookups = lookups[t] * (q / n + (s.rows > f ? (1 - q) * rare / double(s.rows - f) : 0));
      if (loads[r].bytes + sh.bytes > loads[r].usable) {
        if (forced)
          fail("sharding plan: hybrid table '", s.name, "' needs ",
               format_bytes(static_cast<double>(sh.bytes)), " on rank ", r, " (", f,
               " frequent rows on every rank + ", rare, " of the others) and does not fit: ",
               format_bytes(static_cast<double>(loads[r].usable - loads[r].bytes)), " is free");
        fits = false;
      }
      shards.push_back(sh);
    }
    if (!fits) {
      put(old, +1);
      continue;
    }
    tp.kind = ShardingKind::Hybrid;
    tp.shards = shards;
    tp.frequent_rows = f;
    tp.frequent_fraction = q;
    const HybridCost c = hybrid_cost(s, freq, n, lookups[t], f);
    tp.allreduce_bytes = c.allreduce_bytes;
    tp.exchange_bytes = c.exchange_bytes;
    tp.unsplit_exchange_bytes = hybrid_cost(s, freq, n, lookups[t], 0).exchange_bytes;
    put(shards, +1);
  }
}

std::map<std::string, FrequencySummary> read_frequency_summaries(const std::string& stats_path) {
  const json j = read_json_file(stats_path);
  auto bad = [&](const std::string& why) -> void { fail_bad_stats(stats_path, why); };
  const json* cat = &stats_categorical_columns(j, stats_path);
  std::map<std::string, FrequencySummary> out;
  for (size_t i = 0; i < cat->size(); ++i) {
    const json& c = (*cat)[i];
    const std::string where = "columns.categorical[" + std::to_string(i) + "]";
    if (!c.is_object() || !c.contains("frequency") || c.value("dropped", false)) continue;
    if (!c.contains("name") || !c["name"].is_string()) bad(where + " needs a string 'name'");
    const json& f = c["frequency"];
    auto ints = [&](const char* key) {
      if (!f.is_object() || !f.contains(key) || !f[key].is_array())
        bad(where + ".frequency needs an array '" + key + "'");
      std::vector<int64_t> v;
      for (const json& x : f[key]) {
        if (!x.is_number_integer()) bad(where + ".frequency." + key + " holds a non-integer");
        v.push_back(x.get<int64_t>());
      }
      return v;
    };
    FrequencySummary s;
    s.ids = ints("ids");
    s.values_below = ints("values_below");
    if (!f.contains("values") || !f["values"].is_number_integer())
      bad(where + ".frequency needs an integer 'values'");
    // The summary counts the values Categorify saw (ids >= 1); missing values are id 0.
    const int64_t nulls = c.value("nulls", int64_t{0});
    s.values = f["values"].get<int64_t>() + nulls;
    for (int64_t& b : s.values_below) b += nulls;
    check_summary(s, "'" + stats_path + "': " + where + ".frequency");
    out[c["name"].get<std::string>()] = s;
  }
  return out;
}

void print_hybrid_tables(const Plan& plan, std::ostream& os) {
  char line[512];
  for (const TablePlan& tp : plan.tables) {
    if (tp.kind != ShardingKind::Hybrid) continue;
    if (tp.rare_owner >= 0) {  // the GPUs' form (planner_gpu.cc)
      std::snprintf(line, sizeof line,
                    "hybrid %s: ids [0, %" PRId64 ") on every GPU, the others on GPU %d",
                    tp.name.c_str(), tp.frequent_rows, tp.rare_owner);
      os << line;
      if (tp.frequent_fraction >= 0) {
        std::snprintf(line, sizeof line,
                      " (%.1f %% of its lookups on every GPU; per rank and step ~%s all-reduced + "
                      "~%s exchanged, ~%s without the replicated ids)",
                      100.0 * tp.frequent_fraction, format_bytes(tp.allreduce_bytes).c_str(),
                      format_bytes(tp.exchange_bytes).c_str(),
                      format_bytes(tp.unsplit_exchange_bytes).c_str());
        os << line;
      }
      os << (tp.overridden ? "  (config)\n" : "\n");
      continue;
    }
    std::snprintf(line, sizeof line,
                  "hybrid %s: ids [0, %" PRId64
                  ") on every rank (%.1f %% of its lookups), "
                  "per rank and step ~%s all-reduced + ~%s exchanged (~%s exchanged without the "
                  "replicated ids)%s\n",
                  tp.name.c_str(), tp.frequent_rows, 100.0 * tp.frequent_fraction,
                  format_bytes(tp.allreduce_bytes).c_str(), format_bytes(tp.exchange_bytes).c_str(),
                  format_bytes(tp.unsplit_exchange_bytes).c_str(),
                  tp.overridden ? "  (config)" : "");
    os << line;
  }
}

}  // namespace dlrec::dist
