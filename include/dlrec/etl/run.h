// run_etl: raw text files -> a training dataset directory (the `dlrec etl` command).
//
// Parses the input once when its parsed rows fit in memory (input_cache_mb): the first fit pass
// keeps every parsed row for the later fit passes and the transform pass. Otherwise it reads
// the input once per fit pass (training rows only) and once more to transform every row.
// Writes into `output_dir`:
//   train_00000.shard ...  training rows (io::ShardWriter), `shard_rows` rows per file
//   valid_00000.shard ...  validation rows (none when the split leaves no validation rows)
//   workflow.json          the fitted workflow (Workflow::to_json)
//   stats.json             row counts and per-column statistics of the training rows
//   dataset.json           io::DatasetInfo; written last, so its presence means "complete"
// Every file goes through AtomicFile; on an error, the files this run created are removed, and
// temporaries left by killed runs are removed at the next start (src/etl/output_dir.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/etl/input_parts.h"
#include "dlrec/io/schema.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::etl {

// The form of the parsed input kept between the passes (EtlOptions::input_cache_form).
enum class CacheForm { Auto, Compact, Parsed };
// Transparent huge pages for the compacted kept rows (EtlOptions::input_cache_huge_pages).
enum class HugePages { Auto, On, Off };

struct EtlOptions {
  std::vector<std::string> inputs;  // text files, read in order as one stream of rows
  io::Schema schema;
  json workflow;                    // the pipeline config (Workflow::from_config)
  std::string output_dir;           // created if absent
  // Split, by position in the input (rows = good rows in file order):
  //   train_rows >= 0: the first train_rows rows train, the rest validate;
  //   otherwise the last valid_ratio of the rows validate (floor(rows * valid_ratio), counted
  //   by a fast newline pass; malformed rows skipped with OnError::Skip shrink the validation
  //   split). valid_ratio = 0: everything trains.
  int64_t train_rows = -1;
  double valid_ratio = 0.0;
  int64_t shard_rows = int64_t{1} << 22;  // rows per shard file
  int64_t block_rows = int64_t{1} << 16;  // rows per checksummed shard block
  // Parsed chunks of 4096 rows (1.9 MB for Criteo) stay in the L2 cache between parsing,
  // fitting/transforming and writing (65536-row chunks were 2-3x slower; 4096 rows took 5-7 %
  // less CPU than 8192 on a 16-core host at 1 and 16 threads, with a third fewer page faults:
  // fewer bytes of parsed rows in flight, docs/ETL.md); results do not depend on the chunk size.
  // read.parse_ahead (pieces the reader parses ahead, [0, 4096], 0: its default) is replaced
  // by one per thread under memory_budget_mb.
  io::ReadOptions read = {int64_t{1} << 12};
  // An output_dir that already holds a dataset.json is an error unless `overwrite`; then the
  // new dataset is written beside it ("<output_dir>.tmp.<pid>") and swapped in once complete,
  // so that the old one stays whole until then (docs/ETL.md "Crashes and --overwrite"); the
  // directory must hold nothing but dataset files. A new output_dir is written beside it too
  // and renamed into place; an existing one without a dataset is written in place.
  bool overwrite = false;
  // Memory budget in MB for the fit's vocabularies (0: no limit, all in memory). Past it,
  // Categorify spills sorted (key, count) runs to `spill_dir` and merges them (docs/ETL.md).
  int64_t memory_budget_mb = 0;
  std::string spill_dir;  // default: output_dir
  // Training rows for N data-parallel ranks (docs/ETL.md "Shuffling and ranks"): with
  // `shuffle`, the training rows are permuted (a seeded permutation of their positions: rows
  // move within and across files); with ranks > 1 they are split into `ranks` sets of equal
  // size (+-1 row), train_rRRR_NNNNN.shard, listed per rank in ranks.json. Validation rows keep
  // their order. Deterministic for a seed, whatever the thread count.
  bool shuffle = false;
  uint64_t seed = 0;
  int ranks = 1;
  // Memory in MB for the parsed input kept between the passes, so that it is parsed only once.
  // The first fit pass then reads every row and keeps it; past this size it drops what it
  // kept and the later passes read the input again (the output is the same either way).
  // 0: never keep it. -1 (default): a quarter of memory_budget_mb when that is set, else 40 %
  // of the machine's physical memory.
  int64_t input_cache_mb = -1;
  // How the kept rows are held (the output is the same): as parsed (io::RawChunk, about 1.9x
  // the Criteo-shaped text), or compacted (etl::KeptChunk, about 0.6x, copied on the fit's
  // threads and unpacked by the transform). Auto: compacted when its memory gets transparent
  // huge pages (input_cache_huge_pages; on the 16-core host 1055-1134 MB/s vs 965-1007 for
  // parsed and 910-978 for compacted without them, docs/ETL.md), under a memory budget, or when
  // the row count (valid_ratio) says the parsed rows do not fit in input_cache_mb; else as parsed.
  CacheForm input_cache_form = CacheForm::Auto;
  // Ask for transparent huge pages (MADV_HUGEPAGE) on the memory of the compacted rows
  // (etl::KeptArena). Auto: where the kernel allows them for madvise and already has free 2 MB
  // blocks for twice the expected compacted size (etl::huge_pages_free_for), so that no memory
  // is compacted to find them (that cost 2.1-2.2 s of system time for a 1 GB cache on a
  // fragmented machine); On: always; Off: never.
  HugePages input_cache_huge_pages = HugePages::Auto;
  // Batches of parsed chunks the reader's helper thread may have ready ahead of the fit and
  // transform loops (their parse fills the threads those loops leave idle). 0: 2 with a
  // compacted cache, else 1 (and 1 under memory_budget_mb).
  int read_ahead = 0;
  // Fit batches in flight (Workflow::fit_batches' window): the fit's column tasks go through
  // up to this many batches each at its own pace, on threads of their own, instead of waiting
  // for the slowest column at every batch. 0: 4 when the thread count is at most half the cores (measured +13-18 % at 8
  // threads on 16 cores, no gain at 16: docs/ETL.md), else 1; always 1 (one fork-join per
  // batch, as before) under memory_budget_mb or with one thread.
  int fit_window = 0;
  // The row count of the split (valid_ratio) for inputs of at least this many bytes: counted on
  // a thread of its own while the fit reads the first rows (RowCountAhead), instead of on all
  // cores before it (0.08-0.14 s of a 2 GB input on the 16-core host); the fit waits only where
  // a chunk might hold the split before the count is that far. Only for regular text files
  // (and Parquet) whose estimated rows fit in the input cache (the cache decisions then use
  // an estimate from the first MB; the reader must not stop at the split). -1: never.
  int64_t count_ahead_min_bytes = int64_t{64} << 20;
  // The input already parsed (rank 0 of `dlrec etl` under mpirun: the ranks' parts gathered in
  // input order, etl/input_parts.h): every pass reads these rows instead of parsing `inputs`
  // (which must still name the files: sizes, side tables), and the split counts them. Null:
  // parse `inputs`.
  std::shared_ptr<const ParsedInput> parsed_input;
};

struct EtlResult {
  int64_t train_rows = 0;
  int64_t valid_rows = 0;
  int64_t skipped_rows = 0;  // malformed rows skipped in the whole input (OnError::Skip)
  // What the run did that a user may not expect but is not an error, one line each (`dlrec
  // etl` prints them): a validation split asked for that came out empty.
  std::vector<std::string> warnings;
  int64_t input_bytes = 0;   // size of the input files
  int64_t output_bytes = 0;  // size of every file written
  int fit_passes = 0;
  int64_t spill_runs = 0, spill_bytes = 0;  // vocabulary counts spilled under memory_budget_mb
  std::vector<std::string> train_shards, valid_shards;  // names inside output_dir
  std::vector<std::vector<std::string>> rank_shards;    // per rank (ranks > 1 or shuffle)
  // count_seconds: the row count before the fit, or with count_ahead the time the fit waited
  // for the count (RowCountAhead) and its estimate took.
  bool count_ahead = false;
  double count_seconds = 0, fit_seconds = 0, transform_seconds = 0, total_seconds = 0;
  // Where the passes waited: read_wait_seconds = time the fit and transform loops waited for
  // the next batch of parsed chunks (the reader is the bottleneck when it is large);
  // write_seconds = time the shard-writing thread worked (encoding, file writes, fsync) during
  // the transform pass (the writer is the bottleneck when it nears transform_seconds).
  double read_wait_seconds = 0, write_seconds = 0;
  // Of the shard files (not the ranked ones): seconds spent copying encoded blocks into the
  // files (a helper thread per file, io::ShardWriter::Times), and seconds the writer thread
  // waited for those copies before encoding the next blocks (the file copy is the
  // bottleneck when it is large).
  double file_write_seconds = 0, append_wait_seconds = 0;
  // CPU seconds (user + system, all threads) of the process during the fit and the transform
  // pass: divided by the seconds and the thread count, how busy the threads were.
  double fit_cpu_seconds = 0, transform_cpu_seconds = 0;
  // Bytes of parsed input kept in memory between the passes (0: the input was parsed again
  // for each pass, see EtlOptions::input_cache_mb).
  int64_t input_cache_bytes = 0;
  // The form the run chose for the kept rows, and whether their memory asked for huge pages.
  bool input_cache_compact = false, input_cache_huge_pages = false;
};

EtlResult run_etl(const EtlOptions& options);

// "auto", "compact" or "parsed"; anything else is an error naming the valid ones.
CacheForm parse_cache_form(const std::string& s);

// Non-blank lines of the files (minus one header line per file when schema.header), counted
// with memchr over large reads: the row count before parsing.
int64_t count_rows(const std::vector<std::string>& files, const io::Schema& schema);

// The rows the reader delivers with `read` (its on_error and the schema's input options applied:
// malformed rows skipped with OnError::Skip are not rows), counted by parsing the input: the
// count of the split when a newline count would include lines that are not rows.
int64_t count_parsed_rows(const std::vector<std::string>& files, const io::Schema& schema,
                          const io::ReadOptions& read);

// The training rows of a split with `valid_ratio` of `rows` rows validating (the last
// floor(rows * valid_ratio)). Never decreases as `rows` grows.
int64_t train_rows_of(int64_t rows, double valid_ratio);

// count_rows on a thread of its own, the files one after the other (Parquet: from the footer),
// so that a reader can start on the first rows meanwhile: train_before() says how many of the
// first rows are training rows as soon as the lines counted so far prove it (they are a lower
// bound of the count, and train_rows_of never decreases), waiting only until then. Regular
// files and Parquet only (a pipe cannot be read twice). The destructor stops the count.
class RowCountAhead {
 public:
  RowCountAhead(std::vector<std::string> files, io::Schema schema, double valid_ratio);
  ~RowCountAhead();
  RowCountAhead(const RowCountAhead&) = delete;
  RowCountAhead& operator=(const RowCountAhead&) = delete;

  // min(upto, train_rows_of(count)): waits until the count is done or its lines so far show
  // that the first `upto` rows all train. Rethrows the count's error.
  int64_t train_before(int64_t upto);
  // The count, waiting for it; rethrows its error.
  int64_t rows();
  // Seconds the calls above waited.
  double wait_seconds() const { return waited_; }

 private:
  void run();

  std::vector<std::string> files_;
  io::Schema schema_;
  double valid_ratio_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t lower_ = 0;   // rows counted so far: at most the count
  int64_t total_ = -1;  // the count, once done
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
  double waited_ = 0;
  std::thread thread_;
};

}  // namespace dlrec::etl
