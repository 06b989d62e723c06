// The input side of run_etl: batches of parsed chunks read ahead (BatchReader), the parsed
// input kept between the passes (InputCache), and the row count helpers of row_count.cc.
// Internal to src/etl (run.cc, run_transform.cc).
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/kept_chunks.h"
#include "dlrec/etl/run.h"
#include "dlrec/io/parquet.h"
#include "dlrec/io/text_reader.h"

namespace dlrec::etl::run_detail {

// Whether every input is a regular file or Parquet (it can be read twice). (row_count.cc)
bool inputs_rereadable(const std::vector<std::string>& files);
// The rows of the inputs estimated from the average line of the first MB of the first text
// file (Parquet: the footer's count); -1 when there is no text to estimate from. (row_count.cc)
int64_t estimate_rows(const std::vector<std::string>& files);

// Batches of up to `k` chunks from a reader, read (parsed on all cores by the reader) by a
// helper thread up to `depth` batches ahead of the caller, so that the parse of the next
// batches fills the threads the caller's work on the current one leaves idle. A read error
// surfaces at the batch it belongs to (the helper stops there).
class BatchReader {
 public:
  BatchReader(std::unique_ptr<io::ChunkReader> reader, int k, int depth)
      : reader_(std::move(reader)), k_(std::max(1, k)), depth_(std::max(1, depth)) {}
  ~BatchReader() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Fills out[0, n) with the next chunks (resizing `out` as needed); 0 at the end. The chunks
  // `out` held before go back to the helper, to be parsed into again.
  int next(std::vector<io::RawChunk>& out) {
    Timer t;
    std::unique_lock<std::mutex> l(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { produce(); });
    cv_.wait(l, [&] { return !ready_.empty() || ended_; });
    if (ready_.empty()) {
      wait_seconds_ += t.seconds();
      return 0;
    }
    Batch b = std::move(ready_.front());
    ready_.pop_front();
    free_.push_back(std::move(out));
    out = std::move(b.chunks);
    l.unlock();
    cv_.notify_all();
    wait_seconds_ += t.seconds();
    if (b.error) std::rethrow_exception(b.error);
    return b.n;
  }
  // The reader, for its statistics once next() returned 0.
  const io::ChunkReader& reader() const { return *reader_; }
  double wait_seconds() const { return wait_seconds_; }  // time next() waited for the reader

 private:
  struct Batch {
    std::vector<io::RawChunk> chunks;
    int n = 0;
    std::exception_ptr error;
  };
  void produce() {
    for (;;) {
      Batch b;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || static_cast<int>(ready_.size()) < depth_; });
        if (stop_) return;
        if (!free_.empty()) {
          b.chunks = std::move(free_.back());
          free_.pop_back();
        }
      }
      try {
        if (static_cast<int>(b.chunks.size()) < k_) b.chunks.resize(k_);
        while (b.n < k_ && reader_->next(b.chunks[b.n])) ++b.n;
      } catch (...) {
        b.error = std::current_exception();
      }
      const bool last = b.n == 0 || b.error;
      {
        std::lock_guard<std::mutex> g(mu_);
        ready_.push_back(std::move(b));
        ended_ = last;
      }
      cv_.notify_all();
      if (last) return;
    }
  }
  std::unique_ptr<io::ChunkReader> reader_;
  int k_, depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;                       // parsed batches, in order
  std::vector<std::vector<io::RawChunk>> free_;  // chunks handed back, to parse into
  bool stop_ = false, ended_ = false;
  std::thread thread_;
  double wait_seconds_ = 0;
};

// Rows [k, rows) of c dropped (c keeps rows [0, k) and its capacity).
inline void keep_first_rows(io::RawChunk& c, int64_t k) {
  c.label.resize(std::min<size_t>(static_cast<size_t>(k), c.label.size()));
  c.dense.resize(static_cast<size_t>(k * c.num_dense));
  for (int t = 0; t < c.num_cat; ++t) {
    c.cat_values[t].resize(static_cast<size_t>(c.cat_offsets[t][k]));
    c.cat_offsets[t].resize(static_cast<size_t>(k + 1));
  }
  c.rows = k;
}

// Rows [lo, hi) of c as a chunk of their own.
inline io::RawChunk copy_rows(const io::RawChunk& c, int64_t lo, int64_t hi) {
  io::RawChunk t;
  t.reset(c.num_dense, c.num_cat);
  t.rows = hi - lo;
  t.first_line = c.first_line > 0 ? c.first_line + lo : 0;  // as Workflow's messages count
  if (!c.label.empty()) t.label.assign(c.label.begin() + lo, c.label.begin() + hi);
  t.dense.assign(c.dense.begin() + lo * c.num_dense, c.dense.begin() + hi * c.num_dense);
  for (int k = 0; k < c.num_cat; ++k) {
    const auto& off = c.cat_offsets[k];
    t.cat_values[k].assign(c.cat_values[k].begin() + off[lo], c.cat_values[k].begin() + off[hi]);
    auto& toff = t.cat_offsets[k];
    toff.resize(static_cast<size_t>(t.rows + 1));
    for (int64_t r = 0; r <= t.rows; ++r) toff[r] = off[lo + r] - off[lo];
  }
  return t;
}

// The parsed input kept between the passes (EtlOptions::input_cache_mb): every row in input
// order, chunks [0, train_chunks) holding the training rows and the rest the validation rows
// (the chunk holding the split is kept in two). A deque, so that kept chunks stay where they
// are while more come.
//
// Compacted (EtlOptions::input_cache_form, etl::KeptChunk::keep), the rows of a batch are
// copied by side tasks of the fit (FitSideWork: they fill the threads its columns leave idle)
// and the reader reuses its chunks; as parsed, the chunks are moved in once the fit is done
// with them. The fit has up to `window` batches in flight (Workflow::fit_batches), each in
// its own slot (the source's call number modulo the window) with its own pending rows.
struct InputCache {
  std::deque<KeptChunk> chunks;
  size_t train_chunks = 0;
  int64_t bytes = 0, cap = 0;
  bool on = false;  // keeping chunks (first pass) or holding all of them (later)
  bool compact = true;
  bool huge = false;  // the compacted rows' blocks ask for transparent huge pages
  std::unique_ptr<KeptArena> arena;
  // First pass: rows of a batch to keep once the fit is done with them, per batch slot.
  struct Pending {
    KeptChunk* slot;
    io::RawChunk* chunk;
    int64_t lo, hi;
  };
  std::vector<std::vector<Pending>> pending = std::vector<std::vector<Pending>>(1);

  void keep_one(const Pending& p) {
    if (compact)
      *p.slot = KeptChunk::keep(*p.chunk, p.lo, p.hi, *arena);
    else  // as parsed: the whole chunk (a split chunk's tail was copied out already)
      *p.slot = KeptChunk::keep_parsed(std::move(*p.chunk));
  }
  // Counts the pending rows of batch slot s, which the fit's side tasks kept (compact) or which
  // are moved in now (parsed); past the cap, stops keeping, and drops everything kept once no
  // side task of a batch still in flight can be writing into it (no slot has pending rows).
  void settle(size_t s) {
    if (!compact)
      for (const Pending& p : pending[s]) keep_one(p);
    for (const Pending& p : pending[s]) bytes += p.slot->bytes();
    pending[s].clear();
    if (bytes > cap) on = false;
    if (!on && !chunks.empty() &&
        std::all_of(pending.begin(), pending.end(), [](const auto& v) { return v.empty(); }))
      drop();
  }
  // Keeps the pending rows of slot s here (rows the fit did not see: the validation rows).
  void flush(size_t s) {
    if (compact && !pending[s].empty())
      parallel_for(0, static_cast<int64_t>(pending[s].size()), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) keep_one(pending[s][i]);
      });
    settle(s);
  }
  void drop() {  // too large: the later passes read the input again
    on = false;
    for (auto& v : pending) v.clear();
    chunks.clear();
    bytes = 0;
    train_chunks = 0;
  }
};

// The default cache size: a quarter of the memory budget (the Categorify count tables have
// half, the reader's and writer's buffers the rest), else 40 % of the physical memory.
inline int64_t default_cache_bytes(int64_t memory_budget_mb) {
  if (memory_budget_mb > 0) return (memory_budget_mb << 20) / 4;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / 5 * 2 : 0;
}

// User + system CPU seconds of the process so far.
inline double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Chunks per batch: one per thread, so that a batch is one parallel parse of the reader.
// The input's rows for a pass: the files through io::open_reader, or the rows parsed by the
// job's ranks (EtlOptions::parsed_input).
inline std::unique_ptr<io::ChunkReader> open_input(const EtlOptions& o,
                                                   const io::ReadOptions& ro) {
  if (o.parsed_input) return replay_reader(o.parsed_input, ro);
  return io::open_reader(o.inputs, o.schema, ro);
}

inline int batch_chunks() { return std::max(2, num_threads()); }

// The reader's options for a pass. Pieces parsed ahead (io::ReadOptions::parse_ahead): under a
// memory budget one per thread (no more parsed rows in flight than a batch); else the given
// value (0: the reader's default).
inline io::ReadOptions pass_read_options(const EtlOptions& o) {
  io::ReadOptions ro = o.read;
  if (o.memory_budget_mb > 0) ro.parse_ahead = std::max(1, num_threads());
  return ro;
}

inline void remove_files(const std::vector<std::string>& paths) {
  for (const auto& p : paths) std::remove(p.c_str());
}

}  // namespace dlrec::etl::run_detail
