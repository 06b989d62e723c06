// Apache Parquet, implemented in the project (Debian 12 has no Arrow package): a reader and a
// writer for the flat tabular files recommender pipelines exchange, and the ETL input hook.
//
// Supported subset (docs/FORMATS.md, "Parquet", has the details and the error messages):
//   columns      top-level primitive columns (REQUIRED or OPTIONAL) and lists of a primitive:
//                the 3-level LIST layout pyarrow writes (`<opt> group x (LIST) { repeated
//                group list { <opt> T element; } }`) and the legacy 2-level ones. Other nested
//                columns (structs, maps, nested lists) are reported as unsupported when used.
//   types        BOOLEAN, INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY (UTF-8 or binary).
//   pages        data pages V1 and V2, dictionary pages; index pages are skipped.
//   encodings    PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, RLE (booleans, levels),
//                RLE/bit-packed hybrid definition and repetition levels, DELTA_BINARY_PACKED,
//                DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY, BYTE_STREAM_SPLIT (read only).
//   codecs       UNCOMPRESSED, SNAPPY, ZSTD; for reading also GZIP, LZ4_RAW, LZ4 (Hadoop-framed
//                or a bare block) and BROTLI.
// Errors throw dlrec::Error naming the file and, inside data, the row group (0-based, as
// pyarrow counts them) and the column, and inside a page its number: "f.parquet: row group 2,
// column 'C3': data page 4: corrupt GZIP data (...)".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/io/raw_chunk.h"
#include "dlrec/io/schema.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::io {

enum class ParquetType { Boolean, Int32, Int64, Float, Double, ByteArray };
enum class ParquetCodec { Uncompressed, Snappy, Zstd };

const char* parquet_type_name(ParquetType t);  // "BOOLEAN", "INT32", ...
ParquetType parse_parquet_type(const std::string& s);  // "bool"|"int32"|"int64"|"float"|
                                                       // "double"|"string"|"binary" (or the
                                                       // upper-case physical names)
ParquetCodec parse_parquet_codec(const std::string& s);  // "none"|"uncompressed"|"snappy"|"zstd"

// One top-level column.
struct ParquetField {
  std::string name;
  ParquetType type = ParquetType::Int64;  // the physical type (of the elements, for lists)
  bool nullable = true;   // OPTIONAL (true) or REQUIRED; for lists: the list itself
  bool list = false;      // a LIST of `type`; its elements are always nullable
  bool is_unsigned = false;  // INT32/INT64 annotated UINT_32/UINT_64 (read only)
  bool utf8 = true;          // BYTE_ARRAY annotated as a string (written as STRING/UTF8)
};

// The values of one column over `rows` rows. Every value has a slot: one per row for flat
// columns, one per list element for lists. Slots of nulls hold 0 / 0.0 / "".
//   Boolean, Int32, Int64 -> ints;  Float, Double -> reals;  ByteArray -> strings.
struct ParquetColumnData {
  int64_t rows = 0;
  std::vector<int64_t> ints;
  std::vector<double> reals;
  std::vector<std::string> strings;
  std::vector<uint8_t> valid;          // per slot, 1 = present; empty = all present
  std::vector<int64_t> offsets;        // lists: [rows + 1], row r's slots [off[r], off[r+1])
  std::vector<uint8_t> row_valid;      // lists: per row, 0 = null list; empty = all present

  int64_t slots() const { return offsets.empty() ? rows : offsets.back(); }
  bool present(int64_t slot) const { return valid.empty() || valid[slot] != 0; }
  bool row_present(int64_t r) const { return row_valid.empty() || row_valid[r] != 0; }
};

// ---------------------------------------------------------------------------------------------
// Reading

// An open Parquet file: its footer is read and validated on construction; column data is read
// on demand, one column chunk at a time. Not thread-safe (use one per thread).
class ParquetFile {
 public:
  explicit ParquetFile(const std::string& path);
  ~ParquetFile();
  ParquetFile(ParquetFile&&) noexcept;
  ParquetFile& operator=(ParquetFile&&) noexcept;

  const std::string& path() const;
  int64_t num_rows() const;
  int num_row_groups() const;
  int64_t row_group_rows(int row_group) const;
  const std::string& created_by() const;
  // Top-level columns in file order. A column of an unsupported shape is listed with
  // `unsupported_reason(i)` non-empty; reading it throws that reason.
  const std::vector<ParquetField>& fields() const;
  const std::string& unsupported_reason(int field) const;
  int field_index(const std::string& name) const;  // -1 when absent

  // Reads one column of one row group completely.
  ParquetColumnData read_column(int row_group, int field) const;

  // The decoded footer and schema (defined in src/io/parquet_column.h; for the reader's own
  // use).
  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Streams RawChunks from Parquet files for an io::Schema (the ETL input). Schema columns are
// matched by name (order, delimiter, header are irrelevant; file columns the schema does not name
// are not read). Conversions:
//   label        any numeric or BOOLEAN column; must be 0 or 1 and not null.
//   dense        BOOLEAN/INT32/INT64/FLOAT/DOUBLE -> float; null -> NaN (missing).
//   categorical  INT32/INT64/BOOLEAN: the value is the key (two's complement bits, unsigned
//                annotations honoured); BYTE_ARRAY: with the schema's cat_encoding "string",
//                hash_category of the bytes, with "hex", the bytes parsed as hexadecimal (as
//                the text reader does). Null -> missing (an empty list).
//   multi-hot    a LIST column (or a flat one: one value per row); null elements are dropped;
//                a null list is missing. A LIST column for a one-hot schema column is an error.
// Reads one row group at a time and decodes only `chunk_rows` rows of each column per next()
// call (columns in parallel), so memory is bounded by a page per column, not by the file.
// ReadOptions: chunk_rows, max_rows and on_error apply (Skip drops rows with a null or non-0/1
// label); block_bytes does not.
class ParquetReader : public ChunkReader {
 public:
  ParquetReader(std::vector<std::string> files, Schema schema, ReadOptions options = {});
  ~ParquetReader() override;
  bool next(RawChunk& out) override;
  const ReadStats& stats() const override;
  const Schema& schema() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Writing

struct ParquetWriteOptions {
  ParquetCodec codec = ParquetCodec::Snappy;
  bool dictionary = true;      // dictionary-encode each column chunk (falls back to PLAIN
                               // when the dictionary would exceed dictionary_max_bytes)
  int64_t dictionary_max_bytes = 1 << 20;
  int64_t row_group_rows = 1 << 20;  // used by write_parquet()
  int64_t page_rows = 1 << 16;       // rows per data page (V1)
};

// Writes a Parquet file atomically (dlrec::AtomicFile): row groups as they come, the footer on
// close(). Destroying it without close() leaves no file behind.
class ParquetWriter {
 public:
  ParquetWriter(const std::string& path, std::vector<ParquetField> fields,
                ParquetWriteOptions options = {});
  ~ParquetWriter();
  // One row group: one ParquetColumnData per field, all with the same `rows` (>= 1).
  void write_row_group(const std::vector<ParquetColumnData>& columns);
  void close();
  int64_t rows() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes whole columns, cut into row groups of options.row_group_rows rows.
void write_parquet(const std::string& path, const std::vector<ParquetField>& fields,
                   const std::vector<ParquetColumnData>& columns,
                   const ParquetWriteOptions& options = {});

// ---------------------------------------------------------------------------------------------
// ETL input: the reader for a list of input files

// True for names ending in ".parquet" or ".parq" (case-insensitive).
bool is_parquet_path(const std::string& path);
// Opens Parquet files with ParquetReader and text files with TextReader; mixing both kinds in
// one list is an error.
std::unique_ptr<ChunkReader> open_reader(const std::vector<std::string>& files,
                                         const Schema& schema, const ReadOptions& options);
// Rows of a Parquet file (from its footer).
int64_t parquet_num_rows(const std::string& path);

}  // namespace dlrec::io
