// Workflow's fit: passes over the training rows, column by column, with batches in flight
// (fit_batches) or one at a time.
#include "dlrec/etl/workflow.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"

#include "etl/workflow_impl.h"

namespace dlrec::etl {

// Joins the side tables onto a batch's chunks, checks them, applies the Filter ops (copies of
// the joined or kept rows in `filtered`) and counts its rows (pass 0); `chunks` receives the
// chunks the fit sees.
void Workflow::Impl::prepare_batch(const io::RawChunk* const* raws, int n, int pass,
                   std::vector<const io::RawChunk*>& chunks,
                   std::vector<io::RawChunk>& filtered) {
  chunks.assign(raws, raws + n);
  if (!joins.empty()) {
    filtered.resize(n);
    parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) chunks[i] = &joined(*raws[i], filtered[i]);
    });
  }
  for (int i = 0; i < n; ++i) check_chunk(*chunks[i], "fit");
  if (!filters.empty()) {
    filtered.resize(n);
    parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
      std::vector<uint8_t> keep;
      io::RawChunk kept;
      for (int64_t i = lo; i < hi; ++i) {
        filter_mask(*chunks[i], keep);
        compact(*chunks[i], keep, kept, nullptr);
        std::swap(filtered[i], kept);  // chunks[i] may be filtered[i]
        chunks[i] = &filtered[i];
      }
    });
  }
  for (int i = 0; i < n; ++i) {
    if (pass == 0) stats_input_rows += raws[i]->rows;
    if (pass == 0) stats_rows += chunks[i]->rows;
  }
}

// The fit tasks of a pass (one per column, and per feature op in pass 0), in the order they
// are claimed: categorical columns (the heaviest), feature ops, dense columns.
std::vector<int> Workflow::Impl::task_order(int pass) const {
  const int nd = static_cast<int>(dense.size());
  const int ncols = nd + static_cast<int>(cat.size());
  const int ntasks = ncols + (pass == 0 ? static_cast<int>(features.size()) : 0);
  std::vector<int> order;
  for (int col = nd; col < ncols; ++col) order.push_back(col);
  for (int col = ncols; col < ntasks; ++col) order.push_back(col);
  for (int col = 0; col < nd; ++col) order.push_back(col);
  return order;
}

// Chunks [0, n) of fit pass `pass`, in order: accumulates statistics (pass 0) and feeds each
// column's pass-th fitted op with the values transformed by the ops before it. One task per
// column (and feature op) walks all the chunks in order, so every op sees exactly the value
// sequence of a chunk-by-chunk fit; the tasks are claimed dynamically, Categorify columns
// (the heaviest) first, then the side tasks of the batch. A fork-join: it returns when the
// slowest task is done.
void Workflow::Impl::fit_chunks(const io::RawChunk* const* raws, int n, int pass, FitSideWork* side,
                int64_t batch) {
  std::vector<io::RawChunk> filtered;
  std::vector<const io::RawChunk*> chunks;
  prepare_batch(raws, n, pass, chunks, filtered);
  const std::vector<int> order = task_order(pass);
  const int ntasks = static_cast<int>(order.size());
  const int nside = side && side->task ? side->count : 0;
  const int total = ntasks + nside;
  std::atomic<int> next{0};
  parallel_for(0, std::min(total, num_threads()), 1, [&](int64_t, int64_t) {
    std::vector<float> buf;
    for (int k = next++; k < total; k = next++) {
      if (k >= ntasks) {
        side->task(batch, k - ntasks);
        continue;
      }
      const int col = order[k];
      for (int i = 0; i < n; ++i) fit_column(*chunks[i], col, pass, buf);
    }
  });
}

// Fit pass `pass` over the batches of `next` with up to `window` (> 1) batches in flight and
// no barrier between batches (Workflow::fit_batches). Each fit task (task_order) is a strand:
// it fits the batches one after the other in input order, so every op sees the same value
// sequence as with fit_chunks, but the strands of different columns may be on different
// batches. num_threads() workers (this thread and threads of their own, which block while
// there is nothing to do, so they must not be the shared pool's: the reader's parse runs
// there) take, under one lock, in this order of preference:
//  - the source's next batch (one caller at a time), when fewer than `window` are in flight;
//  - the strand or side task whose batch is the oldest (strands first, in task order).
// A batch is given up (the source may reuse its chunks at its `window`-th next call) once
// every strand has passed it and its side tasks are done. An exception (from the source, a
// strand or a side task) stops the work on its batch and later ones; the older batches are
// finished, and the exception of the oldest failing batch is rethrown: the error a batch by
// batch fit would report.
// (About 170 lines, left whole on purpose: the workers' loop, its lock and the in-flight
// batches' state form one scheduler whose invariants are easier to check in one place.)
void Workflow::Impl::fit_pipelined(const ChunkBatchSource& next, int pass, FitSideWork* side,
                                   int window) {
  struct InFlight {
    std::vector<const io::RawChunk*> chunks;  // as the fit sees them (filtered)
    std::vector<io::RawChunk> filtered;
    int nside = 0;      // side tasks
    int side_next = 0;  // side tasks claimed
    int remaining = 0;  // strands and side tasks not done with it
  };
  const std::vector<int> order = task_order(pass);
  const int ntasks = static_cast<int>(order.size());
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::mutex mu;
  std::condition_variable cv;
  std::deque<InFlight> win;        // batches [base, fetched) in flight
  int64_t base = 0, fetched = 0;
  bool fetching = false, ended = false;
  int running = 0;                 // claimed items not finished
  std::vector<int64_t> strand_at(ntasks, 0);  // the next batch of each strand
  std::vector<char> strand_busy(ntasks, 0);
  int64_t stop = kNone;            // the oldest failed batch: no work from it on
  std::exception_ptr error;
  // Seconds of work per strand, of the side tasks and of the source's calls (DLREC_ETL_FIT_PROFILE).
  std::vector<double> strand_seconds(ntasks, 0.0);
  double side_seconds = 0, source_seconds = 0;
  Timer pass_timer;
  auto fail_at = [&](int64_t seq, std::exception_ptr e) {  // under mu
    if (seq < stop) {
      stop = seq;
      error = std::move(e);
    }
  };
  auto release = [&] {  // under mu: gives up the oldest batches nothing works on any more
    while (!win.empty() && win.front().remaining == 0) {
      win.pop_front();
      ++base;
    }
  };
  auto done_with = [&](int64_t seq) {  // under mu: one strand or side task done with seq
    --win[seq - base].remaining;
    release();
  };
  auto work = [&] {
    std::vector<float> buf;
    std::vector<const io::RawChunk*> got;
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      // The source's next batch.
      if (!ended && !fetching && fetched < stop && static_cast<int64_t>(win.size()) < window) {
        fetching = true;
        ++running;
        const int64_t seq = fetched;
        l.unlock();
        InFlight b;
        std::exception_ptr e;
        int n = 0;
        Timer t;
        try {
          n = next(got);
          DLREC_CHECK(n <= static_cast<int>(got.size()), "Workflow::fit_batches: the source "
                      "reported ", n, " chunks but holds ", got.size());
          if (n > 0) {
            prepare_batch(got.data(), n, pass, b.chunks, b.filtered);
            b.nside = side && side->task ? side->count : 0;
            b.remaining = ntasks + b.nside;
          }
        } catch (...) {
          e = std::current_exception();
        }
        l.lock();
        source_seconds += t.seconds();
        fetching = false;
        --running;
        if (e) {
          fail_at(seq, e);
          ended = true;
        } else if (n == 0) {
          ended = true;
        } else {
          win.push_back(std::move(b));
          ++fetched;
          release();  // (a batch without tasks: given up at once)
        }
        cv.notify_all();
        continue;
      }
      // The oldest batch's work: a strand (in task order), else a side task.
      int64_t best = kNone;
      int pick = -1;  // strand k, or ntasks + side task of batch `best`
      for (int k = 0; k < ntasks; ++k)
        if (!strand_busy[k] && strand_at[k] < fetched && strand_at[k] < best) {
          best = strand_at[k];
          pick = k;
        }
      for (int64_t seq = base; seq < std::min(best, fetched); ++seq)
        if (win[seq - base].side_next < win[seq - base].nside) {
          best = seq;
          pick = ntasks;
          break;
        }
      if (pick < 0 || best >= stop) {
        // Nothing to do now: wait for a running item, or end when none can come.
        const bool can_fetch = !ended && !fetching && fetched < stop &&
                               static_cast<int64_t>(win.size()) < window;
        if (running == 0 && !can_fetch) break;
        cv.wait(l);
        continue;
      }
      ++running;
      InFlight& b = win[best - base];  // stays in place: only the front leaves, when done
      std::exception_ptr e;
      Timer t;
      if (pick < ntasks) {
        strand_busy[pick] = 1;
        l.unlock();
        try {
          for (const io::RawChunk* c : b.chunks) fit_column(*c, order[pick], pass, buf);
        } catch (...) {
          e = std::current_exception();
        }
        l.lock();
        strand_seconds[pick] += t.seconds();
        strand_busy[pick] = 0;
        ++strand_at[pick];
      } else {
        const int i = b.side_next++;
        l.unlock();
        try {
          side->task(best, i);
        } catch (...) {
          e = std::current_exception();
        }
        l.lock();
        side_seconds += t.seconds();
      }
      --running;
      if (e) fail_at(best, e);
      done_with(best);
      cv.notify_all();
    }
    cv.notify_all();  // the others see the end too
  };
  std::vector<std::thread> threads;
  try {
    for (int t = 1; t < num_threads(); ++t) threads.emplace_back(work);
  } catch (...) {  // no more threads: go on with those started
  }
  work();
  for (auto& t : threads) t.join();
  if (const char* p = std::getenv("DLREC_ETL_FIT_PROFILE"); p && *p && *p != '0') {
    // Where the pass's time went: if the slowest strand's seconds come near the wall time,
    // that column bounds the pass whatever the window.
    double sum = 0;
    int slow = 0;
    for (int k = 0; k < ntasks; ++k) {
      sum += strand_seconds[k];
      if (strand_seconds[k] > strand_seconds[slow]) slow = k;
    }
    const int ncols = static_cast<int>(dense.size() + cat.size());
    const int col = ntasks ? order[slow] : 0;
    const std::string name = col < static_cast<int>(dense.size()) ? dense[col].name
                             : col < ncols ? cat[col - dense.size()].name
                                           : "feature " + std::to_string(col - ncols);
    std::fprintf(stderr,
                 "fit pass %d: %lld batches, window %d, %d threads, wall %.3f s; strands %.3f s "
                 "(slowest %s %.3f s), side tasks %.3f s, source calls %.3f s\n",
                 pass, static_cast<long long>(fetched), window, num_threads(),
                 pass_timer.seconds(), sum, name.c_str(), ntasks ? strand_seconds[slow] : 0.0,
                 side_seconds, source_seconds);
  }
  if (error) std::rethrow_exception(error);
}

// Column (or feature op, col >= columns) `col` of one chunk.
void Workflow::Impl::fit_column(const io::RawChunk& c, int col, int pass, std::vector<float>& buf) {
  const int nd = static_cast<int>(dense.size());
  const int ncols = nd + static_cast<int>(cat.size());
  if (col >= ncols) {
    features[col - ncols].op->fit_chunk(c);
    return;
  }
  ColumnPipe& p = col < nd ? dense[col] : cat[col - nd];
  std::vector<int> fit_ops = p.fit_ops();
  const int stage = pass < static_cast<int>(fit_ops.size()) ? fit_ops[pass] : -1;
  if (p.type == ColumnType::Dense) {
    if (pass > 0 && stage < 0) return;
    // The statistics read the column in place (strided): a copy into buf first cost a pass
    // more, and most chains (FillMissing/Clip/LogOp) fit nothing, so buf is only for a fit.
    // (Null for a chunk without values: offsetting it would be undefined, and no row reads it.)
    const float* column = c.dense.empty() ? nullptr : c.dense.data() + p.index;
    if (pass == 0) {
      ColumnStats& s = p.stats;
      s.rows += c.rows;
      // Without a branch per value (missing values are frequent and random): a missing one
      // adds 0 to the sum (which is never -0: it starts at +0) and leaves min/max as they
      // are, so the results are those of skipping it.
      int64_t nulls = 0;
      double lo = s.min, hi = s.max, sum = s.sum;
      for (int64_t r = 0; r < c.rows; ++r) {
        const float v = column[r * nd];
        const bool missing = std::isnan(v);
        nulls += missing;
        const double d = missing ? 0.0 : static_cast<double>(v);
        sum += d;
        lo = missing ? lo : std::min(lo, d);
        hi = missing ? hi : std::max(hi, d);
      }
      s.nulls += nulls;
      s.values += c.rows - nulls;
      s.min = lo;
      s.max = hi;
      s.sum = sum;
    }
    if (stage < 0) return;
    buf.resize(c.rows);
    for (int64_t r = 0; r < c.rows; ++r) buf[r] = column[r * nd];
    p.apply_dense(buf.data(), c.rows, 1, stage);
    static_cast<DenseOp&>(*p.ops[stage]).fit_chunk(buf.data(), c.rows);
  } else {
    const auto& off = c.cat_offsets[p.index];
    const auto& vals = c.cat_values[p.index];
    if (pass == 0) {
      ColumnStats& s = p.stats;
      s.rows += c.rows;
      s.values += static_cast<int64_t>(vals.size());
      // Counted in a local: `s.nulls += ...` in the loop was a store per row (the offsets
      // could alias it), and the loop did not vectorize.
      // Without the pass over the offsets where the parser vouches for at most one value per
      // row (io::RawChunk::facts): then the rows without one are the rows less the values.
      int64_t nulls = 0;
      if (c.facts()) {
        nulls = c.rows - static_cast<int64_t>(vals.size());
      } else {
        const int64_t* o = off.data();
        for (int64_t r = 0; r < c.rows; ++r) nulls += o[r + 1] == o[r];
      }
      s.nulls += nulls;
    }
    if (stage < 0) return;
    // A categorical chain holds one encoder (and column ops), so the keys reach it unchanged.
    static_cast<CategoricalEncoder&>(*p.ops[stage])
        .fit_chunk(vals.data(), static_cast<int64_t>(vals.size()));
  }
}


void Workflow::Impl::begin_pass(int pass) {
  if (pass == 0) {
    stats_rows = stats_input_rows = 0;
    for (auto& f : features) f.op->fit_begin();
  }
  for (auto* v : {&dense, &cat})
    for (auto& p : *v) {
      if (pass == 0) p.stats = ColumnStats{};
      std::vector<int> f = p.fit_ops();
      if (pass >= static_cast<int>(f.size())) continue;
      if (p.type == ColumnType::Dense)
        static_cast<DenseOp&>(*p.ops[f[pass]]).fit_begin();
      else
        static_cast<CategoricalEncoder&>(*p.ops[f[pass]]).fit_begin();
    }
}


void Workflow::Impl::end_pass(int pass) {
  std::vector<Op*> todo;
  for (auto* v : {&dense, &cat})
    for (auto& p : *v) {
      std::vector<int> f = p.fit_ops();
      if (pass < static_cast<int>(f.size())) todo.push_back(p.ops[f[pass]].get());
    }
  if (pass == 0)
    for (auto& f : features) todo.push_back(f.op.get());
  // Finishing a vocabulary sorts it; do the columns in parallel.
  parallel_for(0, static_cast<int64_t>(todo.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (auto* f = dynamic_cast<FeatureOp*>(todo[i]))
        f->fit_end();
      else if (todo[i]->input_type() == ColumnType::Dense)
        static_cast<DenseOp*>(todo[i])->fit_end();
      else
        static_cast<CategoricalEncoder*>(todo[i])->fit_end();
    }
  });
}

int Workflow::num_fit_passes() const {
  size_t n = 1;
  for (auto* v : {&impl_->dense, &impl_->cat})
    for (auto& p : *v) n = std::max(n, p.fit_ops().size());
  return static_cast<int>(n);
}

void Workflow::fit(const ChunkSource& next_chunk) {
  const int passes = num_fit_passes();
  if (passes > 1)
    fail("this workflow chains several fitted ops on one column and needs ", passes,
         " passes over the data; use fit_multipass()");
  bool used = false;
  fit_multipass([&]() -> ChunkSource {
    DLREC_CHECK(!used, "Workflow::fit: single-pass source reused");
    used = true;
    return next_chunk;
  });
}

void Workflow::fit_multipass(const std::function<ChunkSource()>& open_pass) {
  Impl& m = *impl_;
  m.fitted = false;
  m.have_stats = false;
  const int passes = num_fit_passes();
  io::RawChunk chunk;
  const io::RawChunk* one = &chunk;
  for (int pass = 0; pass < passes; ++pass) {
    m.begin_pass(pass);
    ChunkSource next = open_pass();
    while (next(chunk)) m.fit_chunks(&one, 1, pass);
    m.end_pass(pass);
  }
  m.fitted = true;
  m.have_stats = true;
  m.build_plan(true);
}

void Workflow::fit_batches(const std::function<ChunkBatchSource()>& open_pass,
                           FitSideWork* side, int window) {
  DLREC_CHECK(window >= 1, "Workflow::fit_batches: window must be >= 1, got ", window);
  Impl& m = *impl_;
  m.fitted = false;
  m.have_stats = false;
  const int passes = num_fit_passes();
  std::vector<const io::RawChunk*> chunks;
  for (int pass = 0; pass < passes; ++pass) {
    m.begin_pass(pass);
    ChunkBatchSource next = open_pass();
    if (window > 1) {
      m.fit_pipelined(next, pass, side, window);
    } else {
      for (int64_t batch = 0, n; (n = next(chunks)) > 0; ++batch) {
        DLREC_CHECK(n <= static_cast<int64_t>(chunks.size()), "Workflow::fit_batches: the source "
                    "reported ", n, " chunks but holds ", chunks.size());
        m.fit_chunks(chunks.data(), static_cast<int>(n), pass, side, batch);
        if (side) side->count = 0;
      }
    }
    m.end_pass(pass);
  }
  m.fitted = true;
  m.have_stats = true;
  m.build_plan(true);
}

bool Workflow::has_filters() const { return !impl_->filters.empty(); }

bool Workflow::fitted() const { return impl_->fitted; }

std::pair<int64_t, int64_t> Workflow::fit_spill_stats() const {
  const auto& m = impl_->fit_memory;
  return m ? std::make_pair(m->spilled_runs.load(), m->spilled_bytes.load())
           : std::make_pair(int64_t{0}, int64_t{0});
}

void Workflow::set_fit_memory(int64_t budget_bytes, const std::string& spill_dir) {
  std::shared_ptr<FitMemory> mem;
  if (budget_bytes > 0) {
    DLREC_CHECK(!spill_dir.empty(), "Workflow::set_fit_memory: no spill directory");
    // The side tables stay in memory (they are not spilled): they come out of the half of
    // the budget the vocabularies may use.
    const int64_t side = impl_->joins.memory_bytes();
    if (side > budget_bytes / 2)
      fail("the side tables (join_external) take ", side >> 20, " MB in memory, more than half "
           "of the memory budget (", budget_bytes >> 20, " MB); side tables are held in memory, "
           "not spilled: raise the budget or join fewer columns");
    mem = std::make_shared<FitMemory>();
    mem->available = budget_bytes / 2 - side;
    mem->spill_dir = spill_dir;
  }
  impl_->fit_memory = mem;
  for (auto& p : impl_->cat)
    for (auto& op : p.ops)
      if (auto* e = dynamic_cast<CategoricalEncoder*>(op.get())) e->set_fit_memory(mem);
}

}  // namespace dlrec::etl
