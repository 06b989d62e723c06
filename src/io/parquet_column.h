// Internals of the Parquet reader: the open file (footer, schema tree resolved to top-level
// fields with their level structure) and ColumnCursor, which decodes one column chunk page by
// page and hands out whole rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/io/parquet.h"
#include "io/parquet_format.h"

namespace dlrec::io {

// How a ColumnCursor delivers BYTE_ARRAY values.
enum class BytesMode {
  Strings,  // ParquetColumnData::strings
  Hash,     // keys = hash_category(bytes); an empty value is missing
  Hex,      // keys = the bytes parsed as hexadecimal; an empty value is missing
};

// ParquetColumnData plus `keys` (one per slot) for BytesMode::Hash / Hex.
struct ColumnValues : ParquetColumnData {
  std::vector<uint64_t> keys;
  void clear();
};

// A top-level column and how its definition/repetition levels map to rows and values.
struct FieldLevels {
  int leaf = -1;         // index of its leaf among the file's leaves (= column chunk index)
  int32_t physical = -1;
  int16_t max_def = 0, max_rep = 0;
  // Lists: def < null_below -> null list; def < empty_below -> empty list; def < max_def ->
  // null element.
  int16_t null_below = 0, empty_below = 0;
};

struct ParquetFile::Impl {
  std::string path;
  int fd = -1;
  uint64_t file_size = 0;
  uint64_t data_end = 0;  // where the footer starts
  pq::FileMetaData meta;
  int num_leaves = 0;
  std::vector<ParquetField> fields;
  std::vector<FieldLevels> levels;
  std::vector<std::string> unsupported;

  ~Impl();
  void pread_exact(uint64_t offset, size_t n, void* out, const std::string& what) const;
  std::string context(int row_group, int field) const;  // "f: row group 2, column 'C3'"
};

class ColumnCursor {
 public:
  ColumnCursor(const ParquetFile::Impl& file, int row_group, int field, BytesMode mode);
  ~ColumnCursor();
  // Appends the next `rows` rows to `out` (rows, offsets, valid, ... grow).
  void read(int64_t rows, ColumnValues& out);
  const std::string& context() const;
  int64_t bytes_read() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace dlrec::io
