// Parquet internals shared by the reader and the writer: the footer and page-header structures
// (the subset of parquet.thrift dlrec reads and writes), their Thrift compact encoding, the
// RLE/bit-packed hybrid, and the compression codecs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "thrift_compact.h"  // (relative: tests/io include this header by path)

namespace dlrec::io::pq {

// parquet.thrift enums (values are the wire values).
enum Type : int32_t {
  kBoolean = 0, kInt32 = 1, kInt64 = 2, kInt96 = 3, kFloat = 4, kDouble = 5, kByteArray = 6,
  kFixedLenByteArray = 7
};
enum Repetition : int32_t { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum ConvertedType : int32_t {
  kUtf8 = 0, kMap = 1, kMapKeyValue = 2, kList = 3, kEnum = 4, kDecimal = 5, kUint32 = 13,
  kUint64 = 14
};
enum Encoding : int32_t {
  kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6, kDeltaByteArray = 7, kRleDictionary = 8, kByteStreamSplit = 9
};
enum Codec : int32_t {
  kUncompressed = 0, kSnappy = 1, kGzip = 2, kLzo = 3, kBrotli = 4, kLz4 = 5, kZstd = 6,
  kLz4Raw = 7
};
enum PageType : int32_t { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

const char* type_name(int32_t t);
const char* encoding_name(int32_t e);
const char* codec_name(int32_t c);

struct SchemaElement {
  int32_t type = -1;  // -1: a group
  int32_t type_length = 0;
  int32_t repetition = -1;  // -1: absent (the root)
  std::string name;
  int32_t num_children = 0;
  int32_t converted_type = -1;
  // LogicalType union: the member's field id (1 STRING, 3 LIST, 10 INTEGER, ...), -1 absent.
  int32_t logical = -1;
  bool logical_int_signed = true;  // INTEGER's is_signed
  int32_t logical_int_bits = 0;    // INTEGER's bitWidth
};

struct ColumnMeta {
  int32_t type = -1;
  std::vector<int32_t> encodings;
  std::vector<std::string> path;
  int32_t codec = 0;
  int64_t num_values = 0;
  int64_t total_uncompressed_size = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;  // -1: absent
};

struct ColumnChunk {
  std::string file_path;  // non-empty: the data lives in another file (unsupported)
  int64_t file_offset = 0;
  bool has_meta = false;
  ColumnMeta meta;
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t total_byte_size = 0;
  int64_t num_rows = 0;
  int64_t file_offset = -1;
  int64_t total_compressed_size = -1;
  int32_t ordinal = -1;
};

struct FileMetaData {
  int32_t version = 1;
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::string created_by;
  bool encrypted_footer_fields = false;  // encryption_algorithm present (unsupported)
};

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed_size = 0;
  int32_t compressed_size = 0;
  // DATA_PAGE / DATA_PAGE_V2 / DICTIONARY_PAGE
  int32_t num_values = 0;
  int32_t encoding = 0;
  int32_t def_encoding = kRle;  // V1
  int32_t rep_encoding = kRle;  // V1
  // V2
  int32_t num_nulls = 0;
  int32_t num_rows = 0;
  int32_t def_bytes = 0;
  int32_t rep_bytes = 0;
  bool v2_compressed = true;
};

// Decoders throw dlrec::Error starting with `what`.
FileMetaData decode_file_metadata(const uint8_t* data, size_t size, const std::string& what);
std::string encode_file_metadata(const FileMetaData& m);
// Decodes a page header at the start of [data, data + size); returns its length in bytes.
size_t decode_page_header(const uint8_t* data, size_t size, const std::string& what,
                          PageHeader& out);
std::string encode_page_header(const PageHeader& h);

// ---- RLE / bit-packed hybrid (levels, dictionary indices, RLE booleans)

// Number of bits needed for values in [0, max_value].
int bit_width(uint64_t max_value);

// Decodes `count` values of `width` bits (0..32) from [data, data + size) into out[0..count).
// Throws "<what>: ..." when the runs end early or a run is malformed.
void rle_decode(const uint8_t* data, size_t size, int width, int64_t count, uint32_t* out,
                const std::string& what);
// Appends the hybrid encoding of values[0..count) to `out` (no length prefix).
void rle_encode(const uint32_t* values, int64_t count, int width, std::string& out);

// ---- codecs

// The codecs the reader decompresses.
inline constexpr const char* kSupportedCodecs =
    "UNCOMPRESSED, SNAPPY, ZSTD, GZIP, LZ4_RAW, LZ4, BROTLI";
inline bool codec_supported(int32_t c) {
  return c == kUncompressed || c == kSnappy || c == kZstd || c == kGzip || c == kLz4Raw ||
         c == kLz4 || c == kBrotli;
}

// Decompresses into exactly `uncompressed_size` bytes. Throws naming the codec when it is not
// supported or the data is corrupt, and before allocating when `uncompressed_size` is more than
// `size` bytes of the codec can decode to.
void decompress(int32_t codec, const uint8_t* data, size_t size, size_t uncompressed_size,
                std::string& out, const std::string& what);
// decompress() for GZIP, LZ4_RAW, LZ4 and BROTLI (parquet_codecs.cc); `out` is already
// `uncompressed_size` bytes long, except for BROTLI (its buffer grows as it decodes).
void decompress_more(int32_t codec, const uint8_t* data, size_t size, size_t uncompressed_size,
                     std::string& out, const std::string& what);
void compress(int32_t codec, const char* data, size_t size, std::string& out);

}  // namespace dlrec::io::pq
