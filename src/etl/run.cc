// run_etl: the options, the split and the fit (run_stages.h lists the stages); the transform
// and the metadata are in run_transform.cc, the row count in row_count.cc.
#include "dlrec/etl/run.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <tuple>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/kept_chunks.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/text_reader.h"
#include "etl/output_dir.h"
#include "etl/run_input.h"
#include "etl/run_stages.h"

namespace dlrec::etl {

CacheForm parse_cache_form(const std::string& s) {
  if (s == "auto") return CacheForm::Auto;
  if (s == "compact") return CacheForm::Compact;
  if (s == "parsed") return CacheForm::Parsed;
  fail("input cache form must be 'auto', 'compact' or 'parsed', got '", s, "'");
}

EtlResult run_etl(const EtlOptions& o) { return run_detail::EtlRun(o).run(); }

namespace run_detail {

PhaseClock::PhaseClock() {
  const char* env = std::getenv("DLREC_ETL_TIMES");
  on_ = env && *env == '1';
}

void PhaseClock::mark(const char* what) const {
  if (on_) std::fprintf(stderr, "etl times: %-28s %.3f s\n", what, timer_.seconds());
}

EtlRun::EtlRun(const EtlOptions& o) : o_(o), workflow_(checked_workflow()) {}

EtlRun::~EtlRun() { clock_.mark("clean-up done"); }

Workflow EtlRun::checked_workflow() {
  check_options();
  // Validate the config before touching the output directory.
  // Side tables (join_external) with a relative path sit beside the first input.
  const std::string& first = o_.inputs.front();
  const size_t slash = first.rfind('/');
  return Workflow::from_config(o_.workflow, o_.schema,
                               slash == std::string::npos ? "" : first.substr(0, slash + 1));
}

void EtlRun::check_options() {
  const EtlOptions& o = o_;
  DLREC_CHECK(!o.inputs.empty(), "etl: no input files");
  DLREC_CHECK(!o.output_dir.empty(), "etl: no output directory");
  DLREC_CHECK(o.shard_rows >= 1, "etl: shard_rows must be >= 1, got ", o.shard_rows);
  DLREC_CHECK(o.block_rows >= 1, "etl: block_rows must be >= 1, got ", o.block_rows);
  DLREC_CHECK(o.valid_ratio >= 0 && o.valid_ratio < 1, "etl: valid_ratio must be in [0, 1), got ",
              o.valid_ratio);
  DLREC_CHECK(o.ranks >= 1 && o.ranks <= 65536, "etl: ranks must be in [1, 65536], got ", o.ranks);
  DLREC_CHECK(o.read_ahead >= 0 && o.read_ahead <= 64, "etl: read_ahead must be in [0, 64] "
              "batches (0: the default), got ", o.read_ahead);
  DLREC_CHECK(o.fit_window >= 0 && o.fit_window <= 64, "etl: fit_window must be in [0, 64] "
              "batches (0: the default), got ", o.fit_window);
  DLREC_CHECK(o.read.parse_ahead >= 0 && o.read.parse_ahead <= 4096, "etl: read.parse_ahead "
              "must be in [0, 4096] pieces (0: the default), got ", o.read.parse_ahead);
  DLREC_CHECK(o.input_cache_mb >= -1, "etl: input_cache_mb must be -1 (default size), 0 (off) or a "
              "size in MB, got ", o.input_cache_mb);
  for (const auto& f : o.inputs) {
    if (!file_exists(f)) fail("etl: input file '", f, "' does not exist");
    res_.input_bytes += static_cast<int64_t>(file_size(f));
  }
}

EtlResult EtlRun::run() {
  // The directory the files go to: beside the output until it is complete (output_dir.h).
  output_ = std::make_unique<EtlOutput>(o_);
  out_dir_ = output_->dir();
  plan_split();
  try {
    fit();
    transform();
    check_counts();
    clock_.mark("transform state gone");
    write_metadata();
  } catch (...) {
    wait_for_saving();
    remove_files(created_);
    throw;
  }
  fit_reader_.reset();
  clock_.mark("first reader gone");
  cache_ = InputCache{};
  ahead_.reset();
  clock_.mark("run state gone");
  for (const auto& f : created_) res_.output_bytes += static_cast<int64_t>(file_size(f));
  output_->commit();  // the complete dataset in place of the old one (or of nothing)
  res_.total_seconds = total_timer_.seconds();
  return res_;
}

void EtlRun::wait_for_saving() {
  if (!saving_.valid()) return;
  try {
    saving_.get();
    created_.push_back(workflow_path_);
  } catch (...) {
  }
}

// ---- the split

void EtlRun::check_counts() {
  // Counts that came out zero without an error before: no training rows is an error (a model
  // cannot train on them); an empty validation split that was asked for is a warning (the
  // data trains; `dlrec eval` refuses it).
  if (res_.train_rows == 0)
    fail("etl: no training rows were written (", res_.skipped_rows, " malformed rows skipped",
         workflow_.has_filters() ? ", the rest dropped by Filter ops" : "", ")");
  if (res_.valid_rows == 0 && (o_.valid_ratio > 0 || o_.train_rows >= 0)) {
    std::string why;
    if (o_.valid_ratio > 0)
      why = detail::concat("valid_ratio ", o_.valid_ratio, " of ", expected_rows_,
                           " rows leaves ",
                           expected_rows_ - train_rows_of(expected_rows_, o_.valid_ratio),
                           " to validate");
    else
      why = detail::concat("train_rows ", o_.train_rows, " takes every row");
    if (workflow_.has_filters()) why += ", or Filter ops dropped them";
    res_.warnings.push_back("the validation split is empty (" + why +
                            "); `dlrec eval` will have nothing to evaluate");
  }
}

void EtlRun::set_split(int64_t rows) {
  expected_rows_ = rows;
  if (rows == 0)
    fail("etl: the input holds no rows",
         parse_to_count() ? " (every line was malformed and skipped: --on-error=skip)" : "");
  n_train_ = train_rows_of(rows, o_.valid_ratio);
  if (n_train_ == 0) fail("etl: the split leaves no training rows");
}

void EtlRun::count_first() {
  Timer t;
  // Skipped malformed lines are not rows: a newline count would put the split that many rows
  // too late (every good row training, an empty validation split), so they are parsed and
  // counted (one more read of the input, in this mode only).
  const int64_t rows = o_.parsed_input ? o_.parsed_input->stats.rows
                       : parse_to_count() ? count_parsed_rows(o_.inputs, o_.schema, o_.read)
                                          : count_rows(o_.inputs, o_.schema);
  res_.count_seconds += t.seconds();
  clock_.mark("count done");
  set_split(rows);
}

void EtlRun::count_known() {
  if (!counting_) return;
  counting_ = false;
  const int64_t rows = ahead_->rows();
  res_.count_seconds += ahead_->wait_seconds();
  clock_.mark("count known");
  set_split(rows);
}

int64_t EtlRun::split_before(int64_t upto) {
  if (counting_) return ahead_->train_before(upto);
  return n_train_ < 0 ? upto : std::min(upto, n_train_);
}

void EtlRun::plan_split() {
  if (o_.train_rows >= 0) {
    n_train_ = o_.train_rows;
  } else if (o_.valid_ratio > 0) {
    Timer t;
    if (o_.count_ahead_min_bytes >= 0 && res_.input_bytes >= o_.count_ahead_min_bytes &&
        inputs_rereadable(o_.inputs) && !parse_to_count() && !o_.parsed_input) {
      expected_rows_ = estimate_rows(o_.inputs);
      counting_ = expected_rows_ >= 0;
    }
    res_.count_seconds = t.seconds();  // the estimate
    if (!counting_) count_first();  // else the count starts once the cache is known to be on
  }
  if (n_train_ == 0) fail("etl: the split leaves no training rows");
}

// ---- the fit

// The input cache: on unless it is off or the row count says it cannot fit. Its form
// (EtlOptions::input_cache_form): Auto keeps the rows compacted (about a third of the memory)
// when their memory gets huge pages (the fastest on 16 cores, docs/ETL.md), when the parsed
// rows would not fit or under a memory budget; else as parsed (faster on 16 cores than
// compacted in 4 KB pages). The decisions from the row count, or from the estimate (an eighth
// over it) while counting ahead.
void EtlRun::decide_cache() {
  const EtlOptions& o = o_;
  InputCache& cache = cache_;
  const int64_t rows_for = counting_ ? expected_rows_ + expected_rows_ / 8 : expected_rows_;
  const io::Schema& sc = o.schema;
  // Bytes per row as parsed (RawChunk), and compacted when every key is narrow
  // (KeptChunk; wide columns take more, and then the cache may be dropped part-way).
  const int64_t parsed_row = 4 + 4 * sc.num_dense() + 16 * sc.num_cat();
  const int64_t compact_row = 1 + 4 * sc.num_dense() + 5 * sc.num_cat();
  // Huge pages (EtlOptions::input_cache_huge_pages): Auto asks for them only where free
  // 2 MB blocks already hold twice the compacted rows (no memory compaction to find them).
  const bool huge =
      o.input_cache_huge_pages == HugePages::On ||
      (o.input_cache_huge_pages == HugePages::Auto && cache.cap > 0 && rows_for >= 0 &&
       rows_for * compact_row <= cache.cap &&
       huge_pages_free_for(rows_for * compact_row));
  cache.compact = o.input_cache_form == CacheForm::Compact ||
                  (o.input_cache_form == CacheForm::Auto &&
                   (huge || o.memory_budget_mb > 0 || rows_for < 0 ||
                    rows_for * parsed_row > cache.cap));
  cache.huge = cache.compact && huge;
  const int64_t row_bytes = cache.compact ? compact_row : parsed_row;
  cache.on = cache.cap > 0 && (rows_for < 0 || rows_for * row_bytes <= cache.cap);
}

// Counting ahead only where the cache is on (the reader reads past the split, so that it need
// not know where the split is), else the count comes first.
void EtlRun::plan_cache_and_count() {
  cache_.cap = o_.input_cache_mb < 0 ? default_cache_bytes(o_.memory_budget_mb)
                                     : o_.input_cache_mb << 20;
  decide_cache();
  if (counting_ && !cache_.on) {  // the count first, on all cores
    counting_ = false;
    count_first();
    decide_cache();
  } else if (counting_) {
    ahead_ = std::make_unique<RowCountAhead>(o_.inputs, o_.schema, o_.valid_ratio);
    res_.count_ahead = true;
  }
}

// Fit batches in flight (Workflow::fit_batches). Several (no barrier per batch: the fit's
// column strands run on threads of their own while the reader parses on the pool) only where
// the cores leave room for both: on the 16-core host, 8 threads with 4 in flight did 700-738
// MB/s vs 622-628 with one (the fit 1.4-1.6 s vs 1.9), but 16 threads did not gain (815-833 vs
// 780-923 MB/s): that fit waits for the reader's parse, and the strands' threads take cores
// from it (docs/ETL.md). One (as before) under a memory budget (less memory in flight) and
// with one thread (nothing to overlap).
int EtlRun::choose_fit_window() const {
  int window = o_.fit_window;
  if (window == 0) {
    const unsigned cores = std::thread::hardware_concurrency();
    window = 2 * static_cast<unsigned>(num_threads()) <= cores ? 4 : 1;
    if (o_.memory_budget_mb > 0 || num_threads() == 1) window = 1;
  }
  return window;
}

void EtlRun::fit() {
  Timer fit_timer;
  const double fit_cpu0 = process_cpu_seconds();
  if (o_.memory_budget_mb > 0)
    workflow_.set_fit_memory(o_.memory_budget_mb << 20,
                             o_.spill_dir.empty() ? out_dir_ : o_.spill_dir);
  res_.fit_passes = workflow_.num_fit_passes();
  plan_cache_and_count();
  // Batches parsed ahead: two for the compacted cache (measured on 16 cores), else one as
  // before (and under a memory budget: less memory in flight).
  read_ahead_ = o_.read_ahead > 0
                    ? o_.read_ahead
                    : (o_.memory_budget_mb == 0 && cache_.on && cache_.compact ? 2 : 1);
  window_ = choose_fit_window();
  cache_.pending.resize(window_);
  ring_.resize(window_);
  unpacked_.resize(window_);
  side_.task = [this](int64_t b, int i) { cache_.keep_one(cache_.pending[b % window_][i]); };
  run_fit_passes();
  if (progress_) progress_->finish(fit_rows_);
  count_known();
  if (batches_) res_.read_wait_seconds += batches_->wait_seconds();
  // The batches still in their slots: the fit is done with them (their side tasks ran).
  for (size_t s = 0; s < cache_.pending.size(); ++s) cache_.settle(s);
  if (cache_.arena) cache_.arena->finish();
  cached_ = cache_.on;
  res_.input_cache_bytes = cached_ ? cache_.bytes : 0;
  res_.input_cache_compact = cached_ && cache_.compact;
  res_.input_cache_huge_pages = cached_ && cache_.compact && cache_.huge;
  // The first pass's reader has seen every row when the transform reads the cache: its
  // statistics (skipped rows) are the transform's.
  if (cached_) fit_reader_ = std::move(batches_);
  batches_.reset();
  if (fit_rows_ == 0)
    fail("etl: the input holds no rows to fit on",
         parse_to_count() ? " (malformed rows are skipped: --on-error=skip)" : "");
  if (o_.train_rows >= 0 && fit_rows_ < n_train_)
    fail("etl: train_rows is ", n_train_, " but the input holds only ", fit_rows_,
         " good rows; no rows would be left for validation");
  res_.fit_seconds = fit_timer.seconds();
  res_.fit_cpu_seconds = process_cpu_seconds() - fit_cpu0;
  clock_.mark("fit done");
  std::tie(res_.spill_runs, res_.spill_bytes) = workflow_.fit_spill_stats();

  // The fitted workflow is final now: it is saved on a helper thread while the transform
  // runs (both only read it). Waited for (and its file listed for clean-up) before the
  // metadata, or when the transform fails (wait_for_saving).
  workflow_path_ = out_dir_ + "/workflow.json";
  saving_ = std::async(std::launch::async, [this] { workflow_.save(workflow_path_); });
}

void EtlRun::run_fit_passes() {
  try {
    workflow_.fit_batches([this] { return open_fit_pass(); }, &side_, window_);
  } catch (const Error&) {
    // A bad row met while keeping the rows may lie past the training rows, where the fit
    // alone would not have read (the transform pass would report it, or an earlier error of
    // its own first). The fit starts again without keeping rows, so errors come as they would
    // without the cache.
    if (!cache_read_failed_) throw;
    if (batches_) res_.read_wait_seconds += batches_->wait_seconds();
    batches_.reset();
    cache_ = InputCache{};
    cache_.pending.resize(window_);
    pass_ = 0;
    workflow_.fit_batches([this] { return open_fit_pass(); }, &side_, window_);
  }
}

ChunkBatchSource EtlRun::open_fit_pass() {
  if (progress_) progress_->finish(fit_rows_);
  ++pass_;
  progress_ = std::make_unique<Progress>(
      "etl fit (pass " + std::to_string(pass_) + "/" + std::to_string(res_.fit_passes) + ")",
      counting_ ? train_rows_of(expected_rows_, o_.valid_ratio) : n_train_, "rows");
  fit_rows_ = 0;
  if (cached_) return cached_fit_pass();
  io::ReadOptions ro = pass_read_options(o_);
  // Keeping the rows: the first pass reads all of them (the validation rows too).
  if (!(pass_ == 1 && cache_.on)) {
    count_known();  // this reader stops at the split
    ro.max_rows = n_train_;
  }
  if (batches_) res_.read_wait_seconds += batches_->wait_seconds();
  batches_.reset();
  batches_ = std::make_unique<BatchReader>(open_input(o_, ro),
                                           batch_chunks(), read_ahead_);
  const bool first = pass_ == 1;
  if (first && cache_.on && !cache_.arena) {
    cache_.arena = std::make_unique<KeptArena>(
        cache_.huge,  // blocks of an eighth of the cap, 2-64 MB
        std::clamp<size_t>(static_cast<size_t>(cache_.cap / 8), size_t{2} << 20,
                           KeptArena::kBlockBytes));
  }
  read_rows_ = 0;
  return reading_fit_pass(first);
}

ChunkBatchSource EtlRun::cached_fit_pass() {
  size_t at = 0;
  int64_t call = 0;
  return [this, at, call](std::vector<const io::RawChunk*>& out) mutable {
    out.clear();
    std::vector<io::RawChunk>& into = unpacked_[call++ % window_];
    const size_t k = std::min(cache_.train_chunks - at, static_cast<size_t>(batch_chunks()));
    if (into.size() < k) into.resize(k);
    parallel_for(0, static_cast<int64_t>(k), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i)
        if (!cache_.chunks[at + i].parsed()) cache_.chunks[at + i].unpack(into[i]);
    });
    for (size_t i = 0; i < k; ++i) {
      const KeptChunk& kc = cache_.chunks[at + i];
      out.push_back(kc.parsed() ? kc.parsed() : &into[i]);
      fit_rows_ += kc.rows();
    }
    at += k;
    progress_->update(fit_rows_);
    return static_cast<int>(out.size());
  };
}

ChunkBatchSource EtlRun::reading_fit_pass(bool first) {
  int64_t call = 0;
  return [this, first, call](std::vector<const io::RawChunk*>& out) mutable {
    InputCache& cache = cache_;
    out.clear();
    // The slot of the batch given up `window` calls ago: its rows were kept by the fit's
    // side tasks (Workflow::fit_batches calls again only once it is done with them).
    const size_t s = static_cast<size_t>(call++ % window_);
    std::vector<io::RawChunk>& batch = ring_[s];
    cache.settle(s);
    while (out.empty()) {
      cache.flush(s);  // rows of a batch the fit does not see, before the reader reuses it
      int n = 0;
      try {
        n = batches_->next(batch);
      } catch (...) {
        if (first && cache.on) cache_read_failed_ = true;
        throw;
      }
      if (n == 0) break;
      for (int i = 0; i < n; ++i) {
        io::RawChunk& c = batch[i];
        const int64_t train = std::max<int64_t>(
            0, std::min(c.rows, split_before(read_rows_ + c.rows) - read_rows_));
        read_rows_ += c.rows;
        const bool keep = first && cache.on;
        if (keep && train > 0 && train < c.rows) {
          // The split: the validation rows now, before the fit sees the chunk.
          cache.chunks.emplace_back();  // the training rows, kept below
          KeptChunk* slot = &cache.chunks.back();
          cache.train_chunks = cache.chunks.size();
          cache.chunks.push_back(cache.compact
                                     ? KeptChunk::keep(c, train, c.rows, *cache.arena)
                                     : KeptChunk::keep_parsed(copy_rows(c, train, c.rows)));
          cache.bytes += cache.chunks.back().bytes();
          keep_first_rows(c, train);
          cache.pending[s].push_back({slot, &c, 0, train});
        } else if (keep) {
          cache.chunks.emplace_back();
          cache.pending[s].push_back({&cache.chunks.back(), &c, 0, c.rows});
          if (train > 0) cache.train_chunks = cache.chunks.size();
        } else if (train > 0 && train < c.rows) {
          keep_first_rows(c, train);
        }
        if (train > 0) {
          out.push_back(&c);  // stays in batch[s] until this slot's next call
          fit_rows_ += train;
        }
      }
    }
    // Compact: the fit keeps this batch's rows on its threads (the pending validation
    // rows of earlier batches in this call were kept by flush()).
    side_.count = cache.compact ? static_cast<int>(cache.pending[s].size()) : 0;
    progress_->update(fit_rows_);
    return static_cast<int>(out.size());
  };
}

}  // namespace run_detail
}  // namespace dlrec::etl
