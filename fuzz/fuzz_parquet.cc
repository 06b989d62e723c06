// Fuzz target: the Parquet reader (footer and Thrift compact decoding, schema, pages V1/V2,
// dictionary and RLE/bit-packed levels, the UNCOMPRESSED/SNAPPY/ZSTD codecs), through both
// io::ParquetFile (every column of every row group) and io::ParquetReader (the ETL's input,
// with a schema made from the file's own columns).
//
// Input: 1 selector byte, then the file's bytes.
//   bit 0: categorical BYTE_ARRAY columns parsed as hex (else hashed strings)
//   bit 1: on_error skip;  bits 2-3: chunk_rows (1, 3, 100, 65536)
#include <string>
#include <vector>

#include "dlrec/io/parquet.h"
#include "fuzz_util.h"

namespace {

using namespace dlrec;

// Values decoded per call are bounded by the column's rows; a footer may claim any count, so
// only files whose row groups are small enough for the fuzzer's memory are decoded in full
// through ParquetFile (the reader itself must reject lies about sizes; see ParquetReader below,
// which decodes in chunks whatever the claim).
constexpr int64_t kMaxRowsDecoded = 1 << 20;

void read_columns(const io::ParquetFile& f) {
  for (int g = 0; g < f.num_row_groups(); ++g) {
    if (f.row_group_rows(g) > kMaxRowsDecoded) continue;
    for (int c = 0; c < static_cast<int>(f.fields().size()); ++c) {
      fuzz::guarded("parquet", [&] {
        io::ParquetColumnData d = f.read_column(g, c);
        const int64_t slots = d.slots();
        if (slots < 0 || (!d.valid.empty() && d.valid.size() != static_cast<size_t>(slots)))
          fuzz::finding("parquet", "column data: valid flags do not match the slots");
        if (!d.offsets.empty() && d.offsets.size() != static_cast<size_t>(d.rows) + 1)
          fuzz::finding("parquet", "column data: list offsets do not match the rows");
      });
    }
  }
}

io::Schema schema_of(const io::ParquetFile& f, bool hex) {
  io::Schema s;
  s.header = true;
  s.cat_encoding = hex ? io::CatEncoding::Hex : io::CatEncoding::String;
  bool label = false;
  for (size_t i = 0; i < f.fields().size(); ++i) {
    const io::ParquetField& fd = f.fields()[i];
    io::ColumnSpec c;
    c.name = fd.name;
    if (!label && fd.name == "label") {
      c.kind = io::ColumnKind::Label;
      label = true;
    } else if (fd.list) {
      c.kind = io::ColumnKind::Categorical;
      c.multi_hot = true;
    } else if (fd.type == io::ParquetType::ByteArray || i % 2 == 1) {
      c.kind = io::ColumnKind::Categorical;
    } else {
      c.kind = io::ColumnKind::Dense;
    }
    bool dup = false;  // the schema rejects duplicate names; the file may repeat one
    for (const auto& o : s.columns) dup |= o.name == c.name;
    if (!dup) s.columns.push_back(c);
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const uint8_t sel = in.byte();
  fuzz::MemFile file(in.data(), in.size());
  io::Schema schema;
  bool opened = fuzz::guarded("parquet", [&] {
    io::ParquetFile f(file.path());
    read_columns(f);
    schema = schema_of(f, sel & 1);
  });
  if (!opened || schema.columns.empty()) return 0;
  io::ReadOptions opt;
  opt.on_error = (sel & 2) ? io::OnError::Skip : io::OnError::Fail;
  static const int64_t kChunkRows[4] = {1, 3, 100, 65536};
  opt.chunk_rows = kChunkRows[(sel >> 2) & 3];
  fuzz::guarded("parquet", [&] {
    io::ParquetReader reader({file.path()}, schema, opt);
    io::RawChunk chunk;
    int64_t rows = 0;
    while (reader.next(chunk) && rows < 4 * kMaxRowsDecoded) rows += chunk.rows;
  });
  return 0;
}
