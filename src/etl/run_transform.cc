// run_etl's transform stage (every row transformed and written into the shard files) and its
// metadata stage (run_stages.h lists the stages).
#include <algorithm>
#include <array>
#include <exception>
#include <future>
#include <mutex>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"
#include "etl/run_stages.h"
#include "etl/shard_sets.h"

namespace dlrec::etl::run_detail {

// The transform pass's state, shared by its loops. Each batch of chunks is transformed on all
// cores (a chunk per task, into its own io::Batch). The split is by input position: a chunk's
// first to_train_in[i] input rows train.
struct EtlRun::TransformPass {
  TransformPass(const std::string& dir, const io::ShardLayout& layout, const EtlOptions& o,
                std::vector<std::string>* created, int64_t expected_rows)
      : train(dir, "train", layout, o.shard_rows, o.block_rows, created),
        valid(dir, "valid", layout, o.shard_rows, o.block_rows, created),
        tp("etl transform", expected_rows, "rows") {}

  ShardSetWriter train, valid;
  // Shuffled and/or per-rank training rows go through a RankWriter (two phases).
  std::unique_ptr<RankWriter> ranked;
  int64_t written_train = 0;  // training rows handed to the writers
  int transform_chunks = 0;   // chunks per batch
  // The rows: from the cache (each batch's chunks leave it, so its memory goes down as the
  // pass goes on), else read again by `input`.
  std::unique_ptr<BatchReader> input;
  // From the cache, a batch's kept chunks are unpacked by the transform tasks (into the
  // reused `chunks`); they leave the cache, so its memory goes down as the pass goes on.
  std::vector<KeptChunk> kept_batch;
  Progress tp;
  std::vector<io::RawChunk> chunks;
  std::vector<io::Batch> outs[2];
  std::vector<std::vector<int64_t>> kept;
  std::vector<int64_t> to_train_in, to_train, first_train;
  std::vector<std::exception_ptr> errors;
  int cur = 0;
  int64_t seen = 0;        // input rows so far
  int64_t train_seen = 0;  // training rows so far (after filtering)
  std::future<void> writing;
  double write_busy = 0;   // seconds the writer thread worked
  bool direct = false;
  std::vector<std::vector<ShardSetWriter::Piece>> train_pieces, valid_pieces;
};

int EtlRun::next_transform_batch(TransformPass& t, std::vector<io::RawChunk>& out) {
  if (t.input) return t.input->next(out);
  const size_t k = std::min(cache_.chunks.size(), static_cast<size_t>(t.transform_chunks));
  if (out.size() < k) out.resize(k);
  if (t.kept_batch.size() < k) t.kept_batch.resize(k);
  for (size_t i = 0; i < k; ++i) {
    t.kept_batch[i] = std::move(cache_.chunks.front());
    cache_.chunks.pop_front();
  }
  return static_cast<int>(k);
}

namespace {

// Direct: transforms a chunk (its first tr.rows rows train) and writes its rows at the places
// reserved for them (training pieces, then validation pieces).
void transform_and_write(const Workflow& workflow, const io::RawChunk& chunk, io::Batch& out,
                         std::vector<int64_t>& kept_rows, const TrainRows& tr, int64_t rows,
                         const std::vector<ShardSetWriter::Piece>& trp,
                         const std::vector<ShardSetWriter::Piece>& vap) {
  workflow.transform(chunk, out, &kept_rows, /*append=*/false, &tr);
  DLREC_CHECK(out.rows == rows, "etl: a chunk of ", rows, " rows was transformed into ",
              out.rows);
  int64_t r = 0;
  for (const auto* pieces : {&trp, &vap})
    for (const ShardSetWriter::Piece& p : *pieces) {
      p.writer->write_at(out, r, r + p.rows, p.at);
      r += p.rows;
    }
}

}  // namespace

void EtlRun::transform() {
  const EtlOptions& o = o_;
  Timer tr_timer;
  const double tr_cpu0 = process_cpu_seconds();
  layout_ = workflow_.output_layout();
  const io::ShardLayout& layout = layout_;
  TransformPass t(out_dir_, layout, o, &created_, expected_rows_);
  if (o.shuffle || o.ranks > 1) {
    const int64_t total = workflow_.fit_stats().at("rows").get<int64_t>();
    int64_t file_rows = o.shard_rows;
    if (o.memory_budget_mb > 0) {  // phase 2 holds one file's rows: a quarter of the budget
      const int64_t row_bytes = 8 + 4 * layout.num_dense +
                                16 * static_cast<int64_t>(layout.cardinalities.size());
      file_rows = std::max<int64_t>(
          o.block_rows, std::min(file_rows, (o.memory_budget_mb << 20) / 4 / row_bytes));
    }
    t.ranked = std::make_unique<RankWriter>(out_dir_, layout, total, o.ranks, file_rows,
                                            o.shuffle, o.seed, o.block_rows, &created_);
  }
  // Batches of at least a shard block of rows: the shard writers then encode most blocks
  // straight from the transformed chunks instead of first copying them into pending rows
  // (with few threads a batch of one chunk per thread is a fraction of a block).
  const int tchunks = static_cast<int>(
      std::max<int64_t>(batch_chunks(), (o.block_rows + o.read.chunk_rows - 1) /
                                            std::max<int64_t>(1, o.read.chunk_rows)));
  // Under a memory budget, one chunk per thread as before (less memory in flight).
  t.transform_chunks =
      o.memory_budget_mb > 0 ? batch_chunks() : std::min(tchunks, std::max(batch_chunks(), 64));
  if (!cached_)
    t.input = std::make_unique<BatchReader>(
        open_input(o, pass_read_options(o)), t.transform_chunks,
        read_ahead_);
  // Direct: each transform task encodes its own rows into the shard files' blocks
  // (io::ShardWriter::reserve/write_at) instead of a writer thread encoding the batch after
  // it (one pass less over the rows, no second fork-join per batch). Not with ranks or
  // shuffling, filters (a chunk's rows are placed before it is transformed) or multi-hot
  // features. (It replaced the batch path wherever it applies: faster on every measured
  // configuration, bench/RESULTS.md session 8; same bytes.)
  t.direct = !t.ranked && !workflow_.has_filters() &&
             std::none_of(layout.multi_hot.begin(), layout.multi_hot.end(),
                          [](bool m) { return m; });
  if (t.direct && !t.input) transform_direct_from_cache(t);
  if (t.direct) transform_direct_batches(t);
  else transform_with_writer_thread(t);
  if (t.writing.valid()) t.writing.get();
  clock_.mark("rows written");
  res_.write_seconds = t.write_busy;
  if (t.input) res_.read_wait_seconds += t.input->wait_seconds();
  const io::ChunkReader* reader = t.input ? &t.input->reader() : &fit_reader_->reader();
  if (t.ranked) {
    t.ranked->finish();
    res_.rank_shards = t.ranked->rank_names();
    for (int r = 0; r < o.ranks; ++r) rank_rows_.push_back(t.ranked->rank_rows(r));
  } else {
    t.train.close(true);
  }
  t.valid.close(false);
  t.train.wait_closed();
  t.valid.wait_closed();
  res_.file_write_seconds = t.train.times().file_write + t.valid.times().file_write;
  res_.append_wait_seconds = t.train.times().append_wait + t.valid.times().append_wait;
  res_.skipped_rows = reader->stats().skipped_rows;
  first_skip_reason_ = reader->stats().first_skip_reason;
  t.tp.finish(t.seen, res_.skipped_rows
                          ? std::to_string(res_.skipped_rows) + " malformed rows skipped"
                          : "");
  res_.train_rows = t.ranked ? t.written_train : t.train.rows();
  res_.valid_rows = t.valid.rows();
  res_.train_shards = t.train.names();
  for (const auto& r : res_.rank_shards)
    res_.train_shards.insert(res_.train_shards.end(), r.begin(), r.end());
  res_.valid_shards = t.valid.names();
  res_.transform_seconds = tr_timer.seconds();
  res_.transform_cpu_seconds = process_cpu_seconds() - tr_cpu0;
  clock_.mark("transform done");
}

// From the cache, without a barrier per batch: every thread takes the next kept chunk (its
// rows reserved in the shard files under the lock), then unpacks, transforms and writes it on
// its own. The validation chunks go first (in input order), then the training ones: each file
// still gets its rows in input order, and the validation file's close (fsync) overlaps the
// training rows instead of ending the pass. On an error no more chunks are taken, and the
// error of the first failing chunk in input order is reported.
void EtlRun::transform_direct_from_cache(TransformPass& t) {
  const int64_t n_train = n_train_;
  const int64_t nchunks = static_cast<int64_t>(cache_.chunks.size());
  const int64_t nvalid = n_train < 0 ? 0 : nchunks - static_cast<int64_t>(cache_.train_chunks);
  std::vector<int64_t> before(nchunks + 1, 0);  // input rows before chunk i
  for (int64_t i = 0; i < nchunks; ++i) before[i + 1] = before[i] + cache_.chunks[i].rows();
  std::mutex mu;
  bool stop = false;
  int64_t next_seq = 0, error_seq = -1;
  std::exception_ptr error;
  auto failed = [&](int64_t seq) {  // under mu
    if (error_seq < 0 || seq < error_seq) {
      error_seq = seq;
      error = std::current_exception();
    }
    stop = true;
  };
  // Each task unpacks into a chunk that the fit's reader parsed into (its memory is already
  // faulted in), where one is left, instead of growing a new one.
  const int tasks = num_threads();
  std::vector<io::RawChunk> spare = spare_fit_chunks(tasks);
  parallel_tasks(tasks, [&](int task) {
    io::RawChunk chunk;
    if (task < static_cast<int>(spare.size())) chunk = std::move(spare[task]);
    io::Batch out;
    std::vector<int64_t> kept_rows;
    std::vector<ShardSetWriter::Piece> trp, vap;
    for (;;) {
      KeptChunk kc;
      int64_t seq = 0, rows = 0;
      TrainRows tr{};
      {
        std::lock_guard<std::mutex> g(mu);
        if (stop || next_seq == nchunks) return;
        const int64_t k = next_seq++;
        seq = k < nvalid ? nchunks - nvalid + k : k - nvalid;  // the chunk's input position
        kc = std::move(cache_.chunks[seq]);
        rows = kc.rows();
        const int64_t at = before[seq];
        tr.first = n_train < 0 ? at : std::min(at, n_train);  // no filters: all rows kept
        tr.rows = n_train < 0 ? rows : std::max<int64_t>(0, std::min(rows, n_train - at));
        t.seen += rows;
        t.train_seen += tr.rows;
        t.written_train += tr.rows;
        try {
          t.train.close_full(/*written_only=*/true);
          t.valid.close_full(true);
          t.train.reserve(tr.rows, trp);
          t.valid.reserve(rows - tr.rows, vap);
        } catch (...) {
          failed(seq);
          return;
        }
        t.tp.update(t.seen);
      }
      try {
        kc.unpack_move(chunk);
        transform_and_write(workflow_, chunk, out, kept_rows, tr, rows, trp, vap);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu);
        failed(seq);
        return;
      }
    }
  });
  if (error) std::rethrow_exception(error);
  cache_.chunks.clear();
}

std::vector<io::RawChunk> EtlRun::spare_fit_chunks(int n) {
  std::vector<io::RawChunk> spare;
  for (auto* slots : {&ring_, &unpacked_})
    for (auto& slot : *slots)
      for (io::RawChunk& c : slot)
        if (static_cast<int>(spare.size()) < n && c.dense.capacity() + c.label.capacity() > 0)
          spare.push_back(std::move(c));
  return spare;
}

// Direct, a batch at a time (the input read again, or what the cache still holds): the rows
// of each chunk reserved in the files in input order, then the chunks transformed and written
// on all cores.
void EtlRun::transform_direct_batches(TransformPass& t) {
  const int64_t n_train = n_train_;
  for (int n; (n = next_transform_batch(t, t.chunks)) > 0;) {
    std::vector<io::Batch>& out = t.outs[0];
    if (static_cast<int>(out.size()) < n) out.resize(n);
    t.kept.resize(std::max<size_t>(t.kept.size(), n));
    t.train_pieces.resize(std::max<size_t>(t.train_pieces.size(), n));
    t.valid_pieces.resize(std::max<size_t>(t.valid_pieces.size(), n));
    t.to_train_in.assign(n, 0);
    t.first_train.assign(n, 0);
    t.errors.assign(n, nullptr);
    std::vector<int64_t> in_rows(n);
    for (int i = 0; i < n; ++i) {
      in_rows[i] = t.input ? t.chunks[i].rows : t.kept_batch[i].rows();
      t.to_train_in[i] = n_train < 0
                             ? in_rows[i]
                             : std::max<int64_t>(0, std::min(in_rows[i], n_train - t.seen));
      t.seen += in_rows[i];
      t.first_train[i] = t.train_seen;
      t.train_seen += t.to_train_in[i];
      t.written_train += t.to_train_in[i];
      t.train.reserve(t.to_train_in[i], t.train_pieces[i]);
      t.valid.reserve(in_rows[i] - t.to_train_in[i], t.valid_pieces[i]);
    }
    parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        try {
          if (!t.input) t.kept_batch[i].unpack_move(t.chunks[i]);
          transform_and_write(workflow_, t.chunks[i], out[i], t.kept[i],
                              {t.first_train[i], t.to_train_in[i]}, in_rows[i],
                              t.train_pieces[i], t.valid_pieces[i]);
        } catch (...) {
          t.errors[i] = std::current_exception();
        }
      }
    });
    for (const auto& e : t.errors)
      if (e) std::rethrow_exception(e);  // the first failing chunk in input order
    t.train.close_full();
    t.valid.close_full();
    t.tp.update(t.seen);
  }
}

// The batch path (ranks or shuffling, filters, multi-hot features): the writer thread hands
// each transformed batch's rows to the shard writers, which encode whole blocks on all cores,
// while the next batch is read and transformed.
void EtlRun::transform_with_writer_thread(TransformPass& t) {
  const int64_t n_train = n_train_;
  for (int n; (n = next_transform_batch(t, t.chunks)) > 0;) {
    std::vector<io::Batch>& out = t.outs[t.cur];
    if (static_cast<int>(out.size()) < n) out.resize(n);
    t.kept.resize(std::max<size_t>(t.kept.size(), n));
    t.to_train_in.assign(n, 0);
    t.to_train.assign(n, 0);
    t.first_train.assign(n, 0);
    t.errors.assign(n, nullptr);
    for (int i = 0; i < n; ++i) {
      const int64_t rows = t.input ? t.chunks[i].rows : t.kept_batch[i].rows();
      t.to_train_in[i] =
          n_train < 0 ? rows : std::max<int64_t>(0, std::min(rows, n_train - t.seen));
      t.seen += rows;
    }
    auto transform_one = [&](int i) {
      try {
        const TrainRows tr{t.first_train[i], t.to_train_in[i]};
        if (!t.input) t.kept_batch[i].unpack_move(t.chunks[i]);
        workflow_.transform(t.chunks[i], out[i], &t.kept[i], /*append=*/false, &tr);
      } catch (...) {
        t.errors[i] = std::current_exception();
      }
    };
    if (!workflow_.has_filters()) {
      // Every input row is kept: chunk i's training rows start at the sum before it.
      for (int i = 0; i < n; ++i) {
        t.first_train[i] = t.train_seen;
        t.train_seen += t.to_train_in[i];
        t.to_train[i] = t.to_train_in[i];
      }
      parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) transform_one(static_cast<int>(i));
      });
      for (const auto& e : t.errors)
        if (e) std::rethrow_exception(e);  // the first failing chunk in input order
    } else {
      // Filters: a chunk's first training row depends on the rows kept before it.
      for (int i = 0; i < n; ++i) {
        t.first_train[i] = t.train_seen;
        transform_one(i);
        if (t.errors[i]) std::rethrow_exception(t.errors[i]);
        t.to_train[i] = std::lower_bound(t.kept[i].begin(), t.kept[i].end(), t.to_train_in[i]) -
                        t.kept[i].begin();
        t.train_seen += t.to_train[i];
      }
    }
    t.tp.update(t.seen);
    hand_to_writer_thread(t, n);
  }
}

// The transformed batch t.outs[t.cur] to the writer thread (after it finished the one
// before, rethrowing its error): training rows to the shard files or the RankWriter,
// validation rows to theirs.
void EtlRun::hand_to_writer_thread(TransformPass& t, int n) {
  std::vector<io::Batch>& out = t.outs[t.cur];
  if (t.writing.valid()) t.writing.get();  // rethrows a write error
  std::vector<io::BatchRows> train_parts, valid_parts;
  std::vector<std::array<int64_t, 3>> ranked_parts;  // (chunk, rows, first training row)
  for (int i = 0; i < n; ++i) {
    if (t.to_train[i] > 0) {
      if (t.ranked)
        ranked_parts.push_back({i, t.to_train[i], t.written_train});
      else
        train_parts.push_back({&out[i], 0, t.to_train[i]});
      t.written_train += t.to_train[i];
    }
    if (t.to_train[i] < out[i].rows) valid_parts.push_back({&out[i], t.to_train[i], out[i].rows});
  }
  RankWriter* rw = t.ranked.get();
  t.writing = std::async(std::launch::async, [&t, rw, train_parts = std::move(train_parts),
                                              valid_parts = std::move(valid_parts),
                                              ranked_parts = std::move(ranked_parts),
                                              cur = t.cur] {
    Timer timer;
    const std::vector<io::Batch>& b = t.outs[cur];
    for (const auto& [i, rows, first] : ranked_parts) rw->write(b[i], 0, rows, first);
    if (!train_parts.empty()) t.train.write_parts(train_parts);
    if (!valid_parts.empty()) t.valid.write_parts(valid_parts);
    t.write_busy += timer.seconds();
  });
  t.cur ^= 1;
}

void EtlRun::write_metadata() {
  const EtlOptions& o = o_;
  saving_.get();  // rethrows a failed save
  created_.push_back(workflow_path_);

  json stats = {{"format", "dlrec-stats"},
                {"version", 1},
                {"train_rows", res_.train_rows},
                {"valid_rows", res_.valid_rows},
                {"skipped_rows", res_.skipped_rows},
                {"columns", workflow_.fit_stats()}};
  if (res_.skipped_rows) stats["first_skip_reason"] = first_skip_reason_;
  const std::string st = out_dir_ + "/stats.json";
  write_file_atomic(st, stats.dump(2) + "\n");
  created_.push_back(st);

  if (!rank_rows_.empty()) {  // which training shards each rank reads
    json rk = {{"format", "dlrec-ranks"}, {"version", 1}, {"ranks", o.ranks},
               {"shuffle", o.shuffle}, {"seed", o.seed}};
    json rows = json::array(), shards = json::array();
    for (int r = 0; r < o.ranks; ++r) {
      rows.push_back(rank_rows_[r]);
      shards.push_back(res_.rank_shards[r]);
    }
    rk["train_rows"] = rows;
    rk["train_shards"] = shards;
    const std::string rp = out_dir_ + "/ranks.json";
    write_file_atomic(rp, rk.dump(2) + "\n");
    created_.push_back(rp);
  }

  io::DatasetInfo info;
  info.layout = layout_;
  info.train_shards = res_.train_shards;
  info.valid_shards = res_.valid_shards;
  info.train_rows = res_.train_rows;
  info.valid_rows = res_.valid_rows;
  info.dense_names = workflow_.dense_names();
  info.cat_names = workflow_.cat_names();
  info.save(out_dir_);
  created_.push_back(out_dir_ + "/dataset.json");
  clock_.mark("metadata written");
}

}  // namespace dlrec::etl::run_detail
