// The data-parallel embedding exchange's host layout (src/model/layers/
// embedding_exchange_layout.h): whole tables keep the addresses of the table-counted layout,
// column pieces cover every travelling column once in disjoint blocks, widths form groups.
#include "../../src/model/layers/embedding_exchange_layout.h"

#include <gtest/gtest.h>

#include <vector>

#include "dlrec/core/error.h"

namespace dlrec::model::gpu_graph::dp {
namespace {

// Every element (p, b, c) of the layout on B rows: each travelling activation column of each
// row is reached exactly once, each block slot at most once, owner r's positions inside its block
// [B * F[r], B * (F[r] + W[r])), and the blocks fill [0, B * sum W) exactly.
void expect_exchange_covers(const ExchangeLayout& l, const std::vector<int>& owner, int64_t dim,
                            int64_t B) {
  const int64_t T = static_cast<int64_t>(owner.size());
  int64_t total = 0;
  for (int64_t w : l.W) total += w;
  std::vector<int> act(B * T * dim, 0), blk(B * total, 0);
  for (int64_t p = 0; p < l.positions(); ++p) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < l.width[p]; ++c) {
        const int64_t at = B * l.first[p] + b * l.count[p] + l.index[p] + c;
        ASSERT_GE(at, B * l.first[p]);
        ASSERT_LT(at, B * (l.first[p] + l.count[p]));
        ASSERT_LT(at, B * total);
        ++blk[at];
        ++act[b * T * dim + l.col[p] + c];
      }
  }
  for (int64_t i = 0; i < B * total; ++i) EXPECT_EQ(blk[i], 1) << "block slot " << i;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < dim; ++c) {
        const bool travels = owner[t] >= 0 || owner[t] == kColumnWiseOwner;
        EXPECT_EQ(act[(b * T + t) * dim + c], travels ? 1 : 0) << "row " << b << " table " << t;
      }
}

TEST(ExchangeLayout, WholeTablesKeepTheTableCountedAddresses) {
  const std::vector<int> owner = {1, kReplicatedOwner, 0, 1, kRowWiseOwner, 0, 1};
  const int64_t dim = 8;
  const ExchangeLayout l = plan_exchange(owner, {}, dim, 2, 1);
  // The old layout: tables by owner then index; first / count / index in tables.
  const std::vector<int64_t> table = {2, 5, 0, 3, 6}, first = {0, 0, 2, 2, 2},
                             count = {2, 2, 3, 3, 3}, index = {0, 1, 0, 1, 2};
  ASSERT_EQ(l.positions(), 5);
  for (int64_t p = 0; p < 5; ++p) {
    EXPECT_EQ(l.col[p], table[p] * dim);
    EXPECT_EQ(l.width[p], dim);
    EXPECT_EQ(l.first[p], first[p] * dim);
    EXPECT_EQ(l.count[p], count[p] * dim);
    EXPECT_EQ(l.index[p], index[p] * dim);
  }
  EXPECT_EQ(l.W, (std::vector<int64_t>{16, 24}));
  EXPECT_EQ(l.F, (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(l.tw_mine, (std::vector<int64_t>{0, 3, 6}));
  EXPECT_TRUE(l.groups.empty());
  EXPECT_EQ(l.max_width, dim);
  EXPECT_EQ(l.unit, dim);
  expect_exchange_covers(l, owner, dim, 3);

  const ExchangeLayout loc = local_layout({1, 4}, dim);
  ASSERT_EQ(loc.positions(), 2);
  EXPECT_EQ(loc.col, (std::vector<int32_t>{8, 32}));
  EXPECT_EQ(loc.first, (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(loc.count, (std::vector<int32_t>{16, 16}));
  EXPECT_EQ(loc.index, (std::vector<int32_t>{0, 8}));
  EXPECT_EQ(loc.packed().size(), 10u);
}

TEST(ExchangeLayout, ColumnPiecesOnTwoRanksCoverEveryColumnOnce) {
  // Table 2 split [0, 4) on rank 1 and [4, 8) on rank 0, beside table-wise tables.
  const std::vector<int> owner = {0, 1, kColumnWiseOwner, kReplicatedOwner};
  const std::vector<ColPiece> pieces = {{2, 1, 0, 4}, {2, 0, 4, 8}};
  for (int rank = 0; rank < 2; ++rank) {
    const ExchangeLayout l = plan_exchange(owner, pieces, 8, 2, rank);
    EXPECT_EQ(l.W, (std::vector<int64_t>{12, 12}));
    EXPECT_EQ(l.F, (std::vector<int64_t>{0, 12}));
    EXPECT_EQ(l.max_width, 8);
    EXPECT_EQ(l.unit, 4);
    ASSERT_EQ(l.groups.size(), 1u);
    EXPECT_EQ(l.groups[0].width, 4);
    EXPECT_EQ(l.groups[0].col, 8);  // after the rank's one table-wise table
    EXPECT_EQ(l.groups[0].tables, (std::vector<int64_t>{2}));
    EXPECT_EQ(l.groups[0].c0s, (std::vector<int64_t>{rank == 0 ? 4 : 0}));
    EXPECT_EQ(l.tw_mine, (std::vector<int64_t>{rank}));
    expect_exchange_covers(l, owner, 8, 5);
  }
}

TEST(ExchangeLayout, UnevenPiecesOnFourRanksAndARankWithout) {
  // dim 16 in pieces of 4, 4 and 8 (rank 2 holds none), a second column-wise table in 4 x 4.
  const std::vector<int> owner = {kColumnWiseOwner, 2, kColumnWiseOwner};
  const std::vector<ColPiece> pieces = {{0, 3, 0, 4}, {0, 0, 4, 8},  {0, 1, 8, 16}, {2, 0, 0, 4},
                                        {2, 1, 4, 8}, {2, 2, 8, 12}, {2, 3, 12, 16}};
  const ExchangeLayout l1 = plan_exchange(owner, pieces, 16, 4, 1);
  EXPECT_EQ(l1.W, (std::vector<int64_t>{8, 12, 20, 8}));
  EXPECT_EQ(l1.F, (std::vector<int64_t>{0, 8, 20, 40}));
  // Rank 1: width 4 (table 2) before width 8 (table 0): two groups.
  ASSERT_EQ(l1.groups.size(), 2u);
  EXPECT_EQ(l1.groups[0].width, 4);
  EXPECT_EQ(l1.groups[0].col, 0);
  EXPECT_EQ(l1.groups[0].tables, (std::vector<int64_t>{2}));
  EXPECT_EQ(l1.groups[0].c0s, (std::vector<int64_t>{4}));
  EXPECT_EQ(l1.groups[1].width, 8);
  EXPECT_EQ(l1.groups[1].col, 4);
  EXPECT_EQ(l1.groups[1].tables, (std::vector<int64_t>{0}));
  EXPECT_EQ(l1.groups[1].c0s, (std::vector<int64_t>{8}));
  EXPECT_EQ(l1.unit, 4);
  expect_exchange_covers(l1, owner, 16, 3);
  // Rank 0: two pieces of width 4 in one group, by table.
  const ExchangeLayout l0 = plan_exchange(owner, pieces, 16, 4, 0);
  ASSERT_EQ(l0.groups.size(), 1u);
  EXPECT_EQ(l0.groups[0].tables, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(l0.groups[0].c0s, (std::vector<int64_t>{4, 0}));
  // Rank 2: its table-wise table and one piece.
  const ExchangeLayout l2 = plan_exchange(owner, pieces, 16, 4, 2);
  EXPECT_EQ(l2.tw_mine, (std::vector<int64_t>{1}));
  ASSERT_EQ(l2.groups.size(), 1u);
  EXPECT_EQ(l2.groups[0].col, 16);
  // Only column-wise tables on 4 ranks, one rank without a piece: an empty block.
  const std::vector<int> only = {kColumnWiseOwner};
  const std::vector<ColPiece> three = {{0, 0, 0, 4}, {0, 1, 4, 8}, {0, 3, 8, 16}};
  const ExchangeLayout l3 = plan_exchange(only, three, 16, 4, 2);
  EXPECT_EQ(l3.W, (std::vector<int64_t>{4, 4, 0, 8}));
  EXPECT_TRUE(l3.groups.empty());
  expect_exchange_covers(l3, only, 16, 2);
}

TEST(ExchangeLayout, InconsistentPiecesAreErrors) {
  const std::vector<int> owner = {kColumnWiseOwner, 0};
  auto bad = [&](std::vector<ColPiece> p, const std::vector<int>& own) {
    EXPECT_THROW(plan_exchange(own, p, 8, 2, 0), dlrec::Error);
  };
  bad({{0, 0, 0, 4}}, owner);                              // a gap
  bad({{0, 0, 0, 4}, {0, 1, 2, 8}}, owner);                // overlap
  bad({{0, 0, 0, 4}, {0, 0, 4, 8}}, owner);                // two on one rank
  bad({{0, 0, 0, 4}, {0, 2, 4, 8}}, owner);                // rank out of range
  bad({{0, 0, 0, 4}, {0, 1, 4, 8}, {1, 0, 0, 8}}, owner);  // a piece of a table-wise table
  bad({{0, 0, 0, 4}, {0, 1, 4, 9}}, owner);                // past dim
  bad({}, {0, 5});                                         // owner out of range
  EXPECT_NO_THROW(plan_exchange(owner, {{0, 0, 0, 4}, {0, 1, 4, 8}}, 8, 2, 0));
}

}  // namespace
}  // namespace dlrec::model::gpu_graph::dp
