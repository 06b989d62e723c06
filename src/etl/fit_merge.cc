// The fit split across processes (include/dlrec/etl/fit_merge.h): the partial state, its bytes
// and their addition, on the Workflow's internals.
#include "dlrec/etl/fit_merge.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dlrec/core/error.h"
#include "etl/workflow_impl.h"

namespace dlrec::etl {
namespace {

constexpr uint64_t kFitPartMagic = 0x3154524150544946ull;  // "FITPART1"

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

struct Reader {
  const char* p;
  const char* end;
  template <class T>
  T get() {
    DLREC_CHECK(static_cast<size_t>(end - p) >= sizeof(T), "etl: a part's fit is cut short");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
};

// The encoder a categorical column fits (null: none).
CategoricalEncoder* fitted_encoder(ColumnPipe& p) {
  const std::vector<int> f = p.fit_ops();
  return f.empty() ? nullptr : static_cast<CategoricalEncoder*>(p.ops[f[0]].get());
}

}  // namespace

std::string FitParts::why_not_mergeable(const Workflow& w) {
  const Workflow::Impl& m = *w.impl_;
  if (!m.features.empty()) return "the workflow has feature ops (their fit is not merged yet)";
  if (!m.filters.empty()) return "the workflow has Filter ops";
  if (!m.joins.empty()) return "the workflow joins side tables";
  if (m.fit_memory) return "a memory budget bounds the fit (spilled counts)";
  if (w.num_fit_passes() != 1) return "the fit needs several passes";
  for (const ColumnPipe& p : m.dense)
    for (int i : p.fit_ops())
      return "op '" + p.ops[i]->name() + "' on dense column '" + p.name +
             "' fits statistics that are not merged yet";
  for (const ColumnPipe& p : m.cat)
    for (int i : p.fit_ops()) {
      const auto* e = dynamic_cast<const CategoricalEncoder*>(p.ops[i].get());
      if (!e || !e->partial_fit_mergeable())
        return "op '" + p.ops[i]->name() + "' on column '" + p.name +
               "' has no exact partial fit (a joint vocabulary?)";
    }
  return "";
}

void FitParts::fit_part(Workflow& w, const std::vector<const io::RawChunk*>& chunks) {
  Workflow::Impl& m = *w.impl_;
  DLREC_CHECK(why_not_mergeable(w).empty(), "FitParts: ", why_not_mergeable(w));
  m.fitted = false;
  m.have_stats = false;
  m.begin_pass(0);
  if (!chunks.empty()) m.fit_chunks(chunks.data(), static_cast<int>(chunks.size()), 0);
}

std::string FitParts::save_head(const Workflow& w) {
  const Workflow::Impl& m = *w.impl_;
  std::string out;
  put(out, kFitPartMagic);
  put<int64_t>(out, m.stats_rows);
  put<int64_t>(out, m.stats_input_rows);
  for (const auto* v : {&m.dense, &m.cat})
    for (const ColumnPipe& p : *v) {
      put<int64_t>(out, p.stats.rows);
      put<int64_t>(out, p.stats.nulls);
      put<int64_t>(out, p.stats.values);
      put<double>(out, p.stats.min);
      put<double>(out, p.stats.max);
    }
  return out;
}

void FitParts::add_head(Workflow& w, const char* data, size_t size) {
  Workflow::Impl& m = *w.impl_;
  Reader r{data, data + size};
  DLREC_CHECK(r.get<uint64_t>() == kFitPartMagic, "etl: a part's fit does not start as it must");
  m.stats_rows += r.get<int64_t>();
  m.stats_input_rows += r.get<int64_t>();
  for (auto* v : {&m.dense, &m.cat})
    for (ColumnPipe& p : *v) {
      ColumnStats& s = p.stats;
      s.rows += r.get<int64_t>();
      s.nulls += r.get<int64_t>();
      s.values += r.get<int64_t>();
      // Folded as the single fit folds its values: the earlier value stays on a tie.
      s.min = std::min(s.min, r.get<double>());
      s.max = std::max(s.max, r.get<double>());
    }
  DLREC_CHECK(r.p == r.end, "etl: a part's fit is followed by ", r.end - r.p, " extra bytes");
}

namespace {
// The merged encoders in column order, and their columns' names.
std::vector<std::pair<CategoricalEncoder*, const std::string*>> count_columns(
    const std::vector<ColumnPipe>& cat) {
  std::vector<std::pair<CategoricalEncoder*, const std::string*>> out;
  for (const ColumnPipe& p : cat)
    if (CategoricalEncoder* e = fitted_encoder(const_cast<ColumnPipe&>(p)))
      out.emplace_back(e, &p.name);
  return out;
}

std::pair<CategoricalEncoder*, const std::string*> count_column(const std::vector<ColumnPipe>& cat,
                                                                int j) {
  const auto all = count_columns(cat);
  DLREC_CHECK(j >= 0 && j < static_cast<int>(all.size()), "FitParts: encoder ", j, " of ",
              all.size());
  return all[j];
}
}  // namespace

int FitParts::num_counts(const Workflow& w) {
  return static_cast<int>(count_columns(w.impl_->cat).size());
}

std::string FitParts::save_counts(const Workflow& w, int j) {
  std::string out;
  count_column(w.impl_->cat, j).first->save_partial_fit(out);
  return out;
}

size_t FitParts::counts_bytes(const Workflow& w, int j) {
  return count_column(w.impl_->cat, j).first->partial_fit_bytes();
}

void FitParts::add_counts(Workflow& w, int j, const char* data, size_t size) {
  const auto [e, name] = count_column(w.impl_->cat, j);
  try {
    e->add_partial_fit(data, size);
  } catch (const Error& err) {
    fail("etl: the counts of column '", *name, "' from another process: ", err.what());
  }
}

int FitParts::num_sums(const Workflow& w) { return static_cast<int>(w.impl_->dense.size()); }

void FitParts::continue_sums(const Workflow& w, const std::vector<const io::RawChunk*>& chunks,
                             std::vector<double>& sums) {
  const Workflow::Impl& m = *w.impl_;
  const int nd = static_cast<int>(m.dense.size());
  DLREC_CHECK(static_cast<int>(sums.size()) == nd, "FitParts: ", sums.size(), " sums for ", nd,
              " dense columns");
  // As Workflow::Impl::fit_column adds them: a missing value adds +0.0, in row order. Row by
  // row, every column's sum at once (independent additions, not one long chain at a time).
  std::vector<int> index(nd);
  for (int k = 0; k < nd; ++k) index[k] = m.dense[k].index;
  for (const io::RawChunk* c : chunks) {
    if (c->dense.empty()) continue;
    for (int64_t r = 0; r < c->rows; ++r) {
      const float* row = c->dense.data() + r * nd;
      for (int k = 0; k < nd; ++k) {
        // +0.0 for a missing value, without a branch (missing values are frequent and random).
        const float v = row[index[k]];
        const double d = static_cast<double>(v);
        uint64_t bits;
        std::memcpy(&bits, &d, 8);
        bits &= 0 - static_cast<uint64_t>(v == v);
        double add;
        std::memcpy(&add, &bits, 8);
        sums[k] += add;
      }
    }
  }
}

void FitParts::finish(Workflow& w, const std::vector<double>& sums) {
  Workflow::Impl& m = *w.impl_;
  DLREC_CHECK(static_cast<int>(sums.size()) == num_sums(w), "FitParts: ", sums.size(), " sums for ",
              num_sums(w), " dense columns");
  for (size_t k = 0; k < m.dense.size(); ++k) m.dense[k].stats.sum = sums[k];
  m.end_pass(0);
  m.fitted = true;
  m.have_stats = true;
  m.build_plan(true);
}

}  // namespace dlrec::etl
