// Streaming reader for delimited text (Criteo TSV, CSV) that parses on all cores.
//
// A regular file is mapped and cut into pieces of about `chunk_rows` lines, parsed ahead by
// num_threads() - 1 threads of the reader (and the caller) into one RawChunk each and handed out
// in input order; other input (a pipe) is read in blocks of `block_bytes` cut at line ends,
// each block split among threads and parsed into a RawChunk of at most `chunk_rows` rows. A malformed row (wrong field count,
// unparsable number, bad hex, truncated last line) throws dlrec::Error naming the file, the
// 1-based line and the 1-based column; with OnError::Skip it is skipped and counted instead.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/io/raw_chunk.h"
#include "dlrec/io/schema.h"

namespace dlrec::io {

enum class OnError { Fail, Skip };
OnError parse_on_error(const std::string& s);  // "fail" | "skip"

struct ReadOptions {
  int64_t chunk_rows = 1 << 16;
  size_t block_bytes = 8u << 20;
  OnError on_error = OnError::Fail;
  int64_t max_rows = -1;  // stop after this many good rows (-1: all)
  // Mapped files: pieces (of about chunk_rows lines) parsed ahead of next() by the reader's
  // own threads, at most this many claimed and not yet handed out (0: 2 x num_threads()).
  // Bounds the memory of parsed rows in flight.
  int parse_ahead = 0;
};

struct ReadStats {
  int64_t rows = 0;          // rows delivered
  int64_t skipped_rows = 0;  // malformed rows skipped (OnError::Skip)
  int64_t bytes = 0;         // input bytes consumed
  std::string first_skip_reason;  // message of the first skipped row
};

// A source of RawChunks: TextReader and ParquetReader (io/parquet.h); io::open_reader picks one
// by file extension.
class ChunkReader {
 public:
  virtual ~ChunkReader() = default;
  // Fills `out` with the next rows; false when the input is exhausted.
  virtual bool next(RawChunk& out) = 0;
  virtual const ReadStats& stats() const = 0;
};

class TextReader : public ChunkReader {
 public:
  TextReader(std::vector<std::string> files, Schema schema, ReadOptions options = {});
  ~TextReader() override;
  bool next(RawChunk& out) override;
  const ReadStats& stats() const override;
  const Schema& schema() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Parses one line (without its newline) into row `out.rows` of `out`. Used by TextReader and by
// `dlrec predict`. Throws dlrec::Error with `where` (e.g. "file.tsv:12") and the column.
void parse_line(const char* begin, const char* end, const Schema& schema,
                const std::vector<int>& field_to_column, RawChunk& out, const std::string& where);
// Maps file fields to schema columns; for header files, from the header line's names.
std::vector<int> field_mapping(const Schema& schema, const std::string& header_line,
                               const std::string& file);

}  // namespace dlrec::io
