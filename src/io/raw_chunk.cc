#include "dlrec/io/raw_chunk.h"

#include "dlrec/core/error.h"

namespace dlrec::io {

void RawChunk::reset(int nd, int nc) {
  rows = 0;
  cat_facts.clear();
  num_dense = nd;
  num_cat = nc;
  first_line = 0;
  label.clear();
  dense.clear();
  cat_values.resize(nc);
  cat_offsets.resize(nc);
  for (int c = 0; c < nc; ++c) {
    cat_values[c].clear();
    cat_offsets[c].assign(1, 0);
  }
}

void RawChunk::append(const RawChunk& o) {
  DLREC_CHECK(o.num_dense == num_dense && o.num_cat == num_cat,
              "RawChunk::append: column counts differ");
  cat_facts.clear();
  if (rows == 0) first_line = o.first_line;
  label.insert(label.end(), o.label.begin(), o.label.end());
  dense.insert(dense.end(), o.dense.begin(), o.dense.end());
  for (int c = 0; c < num_cat; ++c) {
    int64_t base = cat_offsets[c].back();
    cat_values[c].insert(cat_values[c].end(), o.cat_values[c].begin(), o.cat_values[c].end());
    for (int64_t r = 1; r <= o.rows; ++r) cat_offsets[c].push_back(base + o.cat_offsets[c][r]);
  }
  rows += o.rows;
}

const RawChunk::CatFacts* RawChunk::facts() const {
  const CatFacts& f = cat_facts;
  if (f.rows < 0 || f.rows != rows || static_cast<int>(f.counts.size()) != num_cat ||
      static_cast<int>(cat_values.size()) != num_cat ||
      f.present.size() != static_cast<size_t>(num_cat) * static_cast<size_t>((rows + 63) / 64))
    return nullptr;
  for (int c = 0; c < num_cat; ++c)
    if (f.counts[c] != static_cast<int64_t>(cat_values[c].size())) return nullptr;
  return &f;
}

}  // namespace dlrec::io
