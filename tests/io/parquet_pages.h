// Builders shared by tests/io/parquet_codecs_test.cc and parquet_encodings_test.cc: Parquet
// files built page by page (one column "x", one row group) from values encoded here after the
// layout in the format's Encodings.md, pages compressed with the libraries.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../src/io/parquet_format.h"
#include "dlrec/core/error.h"
#include "dlrec/io/parquet.h"

namespace dlrec::io::pqtest {

inline std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/pqc_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string error_of(const std::function<void()>& fn) {
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

inline std::string gzip(const std::string& in) {
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

// ---- encoders written from Encodings.md

inline void put_uleb(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_zigzag(std::string& out, int64_t v) {
  put_uleb(out, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

// Appends `vals` packed LSB first at `width` bits.
inline void put_bits(std::string& out, const std::vector<uint64_t>& vals, int width) {
  const size_t start = out.size();
  out.append((vals.size() * width + 7) / 8, '\0');
  uint64_t bit = 0;
  for (uint64_t v : vals)
    for (int b = 0; b < width; ++b, ++bit)
      if ((v >> b) & 1) out[start + bit / 8] |= static_cast<char>(1 << (bit % 8));
}

inline int width_of(uint64_t v) { return v == 0 ? 0 : 64 - __builtin_clzll(v); }

// DELTA_BINARY_PACKED. bits 32: deltas wrap at 32 bits, as INT32 writers compute them.
// `unused_width` goes into the bit widths of the last block's unneeded miniblocks (readers must
// accept any value there).
inline std::string dbp(const std::vector<int64_t>& v, int bits, uint64_t block = 128,
                       uint64_t minis = 4, uint8_t unused_width = 0) {
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

inline std::string dlba(const std::vector<std::string>& v) {
  std::vector<int64_t> lens;
  std::string data;
  for (const auto& s : v) {
    lens.push_back(static_cast<int64_t>(s.size()));
    data += s;
  }
  return dbp(lens, 32) + data;
}

inline std::string dba(const std::vector<std::string>& v) {
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

inline std::string bss(const std::string& plain, int width) {
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
inline Page data_page(bool v2, int32_t encoding, int64_t n, const std::vector<uint32_t>& defs,
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

inline void write_file(const std::string& path, int32_t type, bool nullable, int32_t codec,
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
inline std::vector<Page> pages_of(const ParquetColumnData& c, bool nullable, int64_t page_rows,
                                  bool v2, int32_t encoding, const Encoder& enc,
                                  const Packer& pack) {
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

inline std::string plain_int64(const ParquetColumnData& c, const std::vector<int64_t>& slots) {
  std::string out;
  for (int64_t s : slots) out.append(reinterpret_cast<const char*>(&c.ints[s]), 8);
  return out;
}

inline void expect_same(const ParquetColumnData& want, const ParquetColumnData& got,
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

inline ParquetColumnData int64_column(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ParquetColumnData c;
  c.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    c.valid.push_back(rng() % 5 != 0);
    c.ints.push_back(c.valid.back() ? static_cast<int64_t>(rng() % 1000) * 37 - 5000 : 0);
  }
  return c;
}

inline ParquetColumnData read_x(const std::string& path) {
  return ParquetFile(path).read_column(0, 0);
}

}  // namespace dlrec::io::pqtest
