// Internal: where the data-parallel embedding exchange of the CUDA graph engine puts each
// travelling table's values (embedding_node_cuda.h, docs/DISTRIBUTED.md, "Table-wise sharding on
// the GPUs" and "Column-wise tables on the GPUs"). Host code only (no CUDA), tested in CI.
//
// A "position" is a run of an embedding layer's columns that one owner pools and updates: a whole
// table-wise table (width dim) or one column piece of a column-wise table. Owner r's row in the
// exchange holds its table-wise tables (in table order), then its column pieces grouped by width
// (increasing), then by table: W[r] values per row; the blocks lie owner after owner, owner r's
// block [B, W[r]] at B * F[r] (F[r]: the values per row of the owners before r). Element (p, b, c),
// c < width[p], lies at B * first[p] + b * count[p] + index[p] + c in the blocks and at column
// col[p] + c of row b of the activation. Every field counts values, so a layout of whole tables
// has the addresses of one counted in tables times dim.
#pragma once

#include <cstdint>
#include <vector>

namespace dlrec::model::gpu_graph::dp {

// Engine::dp.table_owner entries that are not a rank: a table split by rows over every GPU, a
// table replicated on every GPU (its dense gradient all-reduced), a table split by columns (its
// pieces in Engine::dp.col_pieces).
constexpr int kRowWiseOwner = -1;
constexpr int kReplicatedOwner = -2;
constexpr int kColumnWiseOwner = -3;
// A hybrid table (docs/DISTRIBUTED.md, "Hybrid tables on the GPUs"): its frequent ids [0, F) on
// every GPU, the others served by one GPU (Engine::dp.hybrid names it and F).
constexpr int kHybridOwner = -4;

// One hybrid table: ids [0, frequent) replicated on every GPU, ids >= frequent pooled and
// updated by `owner`, which holds the whole table.
struct HybridTable {
  int64_t table = 0;
  int owner = 0;
  int64_t frequent = 0;
};

// One column piece of a column-wise table: columns [c0, c1) of table `table`, held by `rank`.
struct ColPiece {
  int64_t table = 0;
  int rank = 0;
  int64_t c0 = 0, c1 = 0;
};

struct ExchangeLayout {
  // Per position, owner-major (the device TwLayout's arrays).
  std::vector<int32_t> col, width, first, count, index;
  std::vector<int64_t> W, F;        // per rank: values per row of its block, values before it
  std::vector<int64_t> tw_mine;     // this rank's table-wise tables, in order
  int64_t max_width = 0, unit = 0;  // the widest position; gcd of every field (0: no position)
  // This rank's column pieces of one width, at columns [col, col + tables.size() * width) of
  // its row (after its table-wise tables): table tables[k], columns [c0s[k], c0s[k] + width).
  struct Group {
    int64_t width = 0, col = 0;
    std::vector<int64_t> tables, c0s;
  };
  std::vector<Group> groups;
  int64_t positions() const { return static_cast<int64_t>(col.size()); }
  // col, width, first, count, index concatenated (the device copy).
  std::vector<int32_t> packed() const;
};

// owner[t]: a rank, or kRowWiseOwner / kReplicatedOwner (no position), or kColumnWiseOwner (its
// positions are its pieces, which must cover [0, dim) once, at most one per rank). Throws on an
// inconsistent input (a bug upstream: the planner validated the configuration).
ExchangeLayout plan_exchange(const std::vector<int>& owner, const std::vector<ColPiece>& pieces,
                             int64_t dim, int ranks, int rank);

// The positions of whole tables tables[k] on one rank with no exchange (replicated and row-wise
// tables pooled into [B, K * dim]): col t * dim, width dim, first 0, count K * dim, index k * dim.
ExchangeLayout local_layout(const std::vector<int64_t>& tables, int64_t dim);

}  // namespace dlrec::model::gpu_graph::dp
