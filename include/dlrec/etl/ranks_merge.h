// The output of an ETL job of several processes whose fit is merged (etl/fit_merge.h, docs/ETL.md
// "Several processes"): every process holds a consecutive range of the input's rows (its part,
// etl/input_parts.h); each shard file (train_NNNNN, valid_NNNNN: the single-process names and
// rows) is written by one process, the one holding most of its rows (the earlier on a tie),
// which receives the rest from its neighbours, transforms them with the fitted workflow and
// writes the file: the single process's bytes. The metadata (workflow.json, stats.json,
// dataset.json) is written by rank 0. No communication here: the caller moves the bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/etl/run.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/raw_chunk.h"

namespace dlrec::etl {

class EtlOutput;

// One shard file: global rows [begin, end) of the input, written by process `owner`.
struct RankShard {
  bool train = true;
  int index = 0;  // within the train or valid files
  int64_t begin = 0, end = 0;
  int owner = 0;
  std::string name() const;  // "train_00000.shard", as the single-process run names it
};

// The files of a split at n_train of the rows [rank_first[0] = 0, rank_first[N]) held by N
// processes (process p: [rank_first[p], rank_first[p + 1])), shard_rows rows per file.
std::vector<RankShard> plan_rank_shards(const std::vector<int64_t>& rank_first, int64_t n_train,
                                        int64_t shard_rows);

// Rows [begin, end) of a chunk.
struct RowSlice {
  const io::RawChunk* chunk = nullptr;
  int64_t begin = 0, end = 0;
};
// The slices of `chunks` (consecutive rows, the first one global row `first_row`) that hold the
// global rows [lo, hi).
std::vector<RowSlice> slices_of(const std::vector<io::RawChunk>& chunks, int64_t first_row,
                                int64_t lo, int64_t hi);

// The slice's rows as a chunk of their own (its first_line moved on as run_etl's are).
io::RawChunk copy_slice(const RowSlice& s);

// Transforms `rows` (in order) with `workflow` on the pool's threads and writes them as the shard
// file `path` (atomically), in groups of chunks so that the encoded rows in memory stay bounded.
// `scratch`: the transformed chunks' buffers, kept from call to call (fresh pages cost page
// faults); nullptr: the call's own.
void write_rank_shard(const Workflow& workflow, const std::vector<RowSlice>& rows,
                      const std::string& path, int64_t block_rows,
                      std::vector<io::Batch>* scratch = nullptr);

// Rank 0's part: the output directory (as run_etl decides it: a staging directory beside a new
// or replaced one, etl/output_dir.h) and, once every file is written, the metadata and the
// commit. Without commit() the staging directory is removed.
class RankOutput {
 public:
  explicit RankOutput(const EtlOptions& o);
  ~RankOutput();
  const std::string& dir() const;
  // workflow.json, stats.json and dataset.json as run_etl writes them, then the dataset in place.
  // Fills res's output_bytes, train_shards and valid_shards.
  void finish(const Workflow& workflow, const std::vector<RankShard>& shards, EtlResult& res,
              const std::string& first_skip_reason);

 private:
  std::unique_ptr<EtlOutput> out_;
};

}  // namespace dlrec::etl
