// The ETL's input cut into parts for a job of several processes (docs/ETL.md "Several
// processes"): part p of n is a byte range of the concatenated text inputs, cut at line
// starts, that process p parses alone. The parts' rows, gathered in part order, are the rows a
// single reader gives, in the same order and with the same values; EtlOptions::parsed_input
// then makes run_etl read them instead of the files, so the output is the single-process
// run's, byte for byte. No MPI here: the communication is the caller's (apps/dlrec).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/io/raw_chunk.h"
#include "dlrec/io/schema.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::etl {

// Rows parsed from the input (all of it, or one part once settled), in input order.
struct ParsedInput {
  std::vector<io::RawChunk> chunks;
  io::ReadStats stats;  // rows, skipped rows (OnError::Skip) and the first skip's message
};

// One part's parse before its line numbers are known: lines are numbered from 1 at the start
// of the part's range in each file (after the preamble the part owns); settle_part() adds the
// lines of the earlier parts.
struct InputPart {
  ParsedInput parsed;
  std::vector<int> chunk_file;  // per chunk: the input file it comes from
  // Per input file: the lines this part owns (its range's, and the file's preamble with the
  // file's first range), which the later parts' line numbers count after.
  std::vector<int64_t> file_lines;
  // The first malformed row (OnError::Fail: parsing stopped there; Skip: the first skipped):
  // its file (-1: none), local line number and message without the "file:line: " prefix.
  int error_file = -1;
  int64_t error_line = 0;
  std::string error_message;
  bool failed = false;  // OnError::Fail and a malformed row: the part is incomplete
};

// Parses part `part` of `parts` of the text `files` (Parquet is refused: cut it into files).
// Every part computes the same cut points: the data bytes of all files (after each file's
// preamble: byte order mark, skip_lines, header) are split into `parts` equal ranges, each
// boundary moved forward to the next line start. A malformed row does not throw: it is
// recorded in the part (error_*), so that the job can report the first one in input order.
// The part's range of each file is parsed on the pool's threads (parallel_for) in pieces of
// min_piece_bytes or more (tests make it small to have many pieces).
InputPart parse_input_part(const std::vector<std::string>& files, const io::Schema& schema,
                           const io::ReadOptions& read, int part, int parts,
                           size_t min_piece_bytes = size_t{4} << 20);

// Turns the part's local line numbers into the files' (lines_before[f]: the lines of file f in
// the parts before this one, all_gathered by the caller) and returns the message of its first
// malformed row ("file:line: ...", empty if none).
std::string settle_part(InputPart& p, const std::vector<std::string>& files,
                        const std::vector<int64_t>& lines_before);

// A settled part as bytes and back: the gathering process appends each part's rows and
// statistics to `into` in part order (rows and skipped rows add up; the first skip message
// is the earliest part's).
std::string serialize_parsed(const ParsedInput& in);
void append_serialized(const char* data, size_t size, ParsedInput& into);

// A reader handing out copies of `input`'s chunks in order, stopping after max_rows rows
// (read.max_rows; -1: all), as io::open_reader would read the files.
std::unique_ptr<io::ChunkReader> replay_reader(std::shared_ptr<const ParsedInput> input,
                                               const io::ReadOptions& read);

}  // namespace dlrec::etl
