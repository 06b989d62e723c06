// Parquet encodings DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY and
// BYTE_STREAM_SPLIT: pages encoded here from Encodings.md (parquet_pages.h), pages V1 and V2 with
// nulls read back; malformed headers, bit widths, lengths and prefixes each a named error.
#include "../src/io/parquet_encodings.h"

#include <gtest/gtest.h>

#include <memory>

#include "io/parquet_pages.h"

namespace dlrec::io {
namespace {

using namespace pqtest;  // NOLINT: the test's builders

// ---- encodings

struct EncodingCase {
  const char* label;
  int32_t type;
  int32_t encoding;
};

const std::vector<EncodingCase>& encoding_cases() {
  static const std::vector<EncodingCase> cases = {
      {"delta_int32", pq::kInt32, pq::kDeltaBinaryPacked},
      {"delta_int64", pq::kInt64, pq::kDeltaBinaryPacked},
      {"delta_length", pq::kByteArray, pq::kDeltaLengthByteArray},
      {"delta_byte_array", pq::kByteArray, pq::kDeltaByteArray},
      {"split_float", pq::kFloat, pq::kByteStreamSplit},
      {"split_double", pq::kDouble, pq::kByteStreamSplit},
      {"split_int32", pq::kInt32, pq::kByteStreamSplit},
      {"split_int64", pq::kInt64, pq::kByteStreamSplit},
  };
  return cases;
}

// Extremes (wrapping deltas), a constant run (bit width 0), random values; strings with shared
// prefixes, empty and repeated values.
ParquetColumnData column_for(int32_t type, int64_t rows, bool nullable, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ParquetColumnData c;
  c.rows = rows;
  const char* words[] = {"axis", "axle", "babble", "babyhood", "", "baby", "δέλτα", "δέλτα"};
  for (int64_t r = 0; r < rows; ++r) {
    const bool present = !nullable || rng() % 5 != 0;
    c.valid.push_back(present);
    const uint64_t x = present ? rng() : 0;
    const bool extreme = r % 50 < 6, constant = r >= 300 && r < 500;
    switch (type) {
      case pq::kInt32:
        c.ints.push_back(extreme    ? (r % 2 ? INT32_MIN : INT32_MAX)
                         : constant ? 7
                                    : static_cast<int32_t>(static_cast<uint32_t>(x)));
        break;
      case pq::kInt64:
        c.ints.push_back(extreme    ? (r % 2 ? INT64_MIN : INT64_MAX)
                         : constant ? -7
                                    : static_cast<int64_t>(x >> (x % 60)));
        break;
      case pq::kFloat:
        c.reals.push_back(static_cast<float>(static_cast<int64_t>(x % 20001) - 10000) / 64.f);
        break;
      case pq::kDouble:
        c.reals.push_back(static_cast<double>(static_cast<int64_t>(x)) * 1e-7);
        break;
      default:
        c.strings.push_back(constant ? "same" : std::string(words[x % 8]) + std::to_string(x % 13));
    }
    if (!present) {
      if (!c.ints.empty()) c.ints.back() = 0;
      if (!c.reals.empty()) c.reals.back() = 0;
      if (!c.strings.empty()) c.strings.back().clear();
    }
  }
  return c;
}

template <class T>
void put_le(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// The encoder of a case; DELTA_BINARY_PACKED pages cycle through block layouts, with junk bit
// widths in the last block's unused miniblocks.
Encoder encoder_for(const EncodingCase& ec) {
  auto page = std::make_shared<int>(0);
  return [ec, page](const ParquetColumnData& c, const std::vector<int64_t>& slots) {
    if (ec.encoding == pq::kDeltaBinaryPacked) {
      static const uint64_t layouts[][2] = {{128, 4}, {256, 8}, {128, 1}};
      const auto& l = layouts[(*page)++ % 3];
      std::vector<int64_t> v;
      for (int64_t s : slots) v.push_back(c.ints[s]);
      return dbp(v, ec.type == pq::kInt32 ? 32 : 64, l[0], l[1], 0xC8);
    }
    if (ec.type == pq::kByteArray) {
      std::vector<std::string> v;
      for (int64_t s : slots) v.push_back(c.strings[s]);
      return ec.encoding == pq::kDeltaByteArray ? dba(v) : dlba(v);
    }
    std::string plain;
    for (int64_t s : slots) {
      if (ec.type == pq::kInt32) put_le(plain, static_cast<int32_t>(c.ints[s]));
      if (ec.type == pq::kInt64) put_le(plain, c.ints[s]);
      if (ec.type == pq::kFloat) put_le(plain, static_cast<float>(c.reals[s]));
      if (ec.type == pq::kDouble) put_le(plain, c.reals[s]);
    }
    return bss(plain, ec.type == pq::kInt32 || ec.type == pq::kFloat ? 4 : 8);
  };
}

class ParquetEncodingTest
    : public ::testing::TestWithParam<std::tuple<size_t, bool /*v2*/, bool /*nullable*/>> {};

TEST_P(ParquetEncodingTest, ReadsBackPagesV1AndV2WithNulls) {
  const auto [ci, v2, nullable] = GetParam();
  const EncodingCase& ec = encoding_cases()[ci];
  const ParquetColumnData c = column_for(ec.type, 1100, nullable, 7 + ci);
  const std::string path = temp_path(std::string(ec.label) + ".parquet");
  // V2 pages compressed (GZIP), V1 pages not.
  write_file(
      path, ec.type, nullable, v2 ? pq::kGzip : pq::kUncompressed,
      pages_of(c, nullable, 400, v2, ec.encoding, encoder_for(ec), v2 ? Packer(gzip) : nullptr),
      c.rows);
  expect_same(c, read_x(path), ec.label);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Encodings, ParquetEncodingTest,
                         ::testing::Combine(::testing::Range<size_t>(0, 8), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(encoding_cases()[std::get<0>(info.param)].label) +
                                  (std::get<1>(info.param) ? "_v2" : "_v1") +
                                  (std::get<2>(info.param) ? "_nullable" : "_required");
                         });

TEST(ParquetEncodings, DeltaBinaryPackedSpecExample) {
  // Encodings.md, example 2 (with a legal block of 128 values, one miniblock):
  // 7 5 3 1 2 3 4 5 -> min delta -2, relative deltas 0 0 0 3 3 3 3 on 2 bits.
  std::string d;
  put_uleb(d, 128);
  put_uleb(d, 1);
  put_uleb(d, 8);
  put_zigzag(d, 7);
  put_zigzag(d, -2);
  d.push_back(2);
  std::vector<uint64_t> rel(128, 0);
  for (int k = 3; k < 7; ++k) rel[k] = 3;
  put_bits(d, rel, 2);
  std::vector<int64_t> out;
  EXPECT_EQ(pq::delta_binary_packed_decode(reinterpret_cast<const uint8_t*>(d.data()), d.size(), 32,
                                           8, out, "ex"),
            d.size());
  EXPECT_EQ(out, (std::vector<int64_t>{7, 5, 3, 1, 2, 3, 4, 5}));
  EXPECT_EQ(dbp({7, 5, 3, 1, 2, 3, 4, 5}, 32, 128, 1), d);  // the test's encoder agrees
}

std::string dbp_error(const std::string& d, int bits, int64_t max_values) {
  std::vector<int64_t> out;
  return error_of([&] {
    pq::delta_binary_packed_decode(reinterpret_cast<const uint8_t*>(d.data()), d.size(), bits,
                                   max_values, out, "page");
  });
}

std::string dbp_header(uint64_t block, uint64_t minis, uint64_t count, int64_t first) {
  std::string d;
  put_uleb(d, block);
  put_uleb(d, minis);
  put_uleb(d, count);
  put_zigzag(d, first);
  return d;
}

TEST(ParquetEncodingsMalformed, DeltaBinaryPacked) {
  std::vector<int64_t> v;
  for (int i = 0; i < 300; ++i) v.push_back(i * i - 5000);
  const std::string good = dbp(v, 64);
  EXPECT_EQ(dbp_error(good, 64, 300), "(no error)");
  EXPECT_HAS(dbp_error(good.substr(0, 3), 64, 300), "page: the value count is past the end");
  EXPECT_HAS(dbp_error(std::string(12, '\xFF'), 64, 300), "is not a valid ULEB128 integer");
  EXPECT_HAS(dbp_error(dbp_header(100, 4, 2, 0), 64, 300),
             "page: block size 100 is not a positive multiple of 128");
  EXPECT_HAS(dbp_error(dbp_header(0, 4, 2, 0), 64, 300), "block size 0");
  EXPECT_HAS(dbp_error(dbp_header(128, 3, 2, 0), 64, 300),
             "3 miniblocks do not split a block of 128 values into multiples of 32");
  EXPECT_HAS(dbp_error(dbp_header(128, 0, 2, 0), 64, 300), "0 miniblocks");
  EXPECT_HAS(dbp_error(good, 64, 299), "the header declares 300 values, more than the page's 299");
  // Bit widths beyond the type's size.
  for (const auto& [bits, width] : {std::pair<int, int>{32, 33}, {64, 65}}) {
    std::string d = dbp_header(128, 4, 2, 0) + '\0';  // min delta 0
    d += std::string{static_cast<char>(width), 0, 0, 0} + std::string(32 * width / 8, '\0');
    EXPECT_HAS(dbp_error(d, bits, 10), "miniblock bit width " + std::to_string(width) +
                                           " exceeds the " + std::to_string(bits) +
                                           " bits of the values");
  }
  EXPECT_HAS(dbp_error(good.substr(0, good.size() - 3), 64, 300),
             "bytes is past the end of the data");
  EXPECT_HAS(dbp_error(dbp_header(128, 4, 2, 0) + '\0' + "\x01", 64, 10),
             "the bit widths of a block's 4 miniblocks are past the end");
  EXPECT_HAS(dbp_error(dbp_header(128, 4, 2, 0), 64, 10), "the block's min delta is past the end");
}

TEST(ParquetEncodingsMalformed, DeltaLengthAndDeltaByteArray) {
  auto dlba_error = [](const std::string& d, int64_t max_values) {
    std::vector<std::string_view> out;
    std::vector<int64_t> lengths;
    return error_of([&] {
      pq::delta_length_byte_array_decode(reinterpret_cast<const uint8_t*>(d.data()), d.size(),
                                         max_values, out, lengths, "page");
    });
  };
  auto dba_error = [](const std::string& d, int64_t max_values) {
    std::vector<std::string_view> out;
    std::string arena;
    return error_of([&] {
      pq::delta_byte_array_decode(reinterpret_cast<const uint8_t*>(d.data()), d.size(), max_values,
                                  arena, out, "page");
    });
  };
  EXPECT_EQ(dlba_error(dlba({"Hello", "World", "Foobar", "ABCDEF"}), 4), "(no error)");
  EXPECT_HAS(dlba_error(dbp({3, -1}, 32) + "abc", 4), "page: value 1 has a negative length -1");
  EXPECT_HAS(dlba_error(dbp({3, 10}, 32) + "abcdefg", 4),
             "page: value 1 of 10 bytes is past the end of the data (4 bytes left)");
  EXPECT_HAS(dlba_error(std::string("\x80\x01\x04"), 4), "page: lengths: the value count is past");

  EXPECT_EQ(dba_error(dba({"axis", "axle", "babble", "babyhood"}), 4), "(no error)");
  EXPECT_HAS(dba_error(dbp({0, 5}, 32) + dlba({"ab", "c"}), 4),
             "page: value 1 has prefix length 5 but the value before it has 2 bytes");
  EXPECT_HAS(dba_error(dbp({2}, 32) + dlba({"ab"}), 4), "value 0 has prefix length 2");
  EXPECT_HAS(dba_error(dbp({0, 1, 1}, 32) + dlba({"ab", "c"}), 4),
             "3 prefix lengths but 2 suffixes");
  EXPECT_HAS(dba_error(dbp({0, 1}, 32), 4), "page: suffixes: lengths: ");
  // Prefixes that would expand a 1 MiB page past the limit fail before allocating.
  std::vector<int64_t> prefix(1100, 1 << 20);
  prefix[0] = 0;
  std::vector<std::string> suffix(1100);
  suffix[0] = std::string(1 << 20, 'a');
  EXPECT_HAS(dba_error(dbp(prefix, 32) + dlba(suffix), 2000),
             "page: the values expand to more than 1073741824 bytes");
}

TEST(ParquetEncodingsMalformed, ByteStreamSplit) {
  std::string out;
  const std::string d = "0123456789";
  EXPECT_HAS(error_of([&] {
               pq::byte_stream_split_decode(reinterpret_cast<const uint8_t*>(d.data()), d.size(), 3,
                                            4, out, "page");
             }),
             "page: 10 bytes of data do not hold 3 values of 4 bytes");
  pq::byte_stream_split_decode(reinterpret_cast<const uint8_t*>(d.data()), 8, 2, 4, out, "page");
  EXPECT_EQ(out, "02461357");  // streams "01" "23" "45" "67": value 0 is "0246", value 1 "1357"
}

// Malformed pages inside files: the error names the file, row group, column, data page and
// encoding.
TEST(ParquetEncodingsMalformed, InFilesTheErrorNamesThePage) {
  const std::string path = temp_path("bad_enc.parquet");
  struct Bad {
    int32_t type, encoding;
    std::string values;
    const char* message;
  };
  const Bad bad[] = {
      {pq::kInt64, pq::kDeltaBinaryPacked, dbp({1, 2}, 64),
       "DELTA_BINARY_PACKED: the data holds 2 values, the page's levels need 3"},
      {pq::kInt32, pq::kDeltaBinaryPacked,
       dbp_header(128, 4, 3, 0) + '\0' + std::string("\x21\0\0\0", 4) +
           std::string(32 * 33 / 8, '\0'),
       "DELTA_BINARY_PACKED: miniblock bit width 33 exceeds the 32 bits"},
      {pq::kFloat, pq::kDeltaBinaryPacked, dbp({1, 2, 3}, 32),
       "encoding DELTA_BINARY_PACKED is not valid for a FLOAT column"},
      {pq::kByteArray, pq::kDeltaLengthByteArray, dbp({1, 1, 9}, 32) + "ab",
       "DELTA_LENGTH_BYTE_ARRAY: value 2 of 9 bytes is past the end"},
      {pq::kByteArray, pq::kDeltaByteArray, dbp({0, 3, 0}, 32) + dlba({"a", "b", "c"}),
       "DELTA_BYTE_ARRAY: value 1 has prefix length 3"},
      {pq::kInt64, pq::kDeltaByteArray, dbp({0, 0, 0}, 32),
       "encoding DELTA_BYTE_ARRAY is not valid for a INT64 column"},
      {pq::kDouble, pq::kByteStreamSplit, std::string(20, 'x'),
       "BYTE_STREAM_SPLIT: 20 bytes of data do not hold 3 values of 8 bytes"},
      {pq::kByteArray, pq::kByteStreamSplit, std::string(12, 'x'),
       "encoding BYTE_STREAM_SPLIT is not valid for a BYTE_ARRAY column"},
  };
  for (const Bad& b : bad) {
    // Page 0 is fine (3 nulls); page 1 holds the bad values for its 3 present rows.
    std::vector<Page> pages = {data_page(false, pq::kPlain, 3, {0, 0, 0}, "", nullptr),
                               data_page(false, b.encoding, 3, {1, 1, 1}, b.values, nullptr)};
    write_file(path, b.type, true, pq::kUncompressed, pages, 6);
    const std::string e = error_of([&] { read_x(path); });
    EXPECT_HAS(e, path + ": row group 0, column 'x': data page 1: ");
    EXPECT_HAS(e, b.message);
  }
  std::remove(path.c_str());
}

TEST(ParquetEncodings, AllNullPagesNeedNoValueBytes) {
  const std::string path = temp_path("all_null.parquet");
  for (const EncodingCase& ec : encoding_cases()) {
    for (const std::string& values : {std::string(), dbp({}, 32)}) {
      write_file(path, ec.type, true, pq::kUncompressed,
                 {data_page(false, ec.encoding, 4, {0, 0, 0, 0}, values, nullptr)}, 4);
      const ParquetColumnData got = read_x(path);
      ASSERT_EQ(got.rows, 4) << ec.label;
      for (int r = 0; r < 4; ++r) EXPECT_FALSE(got.present(r)) << ec.label;
    }
  }
  std::remove(path.c_str());
}

// A page header may claim 2^31 values in a few bytes (one RLE run of definition levels says
// they are all null): refused before the levels are allocated, by the bytes the page holds.
TEST(ParquetEncodingsMalformed, PageClaimingMoreValuesThanItsBytesAllowIsRefused) {
  const std::string path = temp_path("value_bomb.parquet");
  auto all_null_page = [](int64_t n) {  // definition levels: one RLE run of n zeros at 1 bit
    std::string levels;
    put_uleb(levels, static_cast<uint64_t>(n) << 1);
    levels.push_back('\0');
    Page p = data_page(false, pq::kPlain, 1, {}, "", nullptr);
    const uint32_t len = static_cast<uint32_t>(levels.size());
    p.body = std::string(reinterpret_cast<const char*>(&len), 4) + levels;
    p.h.num_values = static_cast<int32_t>(n);
    p.h.uncompressed_size = p.h.compressed_size = static_cast<int32_t>(p.body.size());
    return p;
  };
  for (const int64_t n : {int64_t{INT32_MAX}, (int64_t{1} << 22) + 1}) {
    const Page p = all_null_page(n);
    write_file(path, pq::kInt64, true, pq::kUncompressed, {p}, n);
    const std::string e = error_of([&] { read_x(path); });
    EXPECT_HAS(e, path + ": row group 0, column 'x': a data page of " +
                      std::to_string(p.body.size()) + " bytes claims " + std::to_string(n) +
                      " values; at most 4194304 are read");
  }
  // At the floor the same page is read (4 Mi nulls).
  write_file(path, pq::kInt64, true, pq::kUncompressed, {all_null_page(1 << 22)}, 1 << 22);
  const ParquetColumnData got = read_x(path);
  ASSERT_EQ(got.rows, 1 << 22);
  EXPECT_FALSE(got.present(0));
  EXPECT_FALSE(got.present((1 << 22) - 1));
  std::remove(path.c_str());
}

TEST(ParquetEncodingsMalformed, RandomDamageIsAnErrorNeverACrash) {
  std::mt19937_64 rng(23);
  std::vector<int64_t> ints;
  std::vector<std::string> strs;
  for (int i = 0; i < 700; ++i) {
    ints.push_back(static_cast<int64_t>(rng()) >> (rng() % 64));
    strs.push_back("value_" + std::to_string(rng() % 50) + std::string(rng() % 4, 'x'));
  }
  const std::string streams[] = {dbp(ints, 64), dlba(strs), dba(strs)};
  std::vector<int64_t> out_ints, lengths;
  std::vector<std::string_view> views;
  std::string arena;
  int errors = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (int trial = 0; trial < 400; ++trial) {
      std::string d = streams[kind];
      if (trial % 4 == 0) d.resize(rng() % d.size());
      for (int k = static_cast<int>(rng() % 3); k >= 0; --k)
        if (!d.empty()) d[rng() % d.size()] = static_cast<char>(rng());
      const auto* p = reinterpret_cast<const uint8_t*>(d.data());
      try {
        if (kind == 0) pq::delta_binary_packed_decode(p, d.size(), 64, 700, out_ints, "fuzz");
        if (kind == 1) pq::delta_length_byte_array_decode(p, d.size(), 700, views, lengths, "fuzz");
        if (kind == 2) pq::delta_byte_array_decode(p, d.size(), 700, arena, views, "fuzz");
      } catch (const Error& e) {
        ++errors;
        EXPECT_HAS(e.what(), "fuzz: ");
      }
    }
  }
  EXPECT_GT(errors, 300);
}

}  // namespace
}  // namespace dlrec::io
