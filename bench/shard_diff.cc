// Compares the rows of two shard files, whatever their format versions (io::ShardReader reads
// versions 1 and 2): for checking that a change of the shard encoding keeps every value.
//
//   shard_diff A.shard B.shard
//
// Prints "same N rows" and exits 0 when the layouts and all rows (labels, dense values bit for
// bit, categorical offsets and ids) are equal; else names the first difference and exits 1.
#include <cstdio>
#include <cstring>
#include <string>

#include "dlrec/core/error.h"
#include "dlrec/io/shard.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: shard_diff A.shard B.shard\n");
    return 2;
  }
  try {
    dlrec::io::ShardReader a(argv[1]), b(argv[2]);
    const auto& la = a.layout();
    const auto& lb = b.layout();
    if (la.num_dense != lb.num_dense || la.cardinalities != lb.cardinalities ||
        la.multi_hot != lb.multi_hot) {
      std::printf("different layouts\n");
      return 1;
    }
    if (a.rows() != b.rows()) {
      std::printf("different row counts: %lld vs %lld\n", static_cast<long long>(a.rows()),
                  static_cast<long long>(b.rows()));
      return 1;
    }
    const int64_t step = 1 << 16;
    for (int64_t r = 0; r < a.rows(); r += step) {
      const int64_t n = std::min(step, a.rows() - r);
      dlrec::io::Batch x, y;
      a.read(r, n, x);
      b.read(r, n, y);
      const bool same =
          x.labels == y.labels && x.dense.size() == y.dense.size() &&
          std::memcmp(x.dense.data(), y.dense.data(), x.dense.size() * sizeof(float)) == 0 &&
          x.cat_offsets == y.cat_offsets && x.cat_indices == y.cat_indices;
      if (!same) {
        std::printf("rows [%lld, %lld) differ\n", static_cast<long long>(r),
                    static_cast<long long>(r + n));
        return 1;
      }
    }
    std::printf("same %lld rows\n", static_cast<long long>(a.rows()));
  } catch (const dlrec::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
