// KeptChunk: the compact form of the parsed rows kept between the ETL passes gives back the
// RawChunk rows bit for bit, in its narrow form (<= 1 value per row, values < 2^32) and in the
// wide one, for any row range; KeptArena hands out memory from shared blocks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/etl/kept_chunks.h"

namespace dlrec::etl {
namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// Rows [lo, hi) of `c` as a chunk of their own (what unpack() must give).
io::RawChunk rows_of(const io::RawChunk& c, int64_t lo, int64_t hi) {
  io::RawChunk out;
  out.reset(c.num_dense, c.num_cat);
  out.rows = hi - lo;
  out.first_line = c.first_line > 0 ? c.first_line + lo : 0;
  if (!c.label.empty()) out.label.assign(c.label.begin() + lo, c.label.begin() + hi);
  out.dense.assign(c.dense.begin() + lo * c.num_dense, c.dense.begin() + hi * c.num_dense);
  for (int t = 0; t < c.num_cat; ++t) {
    const auto& off = c.cat_offsets[t];
    out.cat_values[t].assign(c.cat_values[t].begin() + off[lo], c.cat_values[t].begin() + off[hi]);
    out.cat_offsets[t].clear();
    for (int64_t r = lo; r <= hi; ++r) out.cat_offsets[t].push_back(off[r] - off[lo]);
  }
  return out;
}

void expect_same(const io::RawChunk& a, const io::RawChunk& b) {
  ASSERT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.first_line, b.first_line);
  ASSERT_EQ(a.num_dense, b.num_dense);
  ASSERT_EQ(a.num_cat, b.num_cat);
  ASSERT_EQ(a.label.size(), b.label.size());
  for (size_t i = 0; i < a.label.size(); ++i)
    ASSERT_EQ(bits_of(a.label[i]), bits_of(b.label[i])) << "label " << i;
  ASSERT_EQ(a.dense.size(), b.dense.size());
  for (size_t i = 0; i < a.dense.size(); ++i)
    ASSERT_EQ(bits_of(a.dense[i]), bits_of(b.dense[i])) << "dense " << i;
  for (int t = 0; t < a.num_cat; ++t) {
    EXPECT_EQ(a.cat_values[t], b.cat_values[t]) << "column " << t;
    EXPECT_EQ(a.cat_offsets[t], b.cat_offsets[t]) << "column " << t;
  }
}

// A chunk of `rows` rows: column 0 one value per row (32-bit), column 1 one or none (32-bit),
// column 2 one or none with a value >= 2^32 somewhere, column 3 multi-hot (0-3 values),
// column 4 always missing.
io::RawChunk make_chunk(int64_t rows, bool labels, uint64_t seed) {
  std::mt19937_64 rng(seed);
  io::RawChunk c;
  c.reset(3, 5);
  c.first_line = 17;
  const float nan_payload = [] {
    uint32_t b = 0x7FC01234u;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }();
  for (int64_t r = 0; r < rows; ++r) {
    if (labels) c.label.push_back(r % 3 == 0 ? 1.f : 0.f);
    c.dense.push_back(static_cast<float>(rng() % 1000));
    c.dense.push_back(r % 7 == 0 ? nan_payload : -0.f);
    c.dense.push_back(std::numeric_limits<float>::quiet_NaN());
    c.cat_values[0].push_back(rng() & 0xFFFFFFFFu);
    if (rng() % 4) c.cat_values[1].push_back(r % 5 == 0 ? 0xFFFFFFFFu : rng() & 0xFFFFFFFFu);
    if (rng() % 3) c.cat_values[2].push_back(r == rows / 2 ? (uint64_t{1} << 32) : rng() & 0xFF);
    for (uint64_t k = rng() % 4; k > 0; --k) c.cat_values[3].push_back(rng());
    for (int t = 0; t < 5; ++t)
      c.cat_offsets[t].push_back(static_cast<int64_t>(c.cat_values[t].size()));
    ++c.rows;
  }
  return c;
}

TEST(KeptChunkTest, UnpackGivesTheRowsBackBitForBit) {
  KeptArena arena;
  for (int64_t rows : {0, 1, 63, 64, 65, 1000, 8192}) {
    for (bool labels : {true, false}) {
      const io::RawChunk c = make_chunk(rows, labels, static_cast<uint64_t>(rows));
      const std::vector<std::pair<int64_t, int64_t>> ranges = {
          {0, rows}, {0, rows / 2}, {rows / 3, rows}, {rows / 2, rows / 2}};
      for (auto [lo, hi] : ranges) {
        KeptChunk k = KeptChunk::keep(c, lo, hi, arena);
        EXPECT_EQ(k.rows(), hi - lo);
        // Used chunks: unpack reuses them (fewer rows, more rows, other column counts) and
        // must leave nothing of their old rows.
        io::RawChunk wider;
        wider.reset(1, 7);
        for (io::RawChunk out : {make_chunk(5, true, 99), make_chunk(9000, true, 98), wider}) {
          k.unpack(out);
          expect_same(out, rows_of(c, lo, hi));
        }
      }
    }
  }
}

// make_chunk without its multi-hot column (at most one value per row everywhere), with the
// facts a parser would record (io::RawChunk::CatFacts) from its offsets; `narrow`: the bits.
io::RawChunk with_facts(int64_t rows, uint64_t seed, uint64_t narrow) {
  io::RawChunk c = make_chunk(rows, true, seed);
  c.cat_values.erase(c.cat_values.begin() + 3);
  c.cat_offsets.erase(c.cat_offsets.begin() + 3);
  c.num_cat = 4;
  const int64_t words = (rows + 63) / 64;
  c.cat_facts.rows = rows;
  c.cat_facts.narrow = narrow;
  c.cat_facts.counts.assign(4, 0);
  c.cat_facts.present.assign(static_cast<size_t>(4 * words), 0);
  for (int t = 0; t < 4; ++t) {
    c.cat_facts.counts[t] = static_cast<int64_t>(c.cat_values[t].size());
    for (int64_t r = 0; r < rows; ++r)
      if (c.cat_offsets[t][r + 1] > c.cat_offsets[t][r])
        c.cat_facts.present[t * words + r / 64] |= uint64_t{1} << (r % 64);
  }
  return c;
}

// keep() of a whole chunk takes a narrow column's bitmap from the parser's facts instead of
// its offsets: the same bytes kept and the same rows back as without them (the column with a
// value >= 2^32, 2, not narrow there, is kept wide as before); a part of the chunk, or a chunk
// cut after parsing, is kept from its offsets. unpack() into a chunk that had facts leaves none.
TEST(KeptChunkTest, ParserFactsGiveTheSameKeptRows) {
  KeptArena arena;
  for (int64_t rows : {1, 63, 64, 65, 4096, 5000}) {
    io::RawChunk c = with_facts(rows, 11 + rows, 0b1011);
    ASSERT_NE(c.facts(), nullptr);
    io::RawChunk plain = c;
    plain.cat_facts.clear();
    ASSERT_EQ(plain.facts(), nullptr);
    const KeptChunk k = KeptChunk::keep(c, 0, rows, arena);
    const KeptChunk p = KeptChunk::keep(plain, 0, rows, arena);
    EXPECT_EQ(k.bytes(), p.bytes()) << rows;
    io::RawChunk out = c;  // has facts, which unpack must clear
    k.unpack(out);
    expect_same(out, plain);
    EXPECT_EQ(out.facts(), nullptr);
    if (rows > 2) {
      KeptChunk part = KeptChunk::keep(c, 1, rows - 1, arena);
      part.unpack(out);
      expect_same(out, rows_of(plain, 1, rows - 1));
      io::RawChunk cut = rows_of(c, 0, rows - 1);
      cut.cat_facts = c.cat_facts;  // stale: one row fewer
      EXPECT_EQ(cut.facts(), nullptr);
      KeptChunk::keep(cut, 0, rows - 1, arena).unpack(out);
      expect_same(out, rows_of(plain, 0, rows - 1));
    }
  }
}

TEST(KeptChunkTest, NarrowColumnsTakeFourBytesPerValue) {
  // Criteo-like: 1 byte per label, 4 per dense value, 4 per key, a bitmap where values miss.
  io::RawChunk c;
  c.reset(2, 2);
  const int64_t rows = 6400;
  for (int64_t r = 0; r < rows; ++r) {
    c.label.push_back(r % 2 ? 1.f : 0.f);
    c.dense.push_back(1.f);
    c.dense.push_back(2.f);
    c.cat_values[0].push_back(static_cast<uint64_t>(r) * 2654435761u & 0xFFFFFFFFu);
    if (r % 10) c.cat_values[1].push_back(static_cast<uint64_t>(r));
    for (int t = 0; t < 2; ++t)
      c.cat_offsets[t].push_back(static_cast<int64_t>(c.cat_values[t].size()));
    ++c.rows;
  }
  KeptArena arena;
  KeptChunk k = KeptChunk::keep(c, 0, rows, arena);
  const int64_t want = rows * 1 + rows * 2 * 4 + rows * 4 + (rows - rows / 10) * 4 + rows / 8;
  EXPECT_EQ(k.bytes(), want);
  io::RawChunk out;
  k.unpack(out);
  expect_same(out, c);

  // A label other than 0/1 (here -0.0f, which must stay -0.0f) keeps 4-byte labels.
  c.label[7] = -0.f;
  KeptChunk k2 = KeptChunk::keep(c, 0, rows, arena);
  EXPECT_EQ(k2.bytes(), want + rows * 3);
  k2.unpack(out);
  expect_same(out, c);
}

TEST(KeptChunkTest, ArenaBlocksAreSharedAndLargeRequestsGetTheirOwn) {
  KeptArena arena(false, size_t{2} << 20);
  std::shared_ptr<char> b1, b2, b3;
  char* p1 = arena.alloc(100, b1);
  char* p2 = arena.alloc(100, b2);
  EXPECT_EQ(b1, b2);                  // one block
  EXPECT_EQ(p2, p1 + 104);            // 8-byte aligned
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p1) % 8, 0u);
  std::memset(p1, 1, 100);
  char* p3 = arena.alloc(size_t{5} << 20, b3);  // larger than a block
  std::memset(p3, 2, size_t{5} << 20);
  EXPECT_NE(b3, b1);
  EXPECT_EQ(arena.mapped_bytes(), (int64_t{2} << 20) + (int64_t{6} << 20));
  KeptChunk::keep(make_chunk(10, true, 1), 0, 10, arena);  // in the rest of the big block
  EXPECT_EQ(arena.mapped_bytes(), (int64_t{2} << 20) + (int64_t{6} << 20));
  b2.reset();
  EXPECT_EQ(p1[99], 1);  // b1 still holds the first block
}

TEST(KeptChunkTest, ArenaBlocksGrowWithTheData) {
  KeptArena arena;  // blocks of up to 64 MB
  std::shared_ptr<char> b;
  arena.alloc(100, b);
  EXPECT_EQ(arena.mapped_bytes(), int64_t{2} << 20);  // a small input maps a small block
  int64_t used = 100;
  for (int i = 0; i < 100; ++i) {
    char* p = arena.alloc(size_t{1} << 20, b);
    p[0] = p[(1 << 20) - 1] = 1;
    used += int64_t{1} << 20;
    EXPECT_LE(arena.mapped_bytes(), 2 * used + (int64_t{2} << 20)) << "after " << i + 1 << " MB";
  }
  EXPECT_GE(arena.mapped_bytes(), used);
  arena.finish();
}

TEST(KeptChunkTest, BadRangeIsAnError) {
  KeptArena arena;
  const io::RawChunk c = make_chunk(10, true, 3);
  EXPECT_THROW(KeptChunk::keep(c, 5, 11, arena), Error);
  EXPECT_THROW(KeptChunk::keep(c, 6, 5, arena), Error);
  io::RawChunk bad = c;
  bad.label.pop_back();
  EXPECT_THROW(KeptChunk::keep(bad, 0, 10, arena), Error);
}

}  // namespace
TEST(HugePagesTest, ThpModeFromTheSysfsText) {
  EXPECT_TRUE(thp_madvise_allowed("always [madvise] never\n"));
  EXPECT_TRUE(thp_madvise_allowed("[always] madvise never\n"));
  EXPECT_FALSE(thp_madvise_allowed("always madvise [never]\n"));
  EXPECT_FALSE(thp_madvise_allowed(""));  // the file could not be read
  EXPECT_FALSE(thp_madvise_allowed("always madvise never"));  // no mode marked
}

TEST(HugePagesTest, FreeHugeBlocksFromBuddyinfo) {
  // Orders 0..10 of 4 KB pages: orders 9 (2 MB) and 10 (4 MB) count for 2 MB huge pages.
  const std::string text =
      "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n"
      "Node 0, zone   Normal  18343  15650   9513   7383   5228   3139   2219   1603    486    174   4091 \n";
  const int64_t p = 4096, mb2 = int64_t{2} << 20;
  const int64_t want = (1 + 174) * (p << 9) + (3 + 4091) * (p << 10);
  EXPECT_EQ(free_huge_block_bytes(text, p, mb2), want);
  // 1 MB "huge pages" also count order 8.
  EXPECT_EQ(free_huge_block_bytes(text, p, mb2 / 2), want + (1 + 486) * (p << 8));
  // Blank lines are skipped; a zone with fewer orders than 2 MB counts nothing.
  EXPECT_EQ(free_huge_block_bytes("\nNode 0, zone DMA 5 6 7\n", p, mb2), 0);
}

TEST(HugePagesTest, MalformedBuddyinfoIsUnknown) {
  const int64_t p = 4096, mb2 = int64_t{2} << 20;
  EXPECT_EQ(free_huge_block_bytes("", p, mb2), -1);                               // no zone
  EXPECT_EQ(free_huge_block_bytes("Node 0, zone Normal 1 2 x 4\n", p, mb2), -1);  // not a count
  EXPECT_EQ(free_huge_block_bytes("Node 0, zone Normal\n", p, mb2), -1);          // no counts
  EXPECT_EQ(free_huge_block_bytes("Node 0, zone Normal 1 -2\n", p, mb2), -1);     // negative
  EXPECT_EQ(free_huge_block_bytes("Zone 0, node Normal 1 2\n", p, mb2), -1);      // other form
  EXPECT_EQ(free_huge_block_bytes("Node 0, zone Normal 1 2\n", 0, mb2), -1);      // bad page
}

}  // namespace dlrec::etl
