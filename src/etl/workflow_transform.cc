// Workflow::transform: raw chunks to model inputs.
#include "dlrec/etl/workflow.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"

#include "etl/workflow_impl.h"

namespace dlrec::etl {

namespace {

// The config's "label": labels[r] = row r's value of the label column after its ops; a value
// that is not finite is reported with its row (a missing rating, a LogOp of a negative value).
// Without labels in the input (serving: an empty RawChunk::label) the caller leaves them 0.
template <class LineOf, class Report>
void derive_labels(const ColumnPipe& p, const io::RawChunk& in, float* labels,
                   const LineOf& line_of, const Report& report) {
  for (int64_t r = 0; r < in.rows; ++r) labels[r] = in.dense[r * in.num_dense + p.index];
  p.apply_dense(labels, in.rows, 1);
  for (int64_t r = 0; r < in.rows; ++r) {
    if (std::isfinite(labels[r])) continue;
    const float raw = in.dense[r * in.num_dense + p.index];
    report(r, detail::concat("the label (column '", p.name, "') is ", labels[r], " at ",
                             line_of(r), " after its ops (raw value ", raw,
                             "); a label must be finite: filter such rows out (Filter) or fill "
                             "them (FillMissing)"));
    return;
  }
}

}  // namespace

// About 200 lines, left whole on purpose: its steps (filters, the output's offsets, then the
// rows through the dense ops, the categorical encoders and the features, on all cores) share
// the chunk's row bookkeeping (kept rows, training rows, rows appended after) and the report
// of the first error by row; split, each piece would take most of them as arguments.
void Workflow::transform(const io::RawChunk& raw_in, io::Batch& out,
                         std::vector<int64_t>* kept, bool append, const TrainRows* train) const {
  const Impl& m = *impl_;
  DLREC_CHECK(m.fitted, "Workflow::transform: the workflow is not fitted; call fit() first");
  io::RawChunk joined;  // JoinExternal's columns added (rows unchanged)
  const io::RawChunk& raw = m.joined(raw_in, joined);
  m.check_chunk(raw, "transform");
  // Filters apply only when the caller asks which rows were kept (run_etl); serving encodes
  // every request row.
  io::RawChunk filtered;
  bool use_filtered = false;
  if (kept) {
    kept->clear();
    if (!m.filters.empty()) {
      std::vector<uint8_t> keep;
      m.filter_mask(raw, keep);
      use_filtered = std::find(keep.begin(), keep.end(), 0) != keep.end();
      if (use_filtered) compact(raw, keep, filtered, kept);
    }
    if (!use_filtered) {
      kept->resize(raw.rows);
      std::iota(kept->begin(), kept->end(), int64_t{0});
    }
  }
  const io::RawChunk& in = use_filtered ? filtered : raw;
  // `train` counts input rows; the feature ops see the kept ones (a prefix of `in` too).
  TrainRows train_rows;
  if (train) {
    train_rows.first = train->first;
    train_rows.rows = std::min(train->rows, raw.rows);
    if (use_filtered)
      train_rows.rows = std::lower_bound(kept->begin(), kept->end(), train_rows.rows) - kept->begin();
  }
  const int nd_in = in.num_dense;
  const int nd = static_cast<int>(m.dense_out.size());
  const int nc = static_cast<int>(m.cat_out.size());
  const int64_t rows = in.rows;
  // Appending: the chunk's rows go after the `rows0` rows already in `out`.
  int64_t rows0 = 0;
  if (append && out.rows > 0) {
    DLREC_CHECK(out.num_dense == nd && out.num_cat() == nc,
                "Workflow::transform: cannot append to a batch of another layout");
    rows0 = out.rows;
  } else {
    // Not out.reset(): it empties the vectors, and the resizes below then zero-fill them again
    // for every chunk of a reused batch (2-3 % of a Criteo ETL's CPU in memset). Every label,
    // dense value, offset and id below is written, so the old values need no clearing.
    out.rows = 0;
    out.one_id_per_row = false;
    out.num_dense = nd;
    out.cat_offsets.resize(nc);
    out.cat_indices.resize(nc);
  }
  out.rows = rows0 + rows;
  out.labels.resize(rows0 + rows);
  if (static_cast<int64_t>(in.label.size()) == rows)
    std::copy(in.label.begin(), in.label.end(), out.labels.begin() + rows0);
  else
    std::fill(out.labels.begin() + rows0, out.labels.end(), 0.0f);
  out.dense.resize((rows0 + rows) * nd);

  // Output offsets: one id per one-hot row; max(1, values) per multi-hot row.
  std::mutex err_mu;
  int64_t err_row = std::numeric_limits<int64_t>::max();
  std::string err_msg;
  auto report = [&](int64_t row, std::string msg) {
    std::lock_guard<std::mutex> g(err_mu);
    if (row < err_row) {
      err_row = row;
      err_msg = std::move(msg);
    }
  };
  if (m.label_pipe >= 0 && static_cast<int64_t>(in.label.size()) == rows)
    derive_labels(m.dense[m.label_pipe], in, out.labels.data() + rows0,
                  [&](int64_t r) { return m.line_of(in, r); }, report);

  parallel_for(0, nc, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const CatOut& o = m.cat_out[k];
      auto& offv = out.cat_offsets[k];
      offv.resize(rows0 + rows + 1);
      if (rows0 == 0) offv[0] = 0;
      int64_t* off = offv.data() + rows0;  // off[r]: the chunk's row r; off[0] is the old end
      if (o.cat_pipe < 0) {
        for (int64_t r = 0; r < rows; ++r) off[r + 1] = off[0] + r + 1;
      } else if (!o.multi_hot) {
        const ColumnPipe& p = m.cat[o.cat_pipe];
        const int64_t* in_off = in.cat_offsets[p.index].data();
        // Whether a row holds more than one value, without a branch per row (vectorized);
        // the loop below finds which for the message.
        uint64_t over = 0;
        for (int64_t r = 0; r < rows; ++r)
          over |= static_cast<uint64_t>(in_off[r + 1] - in_off[r]) >> 1;
        for (int64_t r = 0; r < rows; ++r) off[r + 1] = off[0] + r + 1;
        for (int64_t r = 0; over != 0 && r < rows; ++r) {
          if (in_off[r + 1] - in_off[r] > 1) {
            report(r, detail::concat("categorical column '", p.name, "' is one-hot but ",
                                     m.line_of(in, r), " holds ", in_off[r + 1] - in_off[r],
                                     " values (declare it multi_hot in the schema)"));
            off[rows] = off[0];  // the ids' size below (the batch's old offsets are not zeroed)
            break;
          }
        }
      } else {
        const auto& in_off = in.cat_offsets[m.cat[o.cat_pipe].index];
        for (int64_t r = 0; r < rows; ++r)
          off[r + 1] = off[r] + std::max<int64_t>(1, in_off[r + 1] - in_off[r]);
      }
      out.cat_indices[k].resize(off[rows]);
    }
  });
  if (!err_msg.empty()) fail(err_msg);

  // Column of each feature op's outputs.
  std::vector<std::vector<int>> feat_dense(m.features.size()), feat_cat(m.features.size());
  for (int j = 0; j < nd; ++j)
    if (m.dense_out[j].feature >= 0) feat_dense[m.dense_out[j].feature].push_back(j);
  for (int j = 0; j < nc; ++j)
    if (m.cat_out[j].feature >= 0) feat_cat[m.cat_out[j].feature].push_back(j);
  const int nf = static_cast<int>(m.features.size());

  // Reports the first value of v[0], v[stride], ... (rows lo, lo + 1, ...) that is not finite.
  auto check_finite = [&](const float* v, int64_t stride, int64_t lo, int64_t n,
                          const std::string& name, int raw_col) {
    // First whether there is one at all: all exponent bits set marks NaN and +-inf; no branch
    // per value (a loop the compiler vectorizes on contiguous values).
    uint32_t bad = 0;
    for (int64_t r = 0; r < n; ++r) {
      uint32_t bits;
      std::memcpy(&bits, v + r * stride, 4);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad) return;
    for (int64_t r = 0; r < n; ++r) {
      const float x = v[r * stride];
      if (std::isfinite(x)) continue;
      const float rawv = raw_col >= 0 ? in.dense[(lo + r) * nd_in + raw_col] : x;
      report(lo + r,
             std::isnan(rawv)
                 ? detail::concat("dense column '", name, "' is missing (NaN) at ",
                                  m.line_of(in, lo + r),
                                  " after its ops; the model needs finite values: add "
                                  "{\"op\": \"FillMissing\"} to its ops")
                 : detail::concat("dense column '", name, "' is ", x, " at ",
                                  m.line_of(in, lo + r), " after its ops (raw value ", rawv,
                                  "); the model needs finite values: clip it (e.g. "
                                  "{\"op\": \"Clip\", \"min\": 0} before LogOp)"));
      return;
    }
  };

  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t ntasks = nd + nc + nf;
  parallel_for(0, ntasks * blocks, 1, [&](int64_t t_lo, int64_t t_hi) {
    std::vector<int64_t> scratch;
    std::vector<float> fbuf;
    for (int64_t t = t_lo; t < t_hi; ++t) {
      const int64_t task = t / blocks;
      const int64_t lo = (t % blocks) * kRowBlock;
      const int64_t hi = std::min(rows, lo + kRowBlock);
      if (task < nd) {  // a dense output from a dense column's chain
        const DenseOut& o = m.dense_out[task];
        if (o.pipe < 0) continue;  // a feature op's output: written by its task
        const ColumnPipe& p = m.dense[o.pipe];
        // The column's values of the block side by side, through its ops, into the rows:
        // the ops run on contiguous values (vectorized) instead of every 4 * nd bytes.
        fbuf.resize(hi - lo);
        for (int64_t r = lo; r < hi; ++r) fbuf[r - lo] = in.dense[r * nd_in + p.index];
        p.apply_dense(fbuf.data(), hi - lo, 1);
        check_finite(fbuf.data(), 1, lo, hi - lo, p.name, p.index);
        float* v = out.dense.data() + (rows0 + lo) * nd + task;
        for (int64_t r = lo; r < hi; ++r) v[(r - lo) * nd] = fbuf[r - lo];
      } else if (task < nd + nc) {
        const int64_t k = task - nd;
        const CatOut& o = m.cat_out[k];
        if (o.feature >= 0) continue;
        const int64_t* off = out.cat_offsets[k].data() + rows0;  // the chunk's rows
        int64_t* ids = out.cat_indices[k].data();
        if (o.dense_pipe >= 0) {  // Bucketize (one-hot)
          const ColumnPipe& p = m.dense[o.dense_pipe];
          fbuf.resize(hi - lo);
          for (int64_t r = lo; r < hi; ++r) fbuf[r - lo] = in.dense[r * nd_in + p.index];
          const int e = p.encoder_index();
          p.apply_dense(fbuf.data(), hi - lo, 1, e);
          p.dense_encoder()->encode(fbuf.data(), hi - lo, 1, ids + off[lo]);
          continue;
        }
        const ColumnPipe& p = m.cat[o.cat_pipe];
        const CategoricalEncoder& enc = p.encoder();
        const auto& in_off = in.cat_offsets[p.index];
        const uint64_t* keys = in.cat_values[p.index].data();
        const int64_t k_lo = in_off[lo], k_hi = in_off[hi];
        if (k_hi - k_lo == off[hi] - off[lo]) {  // no missing rows: ids map 1:1 to keys
          enc.encode(keys + k_lo, k_hi - k_lo, ids + off[lo]);
          continue;
        }
        if (!o.multi_hot) {
          // One id per row, every row holding 0 or 1 values (checked above): the keys are
          // encoded into the tail of the block's ids and spread forward in place, a missing row
          // getting 0. Row r reads slot (rows - keys) + (keys before r) >= r, which no earlier
          // row wrote; no scratch copy and no branch per row (the rows with a missing value
          // fall at random in some Criteo columns: a branch on them mispredicted).
          const int64_t nk = k_hi - k_lo, nr = hi - lo;
          int64_t* dst = ids + off[lo];
          int64_t* encoded = dst + (nr - nk);
          enc.encode(keys + k_lo, nk, encoded);
          if (nk == 0) {
            std::fill_n(dst, nr, int64_t{0});
            continue;
          }
          const int64_t* io = in_off.data();
          for (int64_t r = lo; r < hi; ++r) {
            const int64_t has = io[r + 1] - io[r];  // 0 or 1
            // The last key's slot where all keys lie before r (its value is then unused).
            const int64_t v = encoded[std::min(io[r] - k_lo, nk - 1)];
            dst[r - lo] = v & -has;
          }
          continue;
        }
        scratch.resize(k_hi - k_lo);
        enc.encode(keys + k_lo, k_hi - k_lo, scratch.data());
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t n = in_off[r + 1] - in_off[r];
          int64_t* dst = ids + off[r];
          // One value (the common case) without a call to memmove per row.
          if (n == 1) {
            dst[0] = scratch[in_off[r] - k_lo];
          } else if (n == 0) {
            dst[0] = 0;  // missing
          } else {
            std::copy_n(scratch.data() + (in_off[r] - k_lo), n, dst);
          }
        }
      } else {  // a feature op: all its outputs
        const int f = static_cast<int>(task - nd - nc);
        std::vector<float*> dptr;
        std::vector<int64_t*> iptr;
        for (int j : feat_dense[f]) dptr.push_back(out.dense.data() + (rows0 + lo) * nd + j);
        for (int j : feat_cat[f]) iptr.push_back(out.cat_indices[j].data() + rows0 + lo);
        m.features[f].op->transform(in, lo, hi, dptr.data(), nd, iptr.data(),
                                    train ? &train_rows : nullptr);
        for (size_t j = 0; j < dptr.size(); ++j)
          check_finite(dptr[j], nd, lo, hi - lo, m.dense_out[feat_dense[f][j]].name, -1);
      }
    }
  });
  if (!err_msg.empty()) fail(err_msg);
}

}  // namespace dlrec::etl
