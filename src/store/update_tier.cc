// The update tier: the overlay of rows changed by online updates (include/dlrec/store/updates.h).
// A version is validated whole, then a new snapshot is built (the tables it touches copied, the
// others shared with the old one) and swapped in under a short lock: lookups that pinned the old
// snapshot finish on it, later ones see the whole new version.
#include <cstring>

#include "dlrec/core/error.h"
#include "dlrec/store/updates.h"

namespace dlrec::store {

void UpdateStats::set_error(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu);
  last_error = e;
}

std::string UpdateStats::error() {
  std::lock_guard<std::mutex> lock(mu);
  return last_error;
}

UpdateTier::UpdateTier(std::vector<TableInfo> tables, int64_t max_bytes)
    : tables_(std::move(tables)), max_bytes_(max_bytes) {
  auto s = std::make_shared<UpdateSnapshot>();
  for (size_t t = 0; t < tables_.size(); ++t)
    s->tables.push_back(std::make_shared<const std::unordered_map<int64_t, std::vector<float>>>());
  current_ = std::move(s);
  publish_stats();
}

void UpdateTier::publish_stats() {
  stats.update_version = static_cast<int64_t>(version());
  stats.update_rows = updates.rows_applied.load();
  stats.updates_applied = updates.versions_applied.load();
  stats.updates_rejected = updates.versions_rejected.load();
  stats.update_lag_ms = updates.lag_ms.load();
}

uint64_t UpdateTier::version() const { return pin()->version; }

std::shared_ptr<const UpdateSnapshot> UpdateTier::pin() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void UpdateTier::lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) {
  lookup_at(*pin(), table, ids, n, out, found);
}

void UpdateTier::lookup_at(const UpdateSnapshot& s, int table, const int64_t* ids, int64_t n,
                           float* out, uint8_t* found) {
  const auto& rows = *s.tables[static_cast<size_t>(table)];
  if (rows.empty()) return;
  const int64_t dim = tables_[static_cast<size_t>(table)].dim;
  for (int64_t i = 0; i < n; ++i) {
    auto it = rows.find(ids[i]);
    if (it == rows.end()) continue;
    std::memcpy(out + i * dim, it->second.data(), static_cast<size_t>(dim) * 4);
    found[i] = 1;
  }
}

void UpdateTier::apply(uint64_t version, const std::vector<RowUpdate>& updates) {
  const std::shared_ptr<const UpdateSnapshot> old = pin();  // only the consumer applies
  DLREC_CHECK(version == old->version + 1, "update version ", version, ": expected version ",
              old->version + 1, " (the store holds version ", old->version,
              version > old->version ? "; versions in between are missing" : "; already applied",
              ")");
  for (const RowUpdate& u : updates) {
    DLREC_CHECK(u.table >= 0 && u.table < static_cast<int>(tables_.size()), "update version ",
                version, ": table index ", u.table, " of ", tables_.size());
    const TableInfo& t = tables_[static_cast<size_t>(u.table)];
    DLREC_CHECK(static_cast<int64_t>(u.rows.size()) == static_cast<int64_t>(u.ids.size()) * t.dim,
                "update version ", version, ": table '", t.name, "': ", u.rows.size(),
                " floats for ", u.ids.size(), " rows of dim ", t.dim);
    for (int64_t id : u.ids)
      DLREC_CHECK(id >= 0 && id < t.rows, "update version ", version, ": id ", id,
                  " is beyond table '", t.name, "' (", t.rows, " rows)");
  }
  auto next = std::make_shared<UpdateSnapshot>(*old);  // shares the untouched tables
  next->version = version;
  std::vector<std::shared_ptr<std::unordered_map<int64_t, std::vector<float>>>> copies(
      tables_.size());
  int64_t rows_applied = 0;
  for (const RowUpdate& u : updates) {
    auto& copy = copies[static_cast<size_t>(u.table)];
    if (!copy)
      copy = std::make_shared<std::unordered_map<int64_t, std::vector<float>>>(
          *old->tables[static_cast<size_t>(u.table)]);
    const int64_t dim = tables_[static_cast<size_t>(u.table)].dim;
    for (size_t i = 0; i < u.ids.size(); ++i) {
      auto ins = copy->emplace(u.ids[i], std::vector<float>());
      if (ins.second) next->bytes += dim * 4 + kHostEntryOverhead;
      ins.first->second.assign(u.rows.begin() + static_cast<int64_t>(i) * dim,
                               u.rows.begin() + static_cast<int64_t>(i + 1) * dim);
    }
    rows_applied += static_cast<int64_t>(u.ids.size());
  }
  DLREC_CHECK(next->bytes <= max_bytes_, "update version ", version,
              ": the update tier would hold ", next->bytes,
              " bytes, beyond its bound updates.max_bytes = ", max_bytes_,
              " (export the model again with the new tables, or raise the bound)");
  for (size_t t = 0; t < copies.size(); ++t)
    if (copies[t]) next->tables[t] = std::move(copies[t]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(next);
  }
  stats.bytes = current_->bytes;
  this->updates.versions_applied += 1;
  this->updates.rows_applied += rows_applied;
  publish_stats();
}

std::vector<RowUpdate> diff_tables(const std::vector<TableInfo>& tables,
                                   const std::vector<const float*>& base,
                                   const std::vector<const float*>& next) {
  DLREC_CHECK(base.size() == tables.size() && next.size() == tables.size(),
              "diff_tables: one base and one new table per table");
  std::vector<RowUpdate> out;
  for (size_t t = 0; t < tables.size(); ++t) {
    const int64_t dim = tables[t].dim;
    RowUpdate u;
    u.table = static_cast<int>(t);
    for (int64_t r = 0; r < tables[t].rows; ++r) {
      const float* a = base[t] + r * dim;
      const float* b = next[t] + r * dim;
      if (std::memcmp(a, b, static_cast<size_t>(dim) * 4) == 0) continue;
      u.ids.push_back(r);
      u.rows.insert(u.rows.end(), b, b + dim);
    }
    if (!u.ids.empty()) out.push_back(std::move(u));
  }
  return out;
}

}  // namespace dlrec::store
