// Parquet codecs (GZIP, LZ4_RAW, the legacy LZ4 in its Hadoop framing and as a bare block,
// BROTLI) and encodings (DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY,
// BYTE_STREAM_SPLIT). The test builds its files page by page: values encoded here from the
// layout in the format's Encodings.md, pages compressed with zlib / liblz4 / libbrotlienc; then
// reads them back, and damages streams and encoded pages to check each error.
#include <brotli/encode.h>
#include <gtest/gtest.h>
#include <lz4.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>

#include "../src/io/parquet_encodings.h"
#include "../src/io/parquet_format.h"
#include "dlrec/core/error.h"
#include "dlrec/io/parquet.h"

namespace dlrec::io {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/pqc_" + std::to_string(::getpid()) + "_" + name;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part)                               \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "missing '" << (part) << "' in: " << (text)

// ---- compression with the libraries

using Packer = std::function<std::string(const std::string&)>;

std::string gzip(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string lz4_block(const std::string& in) {
  std::string out(static_cast<size_t>(LZ4_compressBound(static_cast<int>(in.size()))), '\0');
  const int n = LZ4_compress_default(in.data(), out.data(), static_cast<int>(in.size()),
                                     static_cast<int>(out.size()));
  EXPECT_GT(n, 0);
  out.resize(static_cast<size_t>(n));
  return out;
}

void put_be32(std::string& out, size_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xFF));
}

// Hadoop BlockCompressorStream framing: frames of `frame` raw bytes, each [raw length] then
// chunks of `chunk` raw bytes as [compressed length][LZ4 block] (lengths u32 big-endian).
std::string lz4_hadoop(const std::string& in, size_t frame, size_t chunk) {
  std::string out;
  for (size_t f = 0; f < in.size(); f += frame) {
    const std::string part = in.substr(f, frame);
    put_be32(out, part.size());
    for (size_t c = 0; c < part.size(); c += chunk) {
      const std::string z = lz4_block(part.substr(c, chunk));
      put_be32(out, z.size());
      out += z;
    }
  }
  return out;
}

std::string brotli(const std::string& in) {
  size_t n = BrotliEncoderMaxCompressedSize(in.size());
  std::string out(n, '\0');
  EXPECT_TRUE(BrotliEncoderCompress(5, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, in.size(),
                                    reinterpret_cast<const uint8_t*>(in.data()), &n,
                                    reinterpret_cast<uint8_t*>(out.data())));
  out.resize(n);
  return out;
}

struct Codec {
  const char* label;
  int32_t parquet;
  const char* name;  // as messages print it
  Packer pack;
};

std::vector<Codec> codecs() {
  return {
      {"gzip", pq::kGzip, "GZIP", gzip},
      {"gzip_two_members", pq::kGzip, "GZIP",
       [](const std::string& s) {
         return gzip(s.substr(0, s.size() / 2)) + gzip(s.substr(s.size() / 2));
       }},
      {"lz4_raw", pq::kLz4Raw, "LZ4_RAW", lz4_block},
      {"lz4_hadoop", pq::kLz4, "LZ4",
       [](const std::string& s) { return lz4_hadoop(s, s.size(), s.size()); }},
      {"lz4_hadoop_frames_of_chunks", pq::kLz4, "LZ4",
       [](const std::string& s) { return lz4_hadoop(s, 100, 40); }},
      {"lz4_bare_block", pq::kLz4, "LZ4", lz4_block},
      {"brotli", pq::kBrotli, "BROTLI", brotli},
  };
}

// ---- encoders written from Encodings.md

void put_uleb(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_zigzag(std::string& out, int64_t v) {
  put_uleb(out, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

// Appends `vals` packed LSB first at `width` bits.
void put_bits(std::string& out, const std::vector<uint64_t>& vals, int width) {
  const size_t start = out.size();
  out.append((vals.size() * width + 7) / 8, '\0');
  uint64_t bit = 0;
  for (uint64_t v : vals)
    for (int b = 0; b < width; ++b, ++bit)
      if ((v >> b) & 1) out[start + bit / 8] |= static_cast<char>(1 << (bit % 8));
}

int width_of(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

// DELTA_BINARY_PACKED. bits 32: deltas wrap at 32 bits, as INT32 writers compute them.
// `unused_width` goes into the bit widths of the last block's unneeded miniblocks (readers must
// accept any value there).
std::string dbp(const std::vector<int64_t>& v, int bits, uint64_t block = 128, uint64_t minis = 4,
                uint8_t unused_width = 0) {
  std::string out;
  put_uleb(out, block);
  put_uleb(out, minis);
  put_uleb(out, v.size());
  put_zigzag(out, v.empty() ? 0 : v[0]);
  const uint64_t mask = bits == 32 ? 0xFFFFFFFFull : ~uint64_t{0};
  auto as_signed = [&](uint64_t x) {
    return bits == 32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(x)))
                      : static_cast<int64_t>(x);
  };
  const uint64_t per = block / minis;
  for (size_t i = 1; i < v.size(); i += block) {
    const size_t n = std::min<size_t>(block, v.size() - i);
    std::vector<uint64_t> d(n);
    int64_t mn = std::numeric_limits<int64_t>::max();
    for (size_t k = 0; k < n; ++k) {
      d[k] = (static_cast<uint64_t>(v[i + k]) - static_cast<uint64_t>(v[i + k - 1])) & mask;
      mn = std::min(mn, as_signed(d[k]));
    }
    put_zigzag(out, mn);
    const size_t widths_at = out.size();
    out.append(minis, '\0');
    for (uint64_t m = 0; m < minis; ++m) {
      if (m * per >= n) {
        out[widths_at + m] = static_cast<char>(unused_width);
        continue;
      }
      std::vector<uint64_t> rel(per, 0);
      uint64_t top = 0;
      for (uint64_t k = m * per; k < std::min<uint64_t>(n, (m + 1) * per); ++k) {
        rel[k - m * per] = (d[k] - static_cast<uint64_t>(mn)) & mask;
        top |= rel[k - m * per];
      }
      out[widths_at + m] = static_cast<char>(width_of(top));
      put_bits(out, rel, width_of(top));
    }
  }
  return out;
}

std::string dlba(const std::vector<std::string>& v) {
  std::vector<int64_t> lens;
  std::string data;
  for (const auto& s : v) {
    lens.push_back(static_cast<int64_t>(s.size()));
    data += s;
  }
  return dbp(lens, 32) + data;
}

std::string dba(const std::vector<std::string>& v) {
  std::vector<int64_t> prefix;
  std::vector<std::string> suffix;
  std::string prev;
  for (const auto& s : v) {
    size_t p = 0;
    while (p < s.size() && p < prev.size() && s[p] == prev[p]) ++p;
    prefix.push_back(static_cast<int64_t>(p));
    suffix.push_back(s.substr(p));
    prev = s;
  }
  return dbp(prefix, 32) + dlba(suffix);
}

std::string bss(const std::string& plain, int width) {
  const size_t n = plain.size() / width;
  std::string out(plain.size(), '\0');
  for (size_t i = 0; i < n; ++i)
    for (int b = 0; b < width; ++b) out[b * n + i] = plain[i * width + b];
  return out;
}

// ---- files built page by page: one column "x", one row group

struct Page {
  pq::PageHeader h;
  std::string body;
};

// A data page of n values: definition levels (1 bit; empty for a REQUIRED column) and encoded
// values, compressed with `pack` (null: uncompressed).
Page data_page(bool v2, int32_t encoding, int64_t n, const std::vector<uint32_t>& defs,
               const std::string& values, const Packer& pack) {
  Page p;
  pq::PageHeader& h = p.h;
  h.num_values = static_cast<int32_t>(n);
  h.encoding = encoding;
  std::string levels;
  if (!defs.empty()) pq::rle_encode(defs.data(), static_cast<int64_t>(defs.size()), 1, levels);
  if (!v2) {
    h.type = pq::kDataPage;
    std::string raw;
    if (!defs.empty()) {
      const uint32_t len = static_cast<uint32_t>(levels.size());
      raw.append(reinterpret_cast<const char*>(&len), 4);
      raw += levels;
    }
    raw += values;
    h.uncompressed_size = static_cast<int32_t>(raw.size());
    p.body = pack ? pack(raw) : raw;
  } else {
    h.type = pq::kDataPageV2;
    h.num_rows = h.num_values;
    for (uint32_t d : defs) h.num_nulls += d == 0;
    h.def_bytes = static_cast<int32_t>(levels.size());
    h.uncompressed_size = static_cast<int32_t>(levels.size() + values.size());
    h.v2_compressed = pack != nullptr;
    p.body = levels + (pack ? pack(values) : values);
  }
  h.compressed_size = static_cast<int32_t>(p.body.size());
  return p;
}

void write_file(const std::string& path, int32_t type, bool nullable, int32_t codec,
                const std::vector<Page>& pages, int64_t rows) {
  pq::FileMetaData m;
  m.version = 2;
  pq::SchemaElement root, leaf;
  root.name = "schema";
  root.num_children = 1;
  leaf.type = type;
  leaf.repetition = nullable ? pq::kOptional : pq::kRequired;
  leaf.name = "x";
  m.schema = {root, leaf};
  m.num_rows = rows;
  pq::ColumnChunk cc;
  cc.has_meta = true;
  cc.file_offset = 4;
  pq::ColumnMeta& cm = cc.meta;
  cm.type = type;
  cm.path = {"x"};
  cm.codec = codec;
  cm.data_page_offset = 4;
  std::string data = "PAR1";
  for (const Page& p : pages) {
    const std::string hdr = pq::encode_page_header(p.h);
    data += hdr + p.body;
    cm.num_values += p.h.num_values;
    cm.total_uncompressed_size += static_cast<int64_t>(hdr.size()) + p.h.uncompressed_size;
    cm.total_compressed_size += static_cast<int64_t>(hdr.size() + p.body.size());
    cm.encodings.push_back(p.h.encoding);
  }
  pq::RowGroup g;
  g.columns = {cc};
  g.num_rows = rows;
  g.total_byte_size = cm.total_uncompressed_size;
  m.row_groups = {g};
  const std::string footer = pq::encode_file_metadata(m);
  const uint32_t len = static_cast<uint32_t>(footer.size());
  data += footer;
  data.append(reinterpret_cast<const char*>(&len), 4);
  data += "PAR1";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(data.data(), static_cast<std::streamsize>(data.size()));
}

// Encodes the present slots of one page.
using Encoder = std::function<std::string(const ParquetColumnData&, const std::vector<int64_t>&)>;

// Cuts column `c` into pages of `page_rows` rows, each encoded with `enc` and compressed.
std::vector<Page> pages_of(const ParquetColumnData& c, bool nullable, int64_t page_rows, bool v2,
                           int32_t encoding, const Encoder& enc, const Packer& pack) {
  std::vector<Page> pages;
  for (int64_t r0 = 0; r0 < c.rows; r0 += page_rows) {
    const int64_t r1 = std::min(c.rows, r0 + page_rows);
    std::vector<uint32_t> defs;
    std::vector<int64_t> slots;
    for (int64_t r = r0; r < r1; ++r) {
      if (nullable) defs.push_back(c.present(r));
      if (c.present(r)) slots.push_back(r);
    }
    pages.push_back(data_page(v2, encoding, r1 - r0, defs, enc(c, slots), pack));
  }
  return pages;
}

std::string plain_int64(const ParquetColumnData& c, const std::vector<int64_t>& slots) {
  std::string out;
  for (int64_t s : slots) out.append(reinterpret_cast<const char*>(&c.ints[s]), 8);
  return out;
}

void expect_same(const ParquetColumnData& want, const ParquetColumnData& got,
                 const std::string& what) {
  ASSERT_EQ(want.rows, got.rows) << what;
  for (int64_t s = 0; s < want.rows; ++s) {
    ASSERT_EQ(want.present(s), got.present(s)) << what << " row " << s;
    if (!want.present(s)) continue;
    if (!want.ints.empty()) {
      ASSERT_EQ(want.ints[s], got.ints[s]) << what << " row " << s;
    }
    if (!want.reals.empty()) {
      ASSERT_EQ(want.reals[s], got.reals[s]) << what << " row " << s;
    }
    if (!want.strings.empty()) {
      ASSERT_EQ(want.strings[s], got.strings[s]) << what << " row " << s;
    }
  }
}

ParquetColumnData int64_column(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ParquetColumnData c;
  c.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    c.valid.push_back(rng() % 5 != 0);
    c.ints.push_back(c.valid.back() ? static_cast<int64_t>(rng() % 1000) * 37 - 5000 : 0);
  }
  return c;
}

ParquetColumnData read_x(const std::string& path) { return ParquetFile(path).read_column(0, 0); }

// ---- codecs

class ParquetCodecTest : public ::testing::TestWithParam<std::tuple<size_t, bool /*v2*/>> {
 protected:
  Codec cd = codecs()[std::get<0>(GetParam())];
  bool v2 = std::get<1>(GetParam());
  std::string path = temp_path(std::string(cd.label) + (v2 ? "_v2" : "_v1") + ".parquet");
  void TearDown() override { std::remove(path.c_str()); }
};

TEST_P(ParquetCodecTest, ReadsPagesWithNulls) {
  const ParquetColumnData c = int64_column(1000, 3);
  write_file(path, pq::kInt64, true, cd.parquet,
             pages_of(c, true, 300, v2, pq::kPlain, plain_int64, cd.pack), c.rows);
  expect_same(c, read_x(path), cd.label);
}

TEST_P(ParquetCodecTest, DamagedStreamsAreErrorsNamingFileColumnPageAndCodec) {
  const ParquetColumnData c = int64_column(400, 5);
  // The second page's stream is damaged by `damage`; its declared size is off by `size_delta`.
  auto error_with = [&](const Packer& damage, int32_t size_delta) {
    std::vector<Page> pages = pages_of(c, true, 200, v2, pq::kPlain, plain_int64, cd.pack);
    pages[1] = pages_of(c, true, 200, v2, pq::kPlain, plain_int64,
                        [&](const std::string& s) { return damage(cd.pack(s)); })[1];
    pages[1].h.uncompressed_size += size_delta;
    write_file(path, pq::kInt64, true, cd.parquet, pages, c.rows);
    return error_of([&] { read_x(path); });
  };
  const Packer same = [](const std::string& z) { return z; };
  const Packer cut = [](const std::string& z) { return z.substr(0, z.size() / 2); };
  const Packer garbage = [](const std::string& z) { return std::string(z.size(), '\xFF'); };
  const std::string where = path + ": row group 0, column 'x': data page 1: ";
  for (const auto& [what, e] :
       {std::pair<const char*, std::string>{"truncated", error_with(cut, 0)},
        {"garbage", error_with(garbage, 0)},
        {"size - 1", error_with(same, -1)},
        {"size + 1", error_with(same, +1)}}) {
    EXPECT_HAS(e, where) << what;
    EXPECT_HAS(e, std::string(" ") + cd.name + " data") << what;
  }
  if (cd.parquet == pq::kGzip || cd.parquet == pq::kBrotli) {
    EXPECT_HAS(error_with(cut, 0), std::string("truncated ") + cd.name + " data");
    EXPECT_HAS(error_with(same, -1), "data holds more than the page header's");
  }
  if (cd.parquet != pq::kLz4) {
    EXPECT_HAS(error_with(same, +1), "bytes, the page header says");
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, ParquetCodecTest,
                         ::testing::Combine(::testing::Range<size_t>(0, 7), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(codecs()[std::get<0>(info.param)].label) +
                                  (std::get<1>(info.param) ? "_v2" : "_v1");
                         });

// decompress() itself: every cut of a stream and random byte damage are errors (or, where a
// codec has no checksum, bytes of the declared size), never a crash.
TEST(ParquetCodecs, EveryCutAndRandomDamageIsAnErrorNeverACrash) {
  for (const Codec& cd : codecs()) {
    SCOPED_TRACE(cd.label);
    std::mt19937_64 rng(17);
    std::string raw;
    for (int i = 0; i < 3000; ++i) raw += std::to_string(rng() % 97) + (i % 7 ? "," : "\n");
    const std::string z = cd.pack(raw);
    std::string out;
    auto run = [&](const std::string& d) {
      pq::decompress(cd.parquet, reinterpret_cast<const uint8_t*>(d.data()), d.size(), raw.size(),
                     out, "test");
    };
    run(z);
    ASSERT_EQ(out, raw);
    for (size_t n = 0; n < z.size(); n += 1 + n / 64) {
      const std::string e = error_of([&] { run(z.substr(0, n)); });
      EXPECT_HAS(e, std::string("test: ")) << "cut at " << n << " of " << z.size();
    }
    int errors = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::string d = z;
      for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k)
        d[rng() % d.size()] ^= static_cast<char>(1 + rng() % 255);
      try {
        run(d);
        EXPECT_EQ(out.size(), raw.size());
      } catch (const Error& e) {
        ++errors;
        EXPECT_HAS(e.what(), "test: ");
      }
    }
    EXPECT_GT(errors, 0);
  }
}

TEST(ParquetCodecs, UnsupportedCodecIsNamed) {
  const ParquetColumnData c = int64_column(10, 1);
  const std::string path = temp_path("lzo.parquet");
  write_file(path, pq::kInt64, true, pq::kLzo,
             pages_of(c, true, 10, false, pq::kPlain, plain_int64, nullptr), c.rows);
  const std::string e = error_of([&] { read_x(path); });
  EXPECT_HAS(e, path +
                    ": row group 0, column 'x': unsupported compression codec LZO (supported: "
                    "UNCOMPRESSED, SNAPPY, ZSTD, GZIP, LZ4_RAW, LZ4, BROTLI)");
  std::remove(path.c_str());
}

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
