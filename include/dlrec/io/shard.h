// Training shards: the binary format ETL writes and loaders read (docs/FORMATS.md).
//
// A shard holds encoded rows (io::Batch) in blocks, each block checksummed (CRC-32C), with a
// header naming the format version and the column layout, and a footer with the block index.
// Readers reject a bad magic, an unknown version, a checksum mismatch or a truncated file with
// a message naming the file and the block.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/batch.h"

namespace dlrec::io {

struct ShardLayout {
  int num_dense = 0;
  std::vector<int64_t> cardinalities;  // per categorical feature
  std::vector<bool> multi_hot;         // per categorical feature
  bool operator==(const ShardLayout& o) const {
    return num_dense == o.num_dense && cardinalities == o.cardinalities &&
           multi_hot == o.multi_hot;
  }
  json to_json() const;
  static ShardLayout from_json(const json& j);
};

// Rows [begin, end) of a batch (ShardWriter::write_parts).
struct BatchRows {
  const Batch* batch = nullptr;
  int64_t begin = 0, end = 0;
};

class ShardWriter {
 public:
  // Writes atomically: the file appears at `path` only after close().
  ShardWriter(const std::string& path, ShardLayout layout, int64_t block_rows = 1 << 16);
  ~ShardWriter();
  void write(const Batch& batch);  // validates ids against the cardinalities
  // Writes the parts' rows in order: the same bytes as write() of each part in turn. The parts
  // are validated (before anything is written), and the whole blocks they complete encoded
  // and checksummed, on all cores; the blocks reach the file in order.
  void write_parts(const std::vector<BatchRows>& parts);
  void close();
  int64_t rows() const;

  // Rows placed at known positions, from several threads at once (the ETL's transform tasks
  // encode their own rows: no separate encoding pass). Only for layouts whose features are all
  // one-hot (direct_ok()); do not mix with write()/write_parts() on one writer.
  //   reserve(n): the next n rows of the file; returns the first one's row number. One thread
  //     at a time. Waits while many finished blocks wait for the file (bounded memory);
  //     rethrows an earlier file write error.
  //   write_at(b, begin, end, at): validates rows [begin, end) of b (as write() does; nothing is
  //     encoded if they are bad) and encodes them as the file's rows [at, at + end - begin),
  //     which must be reserved and not written before. Thread-safe for disjoint ranges. The thread
  //     that completes a block checksums it; a helper thread writes the finished blocks in
  //     order. close() (once every reserved row is written) writes the last, partial block.
  // The file's bytes are those write() of the same rows gives.
  bool direct_ok() const;
  int64_t reserve(int64_t n);
  // Reserved rows whose write_at has not returned yet (0: close() may be called).
  int64_t unwritten() const;
  void write_at(const Batch& b, int64_t begin, int64_t end, int64_t at);
  // Where write_parts' time went (for the ETL's bench line): seconds its helper thread spent
  // handing encoded blocks to the file (the page-cache copy), and seconds write_parts waited
  // for the previous call's blocks to reach the file before starting on the next ones. Complete
  // after close().
  struct Times {
    double file_write = 0, append_wait = 0;
  };
  Times times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ShardReader {
 public:
  explicit ShardReader(const std::string& path);  // reads and validates header and footer
  ~ShardReader();
  const ShardLayout& layout() const;
  int64_t rows() const;
  // Reads rows [begin, begin + count) into `out` (replacing its contents); verifies checksums.
  void read(int64_t begin, int64_t count, Batch& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A dataset: a directory of shards plus dataset.json (layout, shard list, split).
struct DatasetInfo {
  ShardLayout layout;
  std::vector<std::string> train_shards;  // paths relative to the dataset directory
  std::vector<std::string> valid_shards;
  int64_t train_rows = 0;
  int64_t valid_rows = 0;
  // Feature names (optional; empty when unknown): dense_names[num_dense], cat_names[num_cat].
  std::vector<std::string> dense_names;
  std::vector<std::string> cat_names;
  json to_json() const;
  static DatasetInfo from_json(const json& j);
  static DatasetInfo load(const std::string& dir);  // reads <dir>/dataset.json
  void save(const std::string& dir) const;          // writes <dir>/dataset.json atomically
  // Checks the description against the shards in `dir` (their headers and footers): every
  // listed shard opens, none is listed twice, each has this layout, and their rows add up to
  // train_rows and valid_rows. Errors name dataset.json, the shard and the numbers. The trainer
  // calls it before it trusts the counts (a wrong train_rows would change the epoch silently).
  void verify(const std::string& dir) const;
};

// One data-parallel rank's part of the training rows: the shards listed for `rank` in
// <dir>/ranks.json (`dlrec etl --ranks N`), paths relative to `dir`, and their row count.
// Errors name the cause: no ranks.json, a ranks.json for another number of ranks, rank
// outside [0, ranks), or shards that do not hold the rows ranks.json lists.
struct RankShards {
  std::vector<std::string> shards;
  int64_t rows = 0;
};
RankShards load_rank_shards(const std::string& dir, int rank, int ranks);

// Streams batches of a fixed size from a list of shards in order, from a row position, with a
// background thread prefetching the next batch. The last batch may be smaller.
// Data-parallel part (part, parts > 1): batch i is part `part` of the global batch of
// batch_size * parts rows at start_row + i * batch_size * parts: rows [+part * batch_size,
// +(part + 1) * batch_size); a last, partial global batch of g rows is split in `parts`
// contiguous pieces [g * part / parts, g * (part + 1) / parts) (which may be empty when
// g < parts). Every part reads only its own rows, and the parts of a global batch, in part
// order, are the rows a single loader with batch_size * parts would deliver.
class ShardLoader {
 public:
  ShardLoader(std::vector<std::string> paths, int64_t batch_size, int64_t start_row = 0,
              int part = 0, int parts = 1);
  ~ShardLoader();
  bool next(Batch& out);
  int64_t position() const;  // rows delivered so far, counting start_row
  int64_t total_rows() const;
  const ShardLayout& layout() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::io
