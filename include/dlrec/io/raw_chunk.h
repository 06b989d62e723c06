// RawChunk: a block of rows as read from raw input, before ETL.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace dlrec::io {

struct RawChunk {
  int64_t rows = 0;
  int num_dense = 0;
  int num_cat = 0;
  std::vector<float> label;  // [rows]; 0 when the schema has no label
  std::vector<float> dense;  // [rows * num_dense], row-major; NaN marks a missing value
  // Categorical column c: the values of row r are
  //   cat_values[c][cat_offsets[c][r] .. cat_offsets[c][r+1])
  // A missing value is an empty list.
  std::vector<std::vector<uint64_t>> cat_values;
  std::vector<std::vector<int64_t>> cat_offsets;  // each [rows + 1]
  // Source position of the chunk's first row (1-based line number in its file) for messages.
  int64_t first_line = 0;

  // What the parser that filled the chunk knows of its categorical columns, so that the fit and
  // the input cache need not scan the offsets for it (the text parser's Criteo-shaped layouts:
  // LineParser::deferred_offsets()). Describes the chunk only while `rows` and each column's
  // value count are those recorded: reset(), append() and KeptChunk::unpack clear it, a cut
  // (fewer rows) leaves it unused; whatever else rewrites a chunk's values in place must
  // clear() it.
  struct CatFacts {
    int64_t rows = -1;            // the rows described; -1: nothing known
    uint64_t narrow = 0;          // bit c: every value of column c is < 2^32
    std::vector<int64_t> counts;  // [num_cat] values per column
    // [num_cat][(rows + 63) / 64]: bit r of column c's words says row r has a value. Every
    // column holds at most one value per row.
    std::vector<uint64_t> present;
    void clear() { rows = -1; }
  };
  CatFacts cat_facts;
  // The facts when they describe the chunk as it is (at most one value per row in every
  // categorical column; the presence bitmaps; the narrow columns), else null.
  const CatFacts* facts() const;

  void reset(int num_dense, int num_cat);  // empties the chunk, keeps capacity
  void append(const RawChunk& other);      // concatenates rows (same column counts)
};

inline bool is_missing(float v) { return std::isnan(v); }

}  // namespace dlrec::io
