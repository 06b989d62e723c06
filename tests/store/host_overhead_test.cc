// The host tier's per-entry cost (kHostEntryOverhead beyond the row) against what the heap
// really gives it: glibc's mallinfo2 before and after filling N rows, for several row sizes. The
// bound a config sets must hold (the estimate is not below the real cost) and not waste much
// (the estimate is not far above it). Skips visibly where mallinfo2 does not see the heap
// (another libc, or a sanitizer's allocator).
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <vector>

#include "dlrec/store/embedding_store.h"

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define DLREC_TEST_HAS_MALLINFO2 1
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DLREC_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DLREC_TEST_SANITIZED 1
#endif
#endif

using namespace dlrec;

#ifdef DLREC_TEST_HAS_MALLINFO2
// Bytes allocated: chunks in the heap's arenas plus blocks mapped on their own (the map's
// bucket array, once large).
static size_t heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}
#endif

TEST(HostTierOverhead, TheEstimateCoversTheHeapBytesAnEntryTakes) {
#if !defined(DLREC_TEST_HAS_MALLINFO2) || defined(DLREC_TEST_SANITIZED)
  GTEST_SKIP() << "mallinfo2 (glibc >= 2.33, no sanitizer allocator) is needed to measure the heap";
#else
  // Several row counts: the map's bucket array grows in steps, so a bucket pointer costs an
  // entry 8 to 16 bytes depending on where the count falls.
  for (const int64_t row_count : {int64_t{12000}, int64_t{15000}, int64_t{25000}})
    for (const int64_t dim : {int64_t{1}, int64_t{4}, int64_t{16}, int64_t{33}, int64_t{64}}) {
      const std::vector<store::TableInfo> tables = {{"emb.0.weight", 0, row_count, dim}};
      std::vector<int64_t> ids(row_count);
      std::iota(ids.begin(), ids.end(), 0);
      const std::vector<float> rows(static_cast<size_t>(row_count * dim), 0.25f);
      const size_t before = heap_bytes();
      auto host = store::make_host_tier(tables, int64_t{1} << 40, 1);
      host->fill(0, ids.data(), row_count, rows.data());
      const size_t after = heap_bytes();
      ASSERT_EQ(host->stats.bytes, row_count * (dim * 4 + store::kHostEntryOverhead));
      const double per_entry = static_cast<double>(after - before) / row_count;
      const double overhead = per_entry - static_cast<double>(dim * 4);
      std::printf(
          "[  MEASURE ] %lld rows of dim %lld: %.1f heap bytes per entry, %.1f beyond the "
          "row (estimate %lld)\n",
          static_cast<long long>(row_count), static_cast<long long>(dim), per_entry, overhead,
          static_cast<long long>(store::kHostEntryOverhead));
      EXPECT_LE(overhead, static_cast<double>(store::kHostEntryOverhead))
          << "dim " << dim << ": the host tier would hold more bytes than its bound";
      EXPECT_GE(overhead, 0.75 * static_cast<double>(store::kHostEntryOverhead))
          << "dim " << dim << ": the estimate wastes a quarter of the bound";
    }
#endif
}
