// run_etl in stages (internal to src/etl): one EtlRun per call, its stages run in order, each a
// member function with one job:
//   check_options   the options and inputs, before anything is written
//   plan_split      the split: given, counted first, or counted ahead beside the fit
//   fit             the fit passes over the training rows (keeping the parsed input in the
//                   cache when it fits), then the fitted workflow saved on a helper thread
//   transform       every row transformed and written into the shard files (run_transform.cc)
//   write_metadata  stats.json, ranks.json, dataset.json last (run_transform.cc)
// The members below are the state the stages hand on to each other.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/progress.h"
#include "dlrec/etl/kept_chunks.h"
#include "dlrec/etl/run.h"
#include "dlrec/etl/workflow.h"
#include "etl/output_dir.h"
#include "etl/run_input.h"

namespace dlrec::etl::run_detail {

// DLREC_ETL_TIMES=1 (a diagnostic, docs/DIAGNOSTICS.md): the run's clock at the end of each
// phase and of the clean-up, on stderr (where the seconds outside the count, fit and
// transform timers go).
class PhaseClock {
 public:
  PhaseClock();
  void mark(const char* what) const;

 private:
  Timer timer_;
  bool on_ = false;
};

class EtlRun {
 public:
  explicit EtlRun(const EtlOptions& o);
  ~EtlRun();
  EtlResult run();

 private:
  // ---- stages
  Workflow checked_workflow();  // check_options, then the workflow from the config
  void check_options();
  void plan_split();
  void fit();
  void transform();
  void write_metadata();

  // ---- the split (plan_split): n_train_ training rows first, or counting ahead
  void set_split(int64_t rows);   // the split of `rows` rows (valid_ratio)
  void check_counts();  // after the transform: no training rows fails, no validation rows warns
  void count_first();             // counts on all cores now
  void count_known();             // waits for the count ahead and sets the split from it
  int64_t split_before(int64_t upto);
  // Whether the split's row count must parse the input (count_parsed_rows): some non-blank lines
  // are not rows (OnError::Skip, the schema's comment lines and skip_lines).
  bool parse_to_count() const {
    return o_.read.on_error == io::OnError::Skip || !o_.schema.comment.empty() ||
           o_.schema.skip_lines > 0;
  }  // min(upto, n_train_): training rows of the first upto

  // ---- the fit's parts
  void decide_cache();       // the input cache's form and whether it is on
  void plan_cache_and_count();  // the cache's size, then counting ahead or first
  int choose_fit_window() const;
  void run_fit_passes();     // Workflow::fit_batches, again without the cache after a read error
  ChunkBatchSource open_fit_pass();
  ChunkBatchSource cached_fit_pass();                // a later pass over the kept chunks
  ChunkBatchSource reading_fit_pass(bool first);     // reads (and on pass 1 keeps) the rows
  void wait_for_saving();  // the workflow.json thread (listing its file for clean-up)

  // ---- the transform's parts (run_transform.cc)
  struct TransformPass;  // the pass's writers, batches and counters
  int next_transform_batch(TransformPass& t, std::vector<io::RawChunk>& out);
  void transform_direct_from_cache(TransformPass& t);
  void transform_direct_batches(TransformPass& t);
  void transform_with_writer_thread(TransformPass& t);
  void hand_to_writer_thread(TransformPass& t, int n);

  const EtlOptions& o_;
  PhaseClock clock_;
  Timer total_timer_;
  EtlResult res_;
  Workflow workflow_;  // after res_: checked_workflow() adds the input bytes to it
  std::unique_ptr<EtlOutput> output_;
  std::string out_dir_;
  std::vector<std::string> created_;  // files written so far (removed on an error)

  // The split: the first n_train_ good rows train (-1: all rows). Counting ahead
  // (EtlOptions::count_ahead_min_bytes): until count_known(), n_train_ is not set,
  // expected_rows_ is an estimate, and split_before() asks the count (started once the input
  // cache is known to be on).
  int64_t n_train_ = -1;
  int64_t expected_rows_ = -1;
  std::unique_ptr<RowCountAhead> ahead_;
  bool counting_ = false;

  // The fit's state.
  InputCache cache_;
  int window_ = 1;      // fit batches in flight
  int read_ahead_ = 1;  // reader batches parsed ahead
  int pass_ = 0;
  std::unique_ptr<BatchReader> batches_;
  std::unique_ptr<Progress> progress_;
  int64_t fit_rows_ = 0;
  bool cached_ = false;        // the transform pass reads the cache
  int64_t read_rows_ = 0;      // input rows read by this fit pass
  // The reader's batches in flight, one per slot (the source's call number modulo window).
  std::vector<std::vector<io::RawChunk>> ring_;
  // Kept chunks unpacked for a later fit pass, per slot.
  std::vector<std::vector<io::RawChunk>> unpacked_;
  // Up to n of the chunks above that hold memory (moved out): the transform's unpack targets.
  std::vector<io::RawChunk> spare_fit_chunks(int n);
  bool cache_read_failed_ = false;  // the reader failed in the first pass, keeping rows
  FitSideWork side_;                // the fit's side tasks: keeping a batch's rows
  // The first pass's reader when the transform reads the cache: it has seen every row, so its
  // statistics (skipped rows) are the transform's.
  std::unique_ptr<BatchReader> fit_reader_;
  std::string workflow_path_;
  std::future<void> saving_;  // workflow.json, written during the transform

  // Handed from the transform to the metadata.
  io::ShardLayout layout_;
  std::vector<int64_t> rank_rows_;  // training rows per rank (ranks > 1 or shuffle)
  std::string first_skip_reason_;
};

}  // namespace dlrec::etl::run_detail
