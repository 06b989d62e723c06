// Batch: encoded rows ready for a model — labels, dense features and categorical ids.
// ETL produces Batches, shards store them, loaders yield them, models consume them.
#pragma once

#include <cstdint>
#include <vector>

namespace dlrec::io {

struct Batch {
  int64_t rows = 0;
  int num_dense = 0;
  std::vector<float> labels;  // [rows]
  std::vector<float> dense;   // [rows * num_dense], row-major, finite
  // Categorical feature t of row r: ids cat_indices[t][cat_offsets[t][r] .. cat_offsets[t][r+1]).
  // Ids are in [0, cardinality of feature t).
  std::vector<std::vector<int64_t>> cat_offsets;  // each [rows + 1]
  std::vector<std::vector<int64_t>> cat_indices;
  // A producer's promise that every feature has exactly one id per row (cat_offsets[t][r] == r
  // for all t, r), e.g. encoded one-hot requests. Consumers may then skip reading the offsets
  // (the GPU engine's predict does); false promises nothing. reset() clears it; append keeps it
  // only when both sides hold it.
  bool one_id_per_row = false;

  int num_cat() const { return static_cast<int>(cat_offsets.size()); }
  void reset(int num_dense, int num_cat);  // empties, keeps capacity
  void append(const Batch& other);         // concatenates rows
  void append_rows(const Batch& other, int64_t begin, int64_t end);
};

}  // namespace dlrec::io
