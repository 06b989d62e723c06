// Where the pieces of a sharded table sit in the whole table: shared by the exchange
// (sharded_embedding.cc) and the checkpoints (sharded_embedding_checkpoint.cc).
#pragma once

#include <cstdint>
#include <cstring>

#include "dlrec/core/tensor.h"
#include "dlrec/dist/sharded_embedding.h"
#include "dlrec/nn/optimizer.h"

namespace dlrec::dist::detail {

// Rows of a table of `rows` rows that rank d holds under row-wise sharding over n ranks (the
// ids d, d + n, ...).
inline int64_t row_wise_rows(int64_t rows, int d, int n) {
  return d < rows ? (rows - d + n - 1) / n : 0;
}

// An optimizer's state row as groups of per-value entries (G groups of `dim` values) followed by
// E per-row entries: adagrad and momentum G=1 E=0; adam G=2 E=1 (m, v, t); ftrl G=2 E=0;
// rowwise_adagrad G=0 E=1. A column shard [c0, c1) holds G groups of c1 - c0 values and E.
struct StateLayout {
  int64_t groups = 0, extra = 0;
  explicit StateLayout(const nn::Optimizer& o)
      : groups(o.state_row_size(1) - o.state_row_size(0)), extra(o.state_row_size(0)) {}
  int64_t row(int64_t cols) const { return groups * cols + extra; }
};

// The state tensor's shape for a table [rows, cols], as nn::Optimizer::init_state makes it.
inline Shape state_shape(const nn::Optimizer& o, int64_t rows, int64_t cols) {
  switch (o.kind()) {
    case nn::OptimizerKind::SGD:
    case nn::OptimizerKind::Adagrad:
      return {rows, cols};
    case nn::OptimizerKind::RowWiseAdagrad:
      return {rows};
    default:
      return {rows, o.state_row_size(cols)};
  }
}

// One piece of a table: `local_rows` rows (row-wise: global row row_base + lr * ranks + rank;
// else row_base + lr) of columns [c0, c1). row_base is F for the rare rows of a hybrid table
// (ids >= F split by rows) and 0 otherwise (its replicated prefix is rows [0, F)).
struct Piece {
  bool row_wise = false;
  int rank = 0, ranks = 1;
  int64_t local_rows = 0, c0 = 0, c1 = 0;
  int64_t row_base = 0;
  int64_t global_row(int64_t lr) const { return row_base + (row_wise ? lr * ranks + rank : lr); }
};

// The frequent rows of a hybrid table with prefix [0, f) and dim columns, as a piece.
inline Piece frequent_piece(int64_t f, int64_t dim) { return Piece{false, 0, 1, f, 0, dim, 0}; }

// The piece of sharded (not replicated) table t on `rank` (a hybrid table's: its rare rows);
// throws if the rank holds none.
Piece piece_of(const Plan& plan, const std::vector<ShardedTableConfig>& tables, int t, int rank);

// Copies a piece's values (state = false: rows of c1 - c0 floats) or optimizer state (rows of
// layout.row(c1 - c0) floats) into the whole table's (rows of dim, or layout.row(dim), floats).
inline void place_piece(float* whole, const float* piece, const Piece& p, int64_t dim, bool state,
                        const StateLayout& layout) {
  const int64_t cols = p.c1 - p.c0;
  const int64_t whole_row = state ? layout.row(dim) : dim;
  const int64_t piece_row = state ? layout.row(cols) : cols;
  for (int64_t lr = 0; lr < p.local_rows; ++lr) {
    const float* src = piece + lr * piece_row;
    float* dst = whole + p.global_row(lr) * whole_row;
    if (!state) {
      std::memcpy(dst + p.c0, src, cols * sizeof(float));
      continue;
    }
    for (int64_t g = 0; g < layout.groups; ++g)
      std::memcpy(dst + g * dim + p.c0, src + g * cols, cols * sizeof(float));
    for (int64_t e = 0; e < layout.extra; ++e)
      dst[layout.groups * dim + e] = src[layout.groups * cols + e];
  }
}

// The inverse: a piece taken out of the whole table.
inline void take_piece(const float* whole, float* piece, const Piece& p, int64_t dim, bool state,
                       const StateLayout& layout) {
  const int64_t cols = p.c1 - p.c0;
  const int64_t whole_row = state ? layout.row(dim) : dim;
  const int64_t piece_row = state ? layout.row(cols) : cols;
  for (int64_t lr = 0; lr < p.local_rows; ++lr) {
    const float* src = whole + p.global_row(lr) * whole_row;
    float* dst = piece + lr * piece_row;
    if (!state) {
      std::memcpy(dst, src + p.c0, cols * sizeof(float));
      continue;
    }
    for (int64_t g = 0; g < layout.groups; ++g)
      std::memcpy(dst + g * cols, src + g * dim + p.c0, cols * sizeof(float));
    for (int64_t e = 0; e < layout.extra; ++e)
      dst[layout.groups * cols + e] = src[layout.groups * dim + e];
  }
}

}  // namespace dlrec::dist::detail
