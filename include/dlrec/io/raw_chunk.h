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

  void reset(int num_dense, int num_cat);  // empties the chunk, keeps capacity
  void append(const RawChunk& other);      // concatenates rows (same column counts)
};

inline bool is_missing(float v) { return std::isnan(v); }

}  // namespace dlrec::io
