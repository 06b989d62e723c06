// The data-parallel embedding exchange's layout (embedding_exchange_layout.h).
#include "model/layers/embedding_exchange_layout.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <tuple>

#include "dlrec/core/error.h"

namespace dlrec::model::gpu_graph::dp {

namespace {

struct Pos {
  int64_t col, width;
};

// Fills the per-position fields of one owner's row (its positions in order) and the bounds.
void add_row(ExchangeLayout& l, const std::vector<Pos>& row, int64_t F, int64_t W) {
  int64_t at = 0;
  for (const Pos& p : row) {
    for (int64_t x : {p.col, p.width, F, W, at, p.col + p.width})
      DLREC_CHECK(x <= std::numeric_limits<int32_t>::max(),
                  "embedding exchange: a layout field exceeds int32 (", x, ")");
    l.col.push_back(static_cast<int32_t>(p.col));
    l.width.push_back(static_cast<int32_t>(p.width));
    l.first.push_back(static_cast<int32_t>(F));
    l.count.push_back(static_cast<int32_t>(W));
    l.index.push_back(static_cast<int32_t>(at));
    l.max_width = std::max(l.max_width, p.width);
    for (int64_t x : {p.col, p.width, F, W, at}) l.unit = std::gcd(l.unit, x);
    at += p.width;
  }
}

}  // namespace

std::vector<int32_t> ExchangeLayout::packed() const {
  std::vector<int32_t> out;
  for (const auto* a : {&col, &width, &first, &count, &index})
    out.insert(out.end(), a->begin(), a->end());
  return out;
}

ExchangeLayout plan_exchange(const std::vector<int>& owner, const std::vector<ColPiece>& pieces,
                             int64_t dim, int ranks, int rank) {
  DLREC_CHECK(dim > 0 && ranks > 0 && rank >= 0 && rank < ranks, "embedding exchange: dim ", dim,
              ", rank ", rank, " of ", ranks, " (bug)");
  const int64_t T = static_cast<int64_t>(owner.size());
  for (int64_t t = 0; t < T; ++t)
    DLREC_CHECK((owner[t] >= kColumnWiseOwner || owner[t] == kHybridOwner) && owner[t] < ranks,
                "embedding exchange: owner ", owner[t], " of table ", t, " with ", ranks,
                " ranks (bug)");
  // Each column-wise table's pieces: on ranks in range, one per rank, covering [0, dim) once.
  std::vector<std::vector<ColPiece>> by_table(T);
  for (const ColPiece& p : pieces) {
    DLREC_CHECK(p.table >= 0 && p.table < T && owner[p.table] == kColumnWiseOwner,
                "embedding exchange: a column piece of table ", p.table,
                ", which is not column-wise (bug)");
    DLREC_CHECK(p.rank >= 0 && p.rank < ranks && p.c0 >= 0 && p.c0 < p.c1 && p.c1 <= dim,
                "embedding exchange: piece [", p.c0, ", ", p.c1, ") of table ", p.table,
                " on rank ", p.rank, " (dim ", dim, ", ", ranks, " ranks; bug)");
    by_table[p.table].push_back(p);
  }
  for (int64_t t = 0; t < T; ++t) {
    if (owner[t] != kColumnWiseOwner) continue;
    auto& v = by_table[t];
    std::sort(v.begin(), v.end(), [](const ColPiece& a, const ColPiece& b) { return a.c0 < b.c0; });
    int64_t at = 0;
    std::vector<char> seen(ranks, 0);
    for (const ColPiece& p : v) {
      DLREC_CHECK(p.c0 == at, "embedding exchange: table ", t, "'s column pieces do not cover [0, ",
                  dim, ") once (bug)");
      DLREC_CHECK(!seen[p.rank], "embedding exchange: table ", t, " has two pieces on rank ",
                  p.rank, " (bug)");
      seen[p.rank] = 1;
      at = p.c1;
    }
    DLREC_CHECK(at == dim, "embedding exchange: table ", t, "'s column pieces do not cover [0, ",
                dim, ") once (bug)");
  }
  ExchangeLayout l;
  l.W.assign(ranks, 0);
  l.F.assign(ranks, 0);
  std::vector<std::vector<Pos>> rows(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (int64_t t = 0; t < T; ++t)
      if (owner[t] == r) {
        rows[r].push_back({t * dim, dim});
        if (r == rank) l.tw_mine.push_back(t);
      }
    std::vector<std::tuple<int64_t, int64_t, int64_t>> mine;  // width, table, c0
    for (int64_t t = 0; t < T; ++t)
      for (const ColPiece& p : by_table[t])
        if (p.rank == r) mine.emplace_back(p.c1 - p.c0, t, p.c0);
    std::sort(mine.begin(), mine.end());
    int64_t at = static_cast<int64_t>(rows[r].size()) * dim;
    for (const auto& [w, t, c0] : mine) {
      rows[r].push_back({t * dim + c0, w});
      if (r == rank) {
        if (l.groups.empty() || l.groups.back().width != w) l.groups.push_back({w, at, {}, {}});
        l.groups.back().tables.push_back(t);
        l.groups.back().c0s.push_back(c0);
      }
      at += w;
    }
    l.W[r] = at;
    if (r > 0) l.F[r] = l.F[r - 1] + l.W[r - 1];
  }
  for (int r = 0; r < ranks; ++r) add_row(l, rows[r], l.F[r], l.W[r]);
  return l;
}

ExchangeLayout local_layout(const std::vector<int64_t>& tables, int64_t dim) {
  ExchangeLayout l;
  std::vector<Pos> row;
  for (int64_t t : tables) row.push_back({t * dim, dim});
  add_row(l, row, 0, static_cast<int64_t>(tables.size()) * dim);
  l.W = {static_cast<int64_t>(tables.size()) * dim};
  l.F = {0};
  return l;
}

}  // namespace dlrec::model::gpu_graph::dp
