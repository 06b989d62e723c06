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

std::string FitParts::save_part(const Workflow& w) {
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
  for (const ColumnPipe& p : m.cat) {
    const CategoricalEncoder* e = fitted_encoder(const_cast<ColumnPipe&>(p));
    if (!e) continue;
    const size_t at = out.size();
    put<uint64_t>(out, 0);
    e->save_partial_fit(out);
    const uint64_t n = out.size() - at - 8;
    std::memcpy(out.data() + at, &n, 8);
  }
  return out;
}

void FitParts::add_part(Workflow& w, const char* data, size_t size) {
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
  for (ColumnPipe& p : m.cat) {
    CategoricalEncoder* e = fitted_encoder(p);
    if (!e) continue;
    const uint64_t n = r.get<uint64_t>();
    DLREC_CHECK(n <= static_cast<uint64_t>(r.end - r.p), "etl: a part's counts of column '", p.name,
                "' are cut short");
    e->add_partial_fit(r.p, n);
    r.p += n;
  }
  DLREC_CHECK(r.p == r.end, "etl: a part's fit is followed by ", r.end - r.p, " extra bytes");
}

int FitParts::num_sums(const Workflow& w) { return static_cast<int>(w.impl_->dense.size()); }

void FitParts::continue_sums(const Workflow& w, const std::vector<const io::RawChunk*>& chunks,
                             std::vector<double>& sums) {
  const Workflow::Impl& m = *w.impl_;
  const int nd = static_cast<int>(m.dense.size());
  DLREC_CHECK(static_cast<int>(sums.size()) == nd, "FitParts: ", sums.size(), " sums for ", nd,
              " dense columns");
  // As Workflow::Impl::fit_column adds them: a missing value adds +0.0, in row order.
  for (int k = 0; k < nd; ++k) {
    double sum = sums[k];
    const int index = m.dense[k].index;
    for (const io::RawChunk* c : chunks) {
      if (c->dense.empty()) continue;
      const float* column = c->dense.data() + index;
      for (int64_t r = 0; r < c->rows; ++r) {
        const float v = column[r * nd];
        sum += std::isnan(v) ? 0.0 : static_cast<double>(v);
      }
    }
    sums[k] = sum;
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
