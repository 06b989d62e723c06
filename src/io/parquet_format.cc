// Parquet footer and page headers <-> Thrift compact bytes (the fields dlrec uses; every other
// field is skipped on read), RLE/bit-packed hybrid, codecs.
#include "io/parquet_format.h"

#include <snappy-c.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "dlrec/core/error.h"

namespace dlrec::io::pq {

using thrift::CompactReader;
using thrift::CompactWriter;
using thrift::CType;

const char* type_name(int32_t t) {
  switch (t) {
    case kBoolean: return "BOOLEAN";
    case kInt32: return "INT32";
    case kInt64: return "INT64";
    case kInt96: return "INT96";
    case kFloat: return "FLOAT";
    case kDouble: return "DOUBLE";
    case kByteArray: return "BYTE_ARRAY";
    case kFixedLenByteArray: return "FIXED_LEN_BYTE_ARRAY";
  }
  return "UNKNOWN_TYPE";
}

const char* encoding_name(int32_t e) {
  switch (e) {
    case kPlain: return "PLAIN";
    case kPlainDictionary: return "PLAIN_DICTIONARY";
    case kRle: return "RLE";
    case kBitPacked: return "BIT_PACKED";
    case kDeltaBinaryPacked: return "DELTA_BINARY_PACKED";
    case kDeltaLengthByteArray: return "DELTA_LENGTH_BYTE_ARRAY";
    case kDeltaByteArray: return "DELTA_BYTE_ARRAY";
    case kRleDictionary: return "RLE_DICTIONARY";
    case kByteStreamSplit: return "BYTE_STREAM_SPLIT";
  }
  return "UNKNOWN_ENCODING";
}

const char* codec_name(int32_t c) {
  switch (c) {
    case kUncompressed: return "UNCOMPRESSED";
    case kSnappy: return "SNAPPY";
    case kGzip: return "GZIP";
    case kLzo: return "LZO";
    case kBrotli: return "BROTLI";
    case kLz4: return "LZ4";
    case kZstd: return "ZSTD";
    case kLz4Raw: return "LZ4_RAW";
  }
  return "UNKNOWN_CODEC";
}

// ---------------------------------------------------------------------------------------------
// Decoding

namespace {

// Reads a field of the expected type or skips it when the type differs (robust to writers
// that widen a field).
template <class F>
void struct_fields(CompactReader& r, F&& on_field) {
  r.begin_struct();
  int16_t id;
  CType t;
  while (r.next_field(id, t)) on_field(id, t);
  r.end_struct();
}

int32_t get_i32(CompactReader& r, CType t) {
  if (t == CType::I32 || t == CType::I16) return r.read_i32();
  if (t == CType::Byte) return r.read_byte();
  r.corrupt("expected an integer field");
}

int64_t get_i64(CompactReader& r, CType t) {
  if (t == CType::I64 || t == CType::I32 || t == CType::I16) return r.read_i64();
  r.corrupt("expected an integer field");
}

template <class F>
void list_elements(CompactReader& r, CType t, F&& on_elem) {
  if (t != CType::List && t != CType::Set) r.corrupt("expected a list field");
  CType e;
  int64_t n;
  r.read_list_header(e, n);
  for (int64_t i = 0; i < n; ++i) on_elem(e);
}

SchemaElement decode_schema_element(CompactReader& r) {
  SchemaElement s;
  bool has_name = false;
  struct_fields(r, [&](int16_t id, CType t) {
    switch (id) {
      case 1: s.type = get_i32(r, t); break;
      case 2: s.type_length = get_i32(r, t); break;
      case 3: s.repetition = get_i32(r, t); break;
      case 4:
        s.name = r.read_string();
        has_name = true;
        break;
      case 5: s.num_children = get_i32(r, t); break;
      case 6: s.converted_type = get_i32(r, t); break;
      case 10:
        if (t != CType::Struct) r.corrupt("expected a LogicalType struct");
        struct_fields(r, [&](int16_t lid, CType lt) {
          s.logical = lid;
          if (lid == 10 && lt == CType::Struct) {  // IntType {1: i8 bitWidth, 2: bool isSigned}
            struct_fields(r, [&](int16_t iid, CType it) {
              if (iid == 1 && it == CType::Byte)
                s.logical_int_bits = r.read_byte();
              else if (iid == 2 && (it == CType::True || it == CType::False))
                s.logical_int_signed = r.read_bool(it);
              else
                r.skip(it);
            });
          } else {
            r.skip(lt);
          }
        });
        break;
      default: r.skip(t);
    }
  });
  if (!has_name) r.corrupt("schema element without a name");
  return s;
}

ColumnMeta decode_column_meta(CompactReader& r) {
  ColumnMeta m;
  struct_fields(r, [&](int16_t id, CType t) {
    switch (id) {
      case 1: m.type = get_i32(r, t); break;
      case 2: list_elements(r, t, [&](CType) { m.encodings.push_back(r.read_i32()); }); break;
      case 3: list_elements(r, t, [&](CType) { m.path.push_back(r.read_string()); }); break;
      case 4: m.codec = get_i32(r, t); break;
      case 5: m.num_values = get_i64(r, t); break;
      case 6: m.total_uncompressed_size = get_i64(r, t); break;
      case 7: m.total_compressed_size = get_i64(r, t); break;
      case 9: m.data_page_offset = get_i64(r, t); break;
      case 11: m.dictionary_page_offset = get_i64(r, t); break;
      default: r.skip(t);
    }
  });
  return m;
}

ColumnChunk decode_column_chunk(CompactReader& r) {
  ColumnChunk c;
  struct_fields(r, [&](int16_t id, CType t) {
    switch (id) {
      case 1: c.file_path = r.read_string(); break;
      case 2: c.file_offset = get_i64(r, t); break;
      case 3:
        if (t != CType::Struct) r.corrupt("expected a ColumnMetaData struct");
        c.meta = decode_column_meta(r);
        c.has_meta = true;
        break;
      default: r.skip(t);
    }
  });
  return c;
}

RowGroup decode_row_group(CompactReader& r) {
  RowGroup g;
  struct_fields(r, [&](int16_t id, CType t) {
    switch (id) {
      case 1:
        list_elements(r, t, [&](CType e) {
          if (e != CType::Struct) r.corrupt("expected ColumnChunk structs");
          g.columns.push_back(decode_column_chunk(r));
        });
        break;
      case 2: g.total_byte_size = get_i64(r, t); break;
      case 3: g.num_rows = get_i64(r, t); break;
      case 5: g.file_offset = get_i64(r, t); break;
      case 6: g.total_compressed_size = get_i64(r, t); break;
      case 7: g.ordinal = get_i32(r, t); break;
      default: r.skip(t);
    }
  });
  return g;
}

}  // namespace

FileMetaData decode_file_metadata(const uint8_t* data, size_t size, const std::string& what) {
  CompactReader r(data, size, what);
  FileMetaData m;
  struct_fields(r, [&](int16_t id, CType t) {
    switch (id) {
      case 1: m.version = get_i32(r, t); break;
      case 2:
        list_elements(r, t, [&](CType e) {
          if (e != CType::Struct) r.corrupt("expected SchemaElement structs");
          m.schema.push_back(decode_schema_element(r));
        });
        break;
      case 3: m.num_rows = get_i64(r, t); break;
      case 4:
        list_elements(r, t, [&](CType e) {
          if (e != CType::Struct) r.corrupt("expected RowGroup structs");
          m.row_groups.push_back(decode_row_group(r));
        });
        break;
      case 6: m.created_by = r.read_string(); break;
      case 8:
        m.encrypted_footer_fields = true;
        r.skip(t);
        break;
      default: r.skip(t);
    }
  });
  return m;
}

size_t decode_page_header(const uint8_t* data, size_t size, const std::string& what,
                          PageHeader& h) {
  CompactReader r(data, size, what);
  h = PageHeader{};
  bool has_type = false;
  struct_fields(r, [&](int16_t id, CType t) {
    switch (id) {
      case 1:
        h.type = get_i32(r, t);
        has_type = true;
        break;
      case 2: h.uncompressed_size = get_i32(r, t); break;
      case 3: h.compressed_size = get_i32(r, t); break;
      case 5:  // DataPageHeader
        struct_fields(r, [&](int16_t d, CType dt) {
          switch (d) {
            case 1: h.num_values = get_i32(r, dt); break;
            case 2: h.encoding = get_i32(r, dt); break;
            case 3: h.def_encoding = get_i32(r, dt); break;
            case 4: h.rep_encoding = get_i32(r, dt); break;
            default: r.skip(dt);
          }
        });
        break;
      case 7:  // DictionaryPageHeader
        struct_fields(r, [&](int16_t d, CType dt) {
          switch (d) {
            case 1: h.num_values = get_i32(r, dt); break;
            case 2: h.encoding = get_i32(r, dt); break;
            default: r.skip(dt);
          }
        });
        break;
      case 8:  // DataPageHeaderV2
        struct_fields(r, [&](int16_t d, CType dt) {
          switch (d) {
            case 1: h.num_values = get_i32(r, dt); break;
            case 2: h.num_nulls = get_i32(r, dt); break;
            case 3: h.num_rows = get_i32(r, dt); break;
            case 4: h.encoding = get_i32(r, dt); break;
            case 5: h.def_bytes = get_i32(r, dt); break;
            case 6: h.rep_bytes = get_i32(r, dt); break;
            case 7: h.v2_compressed = r.read_bool(dt); break;
            default: r.skip(dt);
          }
        });
        break;
      default: r.skip(t);
    }
  });
  if (!has_type) r.corrupt("page header without a type");
  if (h.compressed_size < 0 || h.uncompressed_size < 0 || h.num_values < 0)
    r.corrupt("negative page size or value count");
  return r.position();
}

// ---------------------------------------------------------------------------------------------
// Encoding

std::string encode_file_metadata(const FileMetaData& m) {
  CompactWriter w;
  w.field_i32(1, m.version);
  w.field_list_begin(2, CType::Struct, m.schema.size());
  for (const SchemaElement& s : m.schema) {
    w.elem_struct_begin();
    if (s.type >= 0) w.field_i32(1, s.type);
    if (s.repetition >= 0) w.field_i32(3, s.repetition);
    w.field_binary(4, s.name);
    if (s.type < 0) w.field_i32(5, s.num_children);
    if (s.converted_type >= 0) w.field_i32(6, s.converted_type);
    if (s.logical >= 0) {
      w.field_struct_begin(10);
      w.field_struct_begin(static_cast<int16_t>(s.logical));  // an empty member struct
      w.end_struct();
      w.end_struct();
    }
    w.end_struct();
  }
  w.field_i64(3, m.num_rows);
  w.field_list_begin(4, CType::Struct, m.row_groups.size());
  for (const RowGroup& g : m.row_groups) {
    w.elem_struct_begin();
    w.field_list_begin(1, CType::Struct, g.columns.size());
    for (const ColumnChunk& c : g.columns) {
      w.elem_struct_begin();
      w.field_i64(2, c.file_offset);
      w.field_struct_begin(3);
      const ColumnMeta& cm = c.meta;
      w.field_i32(1, cm.type);
      w.field_list_begin(2, CType::I32, cm.encodings.size());
      for (int32_t e : cm.encodings) w.elem_i32(e);
      w.field_list_begin(3, CType::Binary, cm.path.size());
      for (const auto& p : cm.path) w.elem_binary(p);
      w.field_i32(4, cm.codec);
      w.field_i64(5, cm.num_values);
      w.field_i64(6, cm.total_uncompressed_size);
      w.field_i64(7, cm.total_compressed_size);
      w.field_i64(9, cm.data_page_offset);
      if (cm.dictionary_page_offset >= 0) w.field_i64(11, cm.dictionary_page_offset);
      w.end_struct();  // ColumnMetaData
      w.end_struct();  // ColumnChunk
    }
    w.field_i64(2, g.total_byte_size);
    w.field_i64(3, g.num_rows);
    if (g.file_offset >= 0) w.field_i64(5, g.file_offset);
    if (g.total_compressed_size >= 0) w.field_i64(6, g.total_compressed_size);
    if (g.ordinal >= 0) {
      w.field_i16(7, static_cast<int16_t>(g.ordinal));
    }
    w.end_struct();
  }
  if (!m.created_by.empty()) w.field_binary(6, m.created_by);
  w.end_struct();
  return w.bytes();
}

std::string encode_page_header(const PageHeader& h) {
  CompactWriter w;
  w.field_i32(1, h.type);
  w.field_i32(2, h.uncompressed_size);
  w.field_i32(3, h.compressed_size);
  if (h.type == kDataPage) {
    w.field_struct_begin(5);
    w.field_i32(1, h.num_values);
    w.field_i32(2, h.encoding);
    w.field_i32(3, h.def_encoding);
    w.field_i32(4, h.rep_encoding);
    w.end_struct();
  } else if (h.type == kDictionaryPage) {
    w.field_struct_begin(7);
    w.field_i32(1, h.num_values);
    w.field_i32(2, h.encoding);
    w.end_struct();
  } else if (h.type == kDataPageV2) {
    w.field_struct_begin(8);
    w.field_i32(1, h.num_values);
    w.field_i32(2, h.num_nulls);
    w.field_i32(3, h.num_rows);
    w.field_i32(4, h.encoding);
    w.field_i32(5, h.def_bytes);
    w.field_i32(6, h.rep_bytes);
    w.field_bool(7, h.v2_compressed);
    w.end_struct();
  }
  w.end_struct();
  return w.bytes();
}

// ---------------------------------------------------------------------------------------------
// RLE / bit-packed hybrid

int bit_width(uint64_t max_value) {
  int w = 0;
  while (max_value) {
    ++w;
    max_value >>= 1;
  }
  return w;
}

void rle_decode(const uint8_t* data, size_t size, int width, int64_t count, uint32_t* out,
                const std::string& what) {
  if (width < 0 || width > 32) fail(what, ": bit width ", width, " is out of range [0, 32]");
  if (width == 0) {
    std::fill(out, out + count, 0u);
    return;
  }
  const size_t value_bytes = static_cast<size_t>((width + 7) / 8);
  const uint64_t mask = width == 32 ? 0xFFFFFFFFull : ((uint64_t{1} << width) - 1);
  size_t pos = 0;
  int64_t done = 0;
  while (done < count) {
    uint64_t header = 0;
    for (int shift = 0;; shift += 7) {
      if (pos >= size || shift > 63)
        fail(what, ": RLE/bit-packed data ends after ", done, " of ", count, " values");
      const uint8_t b = data[pos++];
      header |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) break;
    }
    if (header & 1) {  // bit-packed: groups of 8 values
      const uint64_t groups = header >> 1;
      if (groups == 0 || groups > (size - pos) / static_cast<uint64_t>(width))
        fail(what, ": bit-packed run of ", groups, " groups is past the end of the data");
      const uint64_t n = groups * 8;
      const uint8_t* p = data + pos;
      const int64_t take = static_cast<int64_t>(std::min<uint64_t>(n, count - done));
      uint64_t bitpos = 0;
      for (int64_t i = 0; i < take; ++i, bitpos += width) {
        // Gather up to 5 bytes covering the value (width <= 32, shift <= 7).
        const size_t byte = bitpos >> 3;
        const int shift = static_cast<int>(bitpos & 7);
        uint64_t v = 0;
        const size_t avail = std::min<size_t>(8, groups * width - byte);
        std::memcpy(&v, p + byte, avail);
        out[done + i] = static_cast<uint32_t>((v >> shift) & mask);
      }
      pos += groups * width;
      done += take;
    } else {  // RLE run
      const uint64_t n = header >> 1;
      if (value_bytes > size - pos) fail(what, ": RLE run value is past the end of the data");
      uint32_t v = 0;
      for (size_t i = 0; i < value_bytes; ++i) v |= static_cast<uint32_t>(data[pos + i]) << (8 * i);
      pos += value_bytes;
      if (v > mask) fail(what, ": RLE run value ", v, " does not fit in ", width, " bits");
      const int64_t take = static_cast<int64_t>(std::min<uint64_t>(n, count - done));
      if (n == 0) fail(what, ": empty RLE run");
      std::fill(out + done, out + done + take, v);
      done += take;
    }
  }
}

namespace {
void put_varint(uint64_t v, std::string& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_bitpacked(const uint32_t* v, int64_t n, int width, std::string& out) {
  const int64_t groups = (n + 7) / 8;
  put_varint((static_cast<uint64_t>(groups) << 1) | 1, out);
  const size_t start = out.size();
  out.resize(start + static_cast<size_t>(groups * width), 0);
  uint8_t* p = reinterpret_cast<uint8_t*>(&out[start]);
  uint64_t bitpos = 0;
  for (int64_t i = 0; i < n; ++i, bitpos += width) {
    uint64_t x = static_cast<uint64_t>(v[i]) << (bitpos & 7);
    for (size_t b = bitpos >> 3; x; ++b, x >>= 8) p[b] |= static_cast<uint8_t>(x);
  }
}

void put_rle(uint32_t v, int64_t n, int width, std::string& out) {
  put_varint(static_cast<uint64_t>(n) << 1, out);
  for (int i = 0; i < (width + 7) / 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
}  // namespace

void rle_encode(const uint32_t* values, int64_t count, int width, std::string& out) {
  if (width == 0) {
    if (count > 0) put_rle(0, count, 0, out);
    return;
  }
  int64_t lit = 0;  // start of pending literal values
  int64_t i = 0;
  while (i < count) {
    int64_t j = i + 1;
    while (j < count && values[j] == values[i]) ++j;
    int64_t run = j - i;
    if (run >= 8) {
      // Literals must be a multiple of 8: lend them values from the start of the run.
      const int64_t pad = (8 - (i - lit) % 8) % 8;
      if (run - pad >= 8) {
        if (i + pad > lit) put_bitpacked(values + lit, i + pad - lit, width, out);
        put_rle(values[i], run - pad, width, out);
        lit = j;
      }
    }
    i = j;
  }
  if (lit < count) put_bitpacked(values + lit, count - lit, width, out);
}

// ---------------------------------------------------------------------------------------------
// Codecs

namespace {
// The most bytes `size` bytes of `codec` can decode to: each format's densest encoding (SNAPPY:
// 64 bytes from a 3-byte copy; LZ4: 255 bytes per match-length byte; DEFLATE: 1032 to 1; ZSTD:
// a 128 KiB RLE block from 4 bytes), plus slack for headers. A page header that declares more
// is damaged or hostile: refused before its buffer is allocated. BROTLI has no such bound (a
// copy of 16 MiB takes a few bits): its buffer grows as the stream decodes (parquet_codecs.cc).
uint64_t densest(int32_t codec, uint64_t size) {
  switch (codec) {
    case kSnappy: return 22 * size + 64;
    case kLz4:
    case kLz4Raw: return 256 * size + 64;
    case kGzip: return 1032 * size + 64;
    case kZstd: return 32768 * size + 131072;
    default: return UINT64_MAX;
  }
}
}  // namespace

void decompress(int32_t codec, const uint8_t* data, size_t size, size_t uncompressed_size,
                std::string& out, const std::string& what) {
  if (codec == kUncompressed) {
    if (size != uncompressed_size)
      fail(what, ": uncompressed page of ", size, " bytes declares ", uncompressed_size);
    out.assign(reinterpret_cast<const char*>(data), size);
    return;
  }
  if (codec_supported(codec) && codec != kBrotli) {
    if (uncompressed_size > densest(codec, size))
      fail(what, ": the page header declares ", uncompressed_size, " bytes, more than ", size,
           " bytes of ", codec_name(codec), " data can hold");
    out.resize(uncompressed_size);
  }
  switch (codec) {
    case kSnappy: {
      size_t n = 0;
      if (snappy_uncompressed_length(reinterpret_cast<const char*>(data), size, &n) !=
              SNAPPY_OK ||
          n != uncompressed_size)
        fail(what, ": corrupt SNAPPY data (bad length header)");
      if (snappy_uncompress(reinterpret_cast<const char*>(data), size, out.data(), &n) !=
          SNAPPY_OK)
        fail(what, ": corrupt SNAPPY data");
      return;
    }
    case kZstd: {
      const size_t n = ZSTD_decompress(out.data(), uncompressed_size, data, size);
      if (ZSTD_isError(n)) fail(what, ": corrupt ZSTD data (", ZSTD_getErrorName(n), ")");
      if (n != uncompressed_size)
        fail(what, ": ZSTD data holds ", n, " bytes, the page header says ", uncompressed_size);
      return;
    }
    default:
      decompress_more(codec, data, size, uncompressed_size, out, what);
  }
}

void compress(int32_t codec, const char* data, size_t size, std::string& out) {
  switch (codec) {
    case kUncompressed:
      out.assign(data, size);
      return;
    case kSnappy: {
      size_t n = snappy_max_compressed_length(size);
      out.resize(n);
      if (snappy_compress(data, size, out.data(), &n) != SNAPPY_OK)
        fail("parquet: SNAPPY compression failed");
      out.resize(n);
      return;
    }
    case kZstd: {
      size_t n = ZSTD_compressBound(size);
      out.resize(n);
      n = ZSTD_compress(out.data(), n, data, size, 1);
      if (ZSTD_isError(n)) fail("parquet: ZSTD compression failed: ", ZSTD_getErrorName(n));
      out.resize(n);
      return;
    }
    default:
      fail("parquet: cannot write codec ", codec_name(codec));
  }
}

}  // namespace dlrec::io::pq
