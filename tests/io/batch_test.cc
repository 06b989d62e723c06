// io::Batch: appending rows and the one-id-per-row promise.
#include <gtest/gtest.h>

#include "dlrec/core/error.h"
#include "dlrec/io/batch.h"

namespace dlrec::io {
namespace {

// `rows` rows, 1 dense column, 2 features; feature 1 gets `extra` ids on row 0 when extra > 0.
Batch make(int64_t rows, int64_t first_id, int extra, bool promise) {
  Batch b;
  b.reset(1, 2);
  b.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<float>(r % 2));
    b.dense.push_back(static_cast<float>(first_id + r));
    for (int t = 0; t < 2; ++t) {
      const int n = (t == 1 && r == 0) ? 1 + extra : 1;
      for (int k = 0; k < n; ++k) b.cat_indices[t].push_back(first_id + r + k);
      b.cat_offsets[t].push_back(static_cast<int64_t>(b.cat_indices[t].size()));
    }
  }
  b.one_id_per_row = promise;
  return b;
}

TEST(Batch, AppendConcatenatesRowsAndRebasesOffsets) {
  Batch a = make(2, 10, 1, false), b = make(3, 20, 0, false);
  a.append(b);
  EXPECT_EQ(a.rows, 5);
  EXPECT_EQ(a.dense, (std::vector<float>{10, 11, 20, 21, 22}));
  EXPECT_EQ(a.cat_offsets[1], (std::vector<int64_t>{0, 2, 3, 4, 5, 6}));
  EXPECT_EQ(a.cat_indices[1], (std::vector<int64_t>{10, 11, 11, 20, 21, 22}));
  Batch c;
  c.reset(1, 2);
  c.append_rows(a, 1, 3);
  EXPECT_EQ(c.rows, 2);
  EXPECT_EQ(c.cat_offsets[1], (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(c.cat_indices[1], (std::vector<int64_t>{11, 20}));
  EXPECT_THROW(c.append_rows(a, 4, 6), Error);
}

TEST(Batch, OneIdPerRowSurvivesOnlyWhenEveryPartHoldsIt) {
  Batch merged;
  merged.reset(1, 2);
  EXPECT_FALSE(merged.one_id_per_row);
  merged.append(make(2, 0, 0, true));  // empty + promise = promise
  EXPECT_TRUE(merged.one_id_per_row);
  merged.append(make(3, 5, 0, true));
  EXPECT_TRUE(merged.one_id_per_row);
  merged.append(make(1, 9, 0, false));  // one part without it: gone
  EXPECT_FALSE(merged.one_id_per_row);
  merged.append(make(1, 9, 0, true));  // and it does not come back
  EXPECT_FALSE(merged.one_id_per_row);
  merged.reset(1, 2);
  EXPECT_FALSE(merged.one_id_per_row);
}

}  // namespace
}  // namespace dlrec::io
