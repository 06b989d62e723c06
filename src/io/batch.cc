#include "dlrec/io/batch.h"

#include "dlrec/core/error.h"

namespace dlrec::io {

void Batch::reset(int nd, int nc) {
  rows = 0;
  one_id_per_row = false;
  num_dense = nd;
  labels.clear();
  dense.clear();
  cat_offsets.resize(nc);
  cat_indices.resize(nc);
  for (int t = 0; t < nc; ++t) {
    cat_offsets[t].assign(1, 0);
    cat_indices[t].clear();
  }
}

void Batch::append(const Batch& o) { append_rows(o, 0, o.rows); }

void Batch::append_rows(const Batch& o, int64_t begin, int64_t end) {
  DLREC_CHECK(o.num_dense == num_dense && o.num_cat() == num_cat(),
              "Batch::append: column counts differ");
  DLREC_CHECK(0 <= begin && begin <= end && end <= o.rows, "Batch::append_rows: bad range");
  labels.insert(labels.end(), o.labels.begin() + begin, o.labels.begin() + end);
  dense.insert(dense.end(), o.dense.begin() + begin * num_dense, o.dense.begin() + end * num_dense);
  for (int t = 0; t < num_cat(); ++t) {
    const auto& off = o.cat_offsets[t];
    int64_t base = cat_offsets[t].back() - off[begin];
    cat_indices[t].insert(cat_indices[t].end(), o.cat_indices[t].begin() + off[begin],
                          o.cat_indices[t].begin() + off[end]);
    for (int64_t r = begin + 1; r <= end; ++r) cat_offsets[t].push_back(base + off[r]);
  }
  // An empty batch takes the appended rows' promise; otherwise both must hold it.
  one_id_per_row = (rows == 0 || one_id_per_row) && o.one_id_per_row;
  rows += end - begin;
}

}  // namespace dlrec::io
