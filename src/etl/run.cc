#include "dlrec/etl/run.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <memory>
#include <tuple>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/etl/kept_chunks.h"
#include "dlrec/etl/workflow.h"
#include "dlrec/io/parquet.h"
#include "dlrec/io/shard.h"

namespace dlrec::etl {
namespace {

std::string shard_name(const std::string& prefix, int index) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s_%05d.shard", prefix.c_str(), index);
  return buf;
}

// Writes rows into <dir>/<prefix>_NNNNN.shard files of `shard_rows` rows each. Every finished
// file's path is appended to `created` (for cleanup on failure).
class ShardSetWriter {
 public:
  ShardSetWriter(std::string dir, std::string prefix, io::ShardLayout layout, int64_t shard_rows,
                 int64_t block_rows, std::vector<std::string>* created)
      : dir_(std::move(dir)),
        prefix_(std::move(prefix)),
        layout_(std::move(layout)),
        shard_rows_(shard_rows),
        block_rows_(block_rows),
        created_(created) {}

  // Writes rows [begin, end) of b.
  void write(const io::Batch& b, int64_t begin, int64_t end) {
    while (begin < end) {
      if (!cur_) {
        names_.push_back(shard_name(prefix_, static_cast<int>(names_.size())));
        open_next();
      }
      const int64_t n = std::min(end - begin, shard_rows_ - cur_->rows());
      if (begin == 0 && n == b.rows) {
        cur_->write(b);
      } else {
        part_.reset(b.num_dense, b.num_cat());
        part_.append_rows(b, begin, begin + n);
        cur_->write(part_);
      }
      begin += n;
      rows_ += n;
      if (cur_->rows() == shard_rows_) finish_current();
    }
  }

  // Writes the parts' rows in order (the same files as write() of each part); each shard's
  // whole blocks are encoded on all cores (io::ShardWriter::write_parts).
  void write_parts(const std::vector<io::BatchRows>& parts) {
    std::vector<io::BatchRows> batch;  // parts of the open file not yet handed to it
    int64_t in_file = cur_ ? cur_->rows() : 0;
    for (io::BatchRows p : parts) {
      while (p.begin < p.end) {
        if (!cur_) {
          names_.push_back(shard_name(prefix_, static_cast<int>(names_.size())));
          open_next();
          in_file = 0;
        }
        const int64_t n = std::min(p.end - p.begin, shard_rows_ - in_file);
        batch.push_back({p.batch, p.begin, p.begin + n});
        p.begin += n;
        in_file += n;
        rows_ += n;
        if (in_file == shard_rows_) {
          cur_->write_parts(batch);
          batch.clear();
          finish_current();
        }
      }
    }
    if (!batch.empty()) cur_->write_parts(batch);
  }

  // Direct mode (io::ShardWriter::reserve/write_at; not mixed with write()/write_parts()):
  // reserves the next n rows, as pieces of one or more files, for the callers to write from
  // any thread. A file whose rows are all reserved is closed by close_full(), once they are
  // written.
  struct Piece {
    io::ShardWriter* writer;
    int64_t at, rows;  // the piece's first row in the file, and its row count
  };
  void reserve(int64_t n, std::vector<Piece>& out) {
    out.clear();
    while (n > 0) {
      if (!cur_) {
        names_.push_back(shard_name(prefix_, static_cast<int>(names_.size())));
        open_next();
      }
      const int64_t take = std::min(n, shard_rows_ - cur_->rows());
      out.push_back({cur_.get(), cur_->reserve(take), take});
      n -= take;
      rows_ += take;
      if (cur_->rows() == shard_rows_) full_.push_back({std::move(cur_), names_.back()});
    }
  }
  // `written_only`: only those whose reserved rows are all written (others may still be
  // writing into the rest).
  void close_full(bool written_only = false) {
    for (auto& [w, name] : full_)
      if (!written_only || w->unwritten() == 0) finish(std::move(w), name);
    full_.erase(std::remove_if(full_.begin(), full_.end(), [](const auto& f) { return !f.first; }),
                full_.end());
  }

  // Closes the open file; `at_least_one` writes an empty shard when no row came.
  void close(bool at_least_one) {
    close_full();
    if (!cur_ && names_.empty() && at_least_one) {
      names_.push_back(shard_name(prefix_, 0));
      open_next();
    }
    if (cur_) finish_current();
  }

  const std::vector<std::string>& names() const { return names_; }
  int64_t rows() const { return rows_; }
  // The closed files' io::ShardWriter::times(), summed (after wait_closed()).
  const io::ShardWriter::Times& times() const { return times_; }

  // Waits for the files being closed in the background; rethrows the first close error.
  void wait_closed() {
    std::exception_ptr first;
    for (auto& c : closing_) {
      try {
        c.done.get();
        created_->push_back(c.path);
        const io::ShardWriter::Times t = c.writer->times();
        times_.file_write += t.file_write;
        times_.append_wait += t.append_wait;
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    closing_.clear();
    if (first) std::rethrow_exception(first);
  }
  ~ShardSetWriter() {
    try {
      wait_closed();  // a closed file is listed in `created`, for the caller's cleanup
    } catch (...) {
    }
  }

 private:
  void open_next() {
    cur_ = std::make_unique<io::ShardWriter>(dir_ + "/" + names_.back(), layout_, block_rows_);
  }
  // A full file is closed (footer, fsync, rename) on a helper thread while rows go on to
  // the next one; write_parts' early writeback has sent most of it to the disk already.
  void finish_current() { finish(std::move(cur_), names_.back()); }
  void finish(std::unique_ptr<io::ShardWriter> writer, const std::string& name) {
    std::shared_ptr<io::ShardWriter> w(std::move(writer));
    closing_.push_back({dir_ + "/" + name, w, std::async(std::launch::async, [w] { w->close(); })});
  }
  struct Closing {
    std::string path;
    std::shared_ptr<io::ShardWriter> writer;
    std::future<void> done;
  };
  std::vector<Closing> closing_;

  std::string dir_, prefix_;
  io::ShardLayout layout_;
  int64_t shard_rows_, block_rows_;
  std::vector<std::string>* created_;
  std::unique_ptr<io::ShardWriter> cur_;
  std::vector<std::pair<std::unique_ptr<io::ShardWriter>, std::string>> full_;  // direct mode
  std::vector<std::string> names_;
  io::Batch part_;
  int64_t rows_ = 0;
  io::ShardWriter::Times times_;
};

// rows idx[0..n) of src, in that order, into out.
void gather_rows(const io::Batch& src, const int64_t* idx, int64_t n, io::Batch& out) {
  const int nd = src.num_dense, nc = src.num_cat();
  out.reset(nd, nc);
  out.rows = n;
  out.labels.resize(n);
  out.dense.resize(n * nd);
  for (int64_t k = 0; k < n; ++k) {
    out.labels[k] = src.labels[idx[k]];
    std::copy_n(src.dense.data() + idx[k] * nd, nd, out.dense.data() + k * nd);
  }
  for (int t = 0; t < nc; ++t) {
    const auto& off = src.cat_offsets[t];
    const auto& ids = src.cat_indices[t];
    auto& o = out.cat_offsets[t];
    auto& d = out.cat_indices[t];
    o.resize(n + 1);
    for (int64_t k = 0; k < n; ++k) {
      d.insert(d.end(), ids.begin() + off[idx[k]], ids.begin() + off[idx[k] + 1]);
      o[k + 1] = static_cast<int64_t>(d.size());
    }
  }
}

// A seeded bijection of [0, n): a 4-round Feistel network over the smallest even number of
// bits covering n, walking values >= n through it again until they fall in range.
class Permutation {
 public:
  Permutation(int64_t n, uint64_t seed) : n_(static_cast<uint64_t>(std::max<int64_t>(n, 1))) {
    int bits = 2;
    while ((uint64_t{1} << bits) < n_) bits += 2;
    half_ = bits / 2;
    mask_ = (uint64_t{1} << half_) - 1;
    for (int r = 0; r < 4; ++r) keys_[r] = mix64(seed + 0x9E3779B97F4A7C15ULL * (r + 1));
  }
  int64_t operator()(int64_t i) const {
    uint64_t x = static_cast<uint64_t>(i);
    do {
      uint64_t l = x >> half_, r = x & mask_;
      for (int k = 0; k < 4; ++k) {
        const uint64_t t = l ^ (mix64(r ^ keys_[k]) & mask_);
        l = r;
        r = t;
      }
      x = (l << half_) | r;
    } while (x >= n_);
    return static_cast<int64_t>(x);
  }

 private:
  uint64_t n_, mask_ = 0, keys_[4] = {};
  int half_ = 1;
};

// Training rows for ranks, shuffled or not. Output position p = perm(i) of training row i
// (identity without shuffle); rank r holds positions [start[r], start[r + 1]) (equal sizes, +-1),
// cut into files of at most file_rows. Phase 1 (write) appends each row to the temporary
// bucket of its destination file with its position there; phase 2 (finish) loads one bucket at
// a time, orders it by position and writes the final shard.
class RankWriter {
 public:
  RankWriter(std::string dir, io::ShardLayout layout, int64_t total, int ranks, int64_t file_rows,
             bool shuffle, uint64_t seed, int64_t block_rows, std::vector<std::string>* created)
      : dir_(std::move(dir)),
        layout_(std::move(layout)),
        total_(total),
        ranks_(ranks),
        shuffle_(shuffle),
        perm_(total, seed),
        block_rows_(block_rows),
        created_(created) {
    for (int r = 0; r <= ranks; ++r) start_.push_back(total * r / ranks);
    for (int r = 0; r < ranks; ++r) {
      const int64_t rows = start_[r + 1] - start_[r];
      const int64_t files = std::max<int64_t>(1, (rows + file_rows - 1) / file_rows);
      for (int64_t f = 0; f < files; ++f) {
        File x;
        x.rank = r;
        x.begin = start_[r] + f * file_rows;
        x.end = std::min(start_[r + 1], x.begin + file_rows);
        char name[64];
        if (ranks == 1)
          std::snprintf(name, sizeof name, "train_%05lld.shard", static_cast<long long>(f));
        else
          std::snprintf(name, sizeof name, "train_r%03d_%05lld.shard", r,
                        static_cast<long long>(f));
        x.name = name;
        const std::string tmp = dir_ + "/.shuffle-" + std::to_string(::getpid()) + "-" +
                                std::to_string(files_.size());
        x.bucket = tmp + ".shard";
        x.pos = tmp + ".pos";
        files_.push_back(x);
      }
    }
    DLREC_CHECK(files_.size() <= 4096, "etl: ", files_.size(),
                " training files for the ranks; raise shard_rows");
    for (int r = 0; r < ranks; ++r) file0_.push_back(-1);
    for (size_t g = 0; g < files_.size(); ++g)
      if (file0_[files_[g].rank] < 0) file0_[files_[g].rank] = static_cast<int64_t>(g);
    writers_.resize(files_.size());
    pos_files_.resize(files_.size(), nullptr);
  }
  ~RankWriter() {
    for (FILE* f : pos_files_)
      if (f) std::fclose(f);
    writers_.clear();  // unclosed shard writers drop their temporary files
    for (const auto& f : files_) {
      std::remove(f.bucket.c_str());
      std::remove(f.pos.c_str());
    }
  }

  // Rows [begin, end) of b are training rows first, first + 1, ...
  void write(const io::Batch& b, int64_t begin, int64_t end, int64_t first) {
    by_file_.assign(files_.size(), {});
    pos_by_file_.assign(files_.size(), {});
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = first + (r - begin);
      DLREC_CHECK(i < total_, "etl: more training rows than the fit saw (", total_, ")");
      const int64_t p = shuffle_ ? perm_(i) : i;
      const int rank = static_cast<int>(std::upper_bound(start_.begin(), start_.end(), p) -
                                        start_.begin()) - 1;
      int64_t g = file0_[rank];
      while (p >= files_[g].end) ++g;  // files of a rank are consecutive
      by_file_[g].push_back(r);
      pos_by_file_[g].push_back(p - files_[g].begin);
    }
    for (size_t g = 0; g < files_.size(); ++g) {
      if (by_file_[g].empty()) continue;
      if (!writers_[g]) {
        // Temporary buckets: small blocks, so many open buckets stay small in memory.
        writers_[g] = std::make_unique<io::ShardWriter>(files_[g].bucket, layout_, 8192);
        pos_files_[g] = std::fopen(files_[g].pos.c_str(), "wb");
        if (!pos_files_[g]) fail("etl: cannot create '", files_[g].pos, "': ", std::strerror(errno));
      }
      gather_rows(b, by_file_[g].data(), static_cast<int64_t>(by_file_[g].size()), part_);
      writers_[g]->write(part_);
      const auto& pos = pos_by_file_[g];
      if (std::fwrite(pos.data(), 8, pos.size(), pos_files_[g]) != pos.size())
        fail("etl: writing '", files_[g].pos, "' failed: ", std::strerror(errno));
    }
    received_ += end - begin;
  }

  // Phase 2: the final shards, one file at a time.
  void finish() {
    DLREC_CHECK(received_ == total_, "etl: the transform pass produced ", received_,
                " training rows, the fit ", total_);
    io::Batch all, out;
    std::vector<int64_t> order, pos;
    for (size_t g = 0; g < files_.size(); ++g) {
      File& f = files_[g];
      const int64_t n = f.end - f.begin;
      all.reset(layout_.num_dense, static_cast<int>(layout_.cardinalities.size()));
      pos.clear();
      if (writers_[g]) {
        writers_[g]->close();
        writers_[g].reset();
        const bool ok = std::fclose(pos_files_[g]) == 0;
        pos_files_[g] = nullptr;
        if (!ok) fail("etl: writing '", f.pos, "' failed");
        io::ShardReader reader(f.bucket);
        reader.read(0, reader.rows(), all);
        pos.resize(all.rows);
        FILE* pf = std::fopen(f.pos.c_str(), "rb");
        const size_t got = pf ? std::fread(pos.data(), 8, pos.size(), pf) : 0;
        if (pf) std::fclose(pf);
        DLREC_CHECK(got == pos.size(), "etl: reading '", f.pos, "' failed");
      }
      DLREC_CHECK(all.rows == n, "etl: training file ", f.name, " got ", all.rows, " rows, expected ",
                  n);
      order.assign(n, -1);
      for (int64_t k = 0; k < n; ++k) {
        DLREC_CHECK(pos[k] >= 0 && pos[k] < n && order[pos[k]] < 0, "etl: shuffle positions broken");
        order[pos[k]] = k;
      }
      io::ShardWriter w(dir_ + "/" + f.name, layout_, block_rows_);
      for (int64_t k = 0; k < n; k += block_rows_) {
        const int64_t m = std::min(block_rows_, n - k);
        gather_rows(all, order.data() + k, m, out);
        w.write(out);
      }
      w.close();
      created_->push_back(dir_ + "/" + f.name);
      std::remove(f.bucket.c_str());
      std::remove(f.pos.c_str());
    }
    rank_names_.assign(ranks_, {});
    for (const auto& f : files_) rank_names_[f.rank].push_back(f.name);
  }

  const std::vector<std::vector<std::string>>& rank_names() const { return rank_names_; }
  int64_t rank_rows(int r) const { return start_[r + 1] - start_[r]; }

 private:
  struct File {
    int rank = 0;
    int64_t begin = 0, end = 0;  // positions
    std::string name, bucket, pos;
  };
  std::string dir_;
  io::ShardLayout layout_;
  int64_t total_;
  int ranks_;
  bool shuffle_;
  Permutation perm_;
  int64_t block_rows_;
  std::vector<std::string>* created_;
  std::vector<int64_t> start_;
  std::vector<File> files_;
  std::vector<int64_t> file0_;  // first file of each rank
  std::vector<std::unique_ptr<io::ShardWriter>> writers_;
  std::vector<FILE*> pos_files_;
  std::vector<std::vector<int64_t>> by_file_, pos_by_file_;
  io::Batch part_;
  int64_t received_ = 0;
  std::vector<std::vector<std::string>> rank_names_;
};

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
void keep_first_rows(io::RawChunk& c, int64_t k) {
  c.label.resize(std::min<size_t>(static_cast<size_t>(k), c.label.size()));
  c.dense.resize(static_cast<size_t>(k * c.num_dense));
  for (int t = 0; t < c.num_cat; ++t) {
    c.cat_values[t].resize(static_cast<size_t>(c.cat_offsets[t][k]));
    c.cat_offsets[t].resize(static_cast<size_t>(k + 1));
  }
  c.rows = k;
}

// Rows [lo, hi) of c as a chunk of their own.
io::RawChunk copy_rows(const io::RawChunk& c, int64_t lo, int64_t hi) {
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
int64_t default_cache_bytes(int64_t memory_budget_mb) {
  if (memory_budget_mb > 0) return (memory_budget_mb << 20) / 4;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page / 5 * 2 : 0;
}

// User + system CPU seconds of the process so far.
double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Chunks per batch: one per thread, so that a batch is one parallel parse of the reader.
int batch_chunks() { return std::max(2, num_threads()); }

// The reader's options for a pass. Pieces parsed ahead (io::ReadOptions::parse_ahead): under a
// memory budget one per thread (no more parsed rows in flight than a batch); else the given
// value, DLREC_ETL_PARSE_AHEAD (for A/B runs of one binary) or the reader's default.
io::ReadOptions pass_read_options(const EtlOptions& o) {
  io::ReadOptions ro = o.read;
  if (ro.parse_ahead == 0) {
    if (const char* env = std::getenv("DLREC_ETL_PARSE_AHEAD"); env && *env) {
      ro.parse_ahead = std::atoi(env);
      DLREC_CHECK(ro.parse_ahead >= 1 && ro.parse_ahead <= 4096,
                  "etl: DLREC_ETL_PARSE_AHEAD must be in [1, 4096], got '", env, "'");
    }
  }
  if (o.memory_budget_mb > 0) ro.parse_ahead = std::max(1, num_threads());
  return ro;
}

void remove_files(const std::vector<std::string>& paths) {
  for (const auto& p : paths) std::remove(p.c_str());
}

// Removes a previous dataset in `dir` (its dataset.json and listed shards).
void remove_old_dataset(const std::string& dir) {
  const std::string ds = dir + "/dataset.json";
  std::vector<std::string> files;
  try {
    io::DatasetInfo old = io::DatasetInfo::load(dir);
    for (const auto& s : old.train_shards) files.push_back(dir + "/" + s);
    for (const auto& s : old.valid_shards) files.push_back(dir + "/" + s);
  } catch (const Error&) {
    // An unreadable dataset.json: remove just that file.
  }
  std::remove(ds.c_str());  // first, so no dataset.json ever lists missing shards
  remove_files(files);
  std::remove((dir + "/ranks.json").c_str());
}

}  // namespace

namespace {

// '\n' bytes of [p, e) whose line has at least one byte (the byte before is not a '\n'; `prev`
// is the byte before p). 16 bytes at a time where SSE2 is there (a line is ~260 bytes in
// Criteo: one memchr call per line was the count's cost).
int64_t count_line_ends(const char* p, const char* e, char prev) {
  int64_t n = 0;
#if defined(__SSE2__)
  const __m128i nl = _mm_set1_epi8('\n');
  unsigned carry = prev == '\n';  // the byte before the block is a '\n'
  for (; e - p >= 16; p += 16) {
    const unsigned m = static_cast<unsigned>(
        _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), nl)));
    if (const unsigned ends = m & ~((m << 1) | carry)) n += __builtin_popcount(ends);
    carry = m >> 15;
  }
  prev = carry ? '\n' : ' ';  // only whether it is a '\n' matters below
#endif
  for (; p < e; prev = *p++) n += *p == '\n' && prev != '\n';
  return n;
}

// Reads n bytes of `path` at `at` (all there: the size is known).
void read_fully_at(int fd, char* dst, size_t n, uint64_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail("reading '", path, "' failed: ", got < 0 ? std::strerror(errno) : "file shrank");
    dst += got;
    n -= static_cast<size_t>(got);
    at += static_cast<uint64_t>(got);
  }
}

// The rows of a file of `size` bytes holding `ends` line ends of non-empty lines: plus an
// unterminated last line, less the header line.
int64_t rows_of_line_ends(int fd, uint64_t size, bool header, const std::string& path,
                          int64_t ends) {
  if (size == 0) return 0;
  char last;
  read_fully_at(fd, &last, 1, size - 1, path);
  if (last != '\n') ++ends;  // an unterminated last line
  if (header) {  // the first line is the header, whatever it holds
    char first;
    read_fully_at(fd, &first, 1, 0, path);
    if (first != '\n') --ends;  // a non-empty first line was counted
  }
  return ends;
}

constexpr size_t kCountBuf = size_t{1} << 20;  // bytes per read of the count

// Line ends of non-empty lines in bytes [from, to) of `path` (`prev`: the byte before `from`),
// read kCountBuf at a time into `buf`; after each read, keep_going(ends so far) may stop the
// count (returns -1 then).
template <class F>
int64_t count_line_ends_in(int fd, uint64_t from, uint64_t to, char prev, std::vector<char>& buf,
                           const std::string& path, F&& keep_going) {
  if (buf.size() < kCountBuf) buf.resize(kCountBuf);
  int64_t n = 0;
  for (uint64_t at = from; at < to;) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kCountBuf, to - at));
    read_fully_at(fd, buf.data(), len, at, path);
    n += count_line_ends(buf.data(), buf.data() + len, prev);
    prev = buf[len - 1];
    at += len;
    if (!keep_going(n)) return -1;
  }
  return n;
}

// count_rows of one regular file of `size` bytes: '\n' bytes whose line is not empty, counted on
// all cores, each task reading its parts of the file with pread into a buffer of its own (no
// mapping of the file: no page tables to fill and drop again).
int64_t count_read(int fd, uint64_t size, bool header, const std::string& path) {
  // Parts of at least 8 MB, several per thread (they differ in speed).
  const int64_t parts = std::clamp<int64_t>(static_cast<int64_t>(size >> 23), 1,
                                            4 * std::max(1, num_threads()));
  std::vector<int64_t> counts(parts, 0);
  std::vector<std::exception_ptr> errors(parts);
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<char> buf;
    for (int64_t t = lo; t < hi; ++t) {
      try {
        const uint64_t from = size * t / parts, to = size * (t + 1) / parts;
        // The byte before the part: a '\n' right after another one ends a blank line. Before
        // the file's first byte counts as a '\n' (a '\n' there ends an empty first line).
        char prev = '\n';
        if (from > 0) read_fully_at(fd, &prev, 1, from - 1, path);
        counts[t] = count_line_ends_in(fd, from, to, prev, buf, path, [](int64_t) { return true; });
      } catch (...) {
        errors[t] = std::current_exception();
      }
    }
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  int64_t ends = 0;
  for (int64_t c : counts) ends += c;
  return rows_of_line_ends(fd, size, header, path, ends);
}

// Whether every input is a regular file or Parquet (it can be read twice).
bool inputs_rereadable(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    if (io::is_parquet_path(f)) continue;
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  }
  return true;
}

// The rows of the inputs estimated from the average line of the first MB of the first text
// file (Parquet: the footer's count); -1 when there is no text to estimate from.
int64_t estimate_rows(const std::vector<std::string>& files) {
  int64_t rows = 0, text_bytes = 0;
  double line = 0;  // bytes per line
  for (const auto& f : files) {
    if (io::is_parquet_path(f)) {
      rows += io::parquet_num_rows(f);
      continue;
    }
    const uint64_t size = file_size(f);
    text_bytes += static_cast<int64_t>(size);
    if (line > 0 || size == 0) continue;
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open '", f, "': ", std::strerror(errno));
    std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(size, kCountBuf)));
    try {
      read_fully_at(fd, buf.data(), buf.size(), 0, f);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    const int64_t ends = count_line_ends(buf.data(), buf.data() + buf.size(), '\n');
    line = static_cast<double>(buf.size()) / static_cast<double>(std::max<int64_t>(ends, 1));
  }
  if (text_bytes > 0 && line <= 0) return -1;
  return rows + (text_bytes > 0 ? static_cast<int64_t>(static_cast<double>(text_bytes) / line) : 0);
}

}  // namespace

int64_t train_rows_of(int64_t rows, double valid_ratio) {
  return rows - static_cast<int64_t>(std::floor(static_cast<double>(rows) * valid_ratio));
}

RowCountAhead::RowCountAhead(std::vector<std::string> files, io::Schema schema,
                             double valid_ratio)
    : files_(std::move(files)), schema_(std::move(schema)), valid_ratio_(valid_ratio) {
  thread_ = std::thread([this] { run(); });
}

RowCountAhead::~RowCountAhead() {
  stop_ = true;
  thread_.join();
}

// The files one after the other, each read in order into one buffer: after every read, the
// rows of the files done plus the line ends so far (less a header) are a lower bound of the
// count, published for train_before().
void RowCountAhead::run() {
  try {
    std::vector<char> buf;
    int64_t done = 0;  // rows of the files counted
    auto publish = [&](int64_t lower) {
      std::lock_guard<std::mutex> g(mu_);
      lower_ = lower;
      cv_.notify_all();
    };
    for (const auto& path : files_) {
      if (stop_) return;
      if (io::is_parquet_path(path)) {
        done += io::parquet_num_rows(path);
        publish(done);
        continue;
      }
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
      struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
      } closer{fd};
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        fail("etl: counting rows ahead needs a regular file, '", path, "' is not one");
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      const int64_t ends = count_line_ends_in(fd, 0, size, '\n', buf, path, [&](int64_t n) {
        publish(done + std::max<int64_t>(0, n - (schema_.header ? 1 : 0)));
        return !stop_;
      });
      if (ends < 0) return;  // stopped
      done += rows_of_line_ends(fd, size, schema_.header, path, ends);
    }
    std::lock_guard<std::mutex> g(mu_);
    lower_ = total_ = done;
    cv_.notify_all();
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

int64_t RowCountAhead::train_before(int64_t upto) {
  std::unique_lock<std::mutex> lk(mu_);
  auto known = [&] {
    return error_ || total_ >= 0 || train_rows_of(lower_, valid_ratio_) >= upto;
  };
  if (!known()) {
    Timer t;
    cv_.wait(lk, known);
    waited_ += t.seconds();
  }
  if (error_) std::rethrow_exception(error_);
  return total_ >= 0 ? std::min(upto, train_rows_of(total_, valid_ratio_)) : upto;
}

int64_t RowCountAhead::rows() {
  std::unique_lock<std::mutex> lk(mu_);
  auto known = [&] { return error_ || total_ >= 0; };
  if (!known()) {
    Timer t;
    cv_.wait(lk, known);
    waited_ += t.seconds();
  }
  if (error_) std::rethrow_exception(error_);
  return total_;
}

int64_t count_rows(const std::vector<std::string>& files, const io::Schema& schema) {
  int64_t total = 0;
  std::vector<char> buf;
  for (const auto& path : files) {
    if (io::is_parquet_path(path)) {  // the footer has the count
      total += io::parquet_num_rows(path);
      continue;
    }
    {  // a regular file: read in parallel parts
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        int64_t lines = 0;
        try {
          lines = count_read(fd, static_cast<uint64_t>(st.st_size), schema.header, path);
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
        total += lines;
        continue;
      }
      if (fd >= 0) ::close(fd);
    }
    buf.resize(size_t{16} << 20);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
    int64_t lines = 0;       // non-blank lines
    int64_t line_len = 0;    // bytes of the current line so far
    bool first_line = true;  // the header, when the schema has one
    for (;;) {
      ssize_t got = ::read(fd, buf.data(), buf.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        fail("reading '", path, "' failed: ", std::strerror(err));
      }
      if (got == 0) break;
      const char* p = buf.data();
      const char* end = p + got;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
        if (!nl) {
          line_len += end - p;
          break;
        }
        line_len += nl - p;
        if (first_line && schema.header) {
          first_line = false;
        } else if (line_len > 0) {
          ++lines;
        }
        first_line = false;
        line_len = 0;
        p = nl + 1;
      }
    }
    ::close(fd);
    if (line_len > 0 && !(first_line && schema.header)) ++lines;
    total += lines;
  }
  return total;
}

CacheForm parse_cache_form(const std::string& s) {
  if (s == "auto") return CacheForm::Auto;
  if (s == "compact") return CacheForm::Compact;
  if (s == "parsed") return CacheForm::Parsed;
  fail("input cache form must be 'auto', 'compact' or 'parsed', got '", s, "'");
}

EtlResult run_etl(const EtlOptions& o) {
  Timer total_timer;
  EtlResult res;
  // DLREC_ETL_TIMES=1: the run's clock at the end of each phase and of the clean-up, on stderr
  // (where the seconds outside the count, fit and transform timers go).
  const bool times = std::getenv("DLREC_ETL_TIMES") && *std::getenv("DLREC_ETL_TIMES") == '1';
  auto mark = [&](const char* what) {
    if (times) std::fprintf(stderr, "etl times: %-28s %.3f s\n", what, total_timer.seconds());
  };
  struct AtExit {  // marks a point of the clean-up (destructors run in reverse order)
    std::function<void()> f;
    ~AtExit() { f(); }
  };
  AtExit end_mark{[&] { mark("clean-up done"); }};
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
  DLREC_CHECK(o.input_cache_mb >= -1, "etl: input_cache_mb must be -1 (default size), 0 (off) or a "
              "size in MB, got ", o.input_cache_mb);
  for (const auto& f : o.inputs) {
    if (!file_exists(f)) fail("etl: input file '", f, "' does not exist");
    res.input_bytes += static_cast<int64_t>(file_size(f));
  }
  // Validate the config before touching the output directory.
  Workflow workflow = Workflow::from_config(o.workflow, o.schema);

  make_dirs(o.output_dir);
  if (file_exists(o.output_dir + "/dataset.json")) {
    if (!o.overwrite)
      fail("etl: '", o.output_dir, "' already holds a dataset (dataset.json); choose another "
           "output directory or overwrite it");
    remove_old_dataset(o.output_dir);
  }

  // The split: the first n_train good rows train (-1: all rows).
  int64_t n_train = -1;
  int64_t expected_rows = -1;
  // Counting ahead (EtlOptions::count_ahead_min_bytes): until count_known(), n_train is not
  // set, expected_rows is an estimate, and split_before() asks the count (started once the
  // input cache is known to be on).
  std::unique_ptr<RowCountAhead> ahead;
  bool counting = false;
  auto set_split = [&](int64_t rows) {  // the split of `rows` rows (valid_ratio)
    expected_rows = rows;
    n_train = train_rows_of(rows, o.valid_ratio);
    if (n_train == 0) fail("etl: the split leaves no training rows");
  };
  auto count_first = [&] {  // counts on all cores now
    Timer t;
    const int64_t rows = count_rows(o.inputs, o.schema);
    res.count_seconds += t.seconds();
    mark("count done");
    set_split(rows);
  };
  auto count_known = [&] {  // waits for the count ahead and sets the split from it
    if (!counting) return;
    counting = false;
    const int64_t rows = ahead->rows();
    res.count_seconds += ahead->wait_seconds();
    mark("count known");
    set_split(rows);
  };
  // min(upto, n_train): how many of the first `upto` rows train.
  auto split_before = [&](int64_t upto) -> int64_t {
    if (counting) return ahead->train_before(upto);
    return n_train < 0 ? upto : std::min(upto, n_train);
  };
  if (o.train_rows >= 0) {
    n_train = o.train_rows;
  } else if (o.valid_ratio > 0) {
    Timer t;
    // DLREC_ETL_COUNT_AHEAD=0: count first whatever the size (for A/B runs of one binary).
    const char* env = std::getenv("DLREC_ETL_COUNT_AHEAD");
    const bool allowed = !(env && std::strcmp(env, "0") == 0);
    if (allowed && o.count_ahead_min_bytes >= 0 && res.input_bytes >= o.count_ahead_min_bytes &&
        inputs_rereadable(o.inputs)) {
      expected_rows = estimate_rows(o.inputs);
      counting = expected_rows >= 0;
    }
    res.count_seconds = t.seconds();  // the estimate
    if (!counting) count_first();  // else the count starts once the cache is known to be on
  }
  if (n_train == 0) fail("etl: the split leaves no training rows");

  std::vector<std::string> created;
  try {
    // ---- fit, on the training rows only
    Timer fit_timer;
    const double fit_cpu0 = process_cpu_seconds();
    if (o.memory_budget_mb > 0)
      workflow.set_fit_memory(o.memory_budget_mb << 20,
                              o.spill_dir.empty() ? o.output_dir : o.spill_dir);
    res.fit_passes = workflow.num_fit_passes();
    int pass = 0;
    std::unique_ptr<BatchReader> batches;
    std::unique_ptr<Progress> progress;
    int64_t fit_rows = 0;
    // The input cache: on unless it is off or the row count says it cannot fit. Its form
    // (EtlOptions::input_cache_form): Auto keeps the rows compacted (about a third of the
    // memory) when their memory gets huge pages (the fastest on 16 cores, docs/ETL.md), when
    // the parsed rows would not fit or under a memory budget; else as parsed (faster on 16
    // cores than compacted in 4 KB pages).
    InputCache cache;
    cache.cap = o.input_cache_mb < 0 ? default_cache_bytes(o.memory_budget_mb)
                                     : o.input_cache_mb << 20;
    // The decisions below from the row count, or from the estimate (an eighth over it) while
    // counting ahead; counting ahead only where the cache is on (the reader reads past the
    // split, so that it need not know where the split is), else the count comes first.
    auto decide = [&] {
      const int64_t rows_for = counting ? expected_rows + expected_rows / 8 : expected_rows;
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
    };
    decide();
    if (counting && !cache.on) {  // the count first, on all cores
      counting = false;
      count_first();
      decide();
    } else if (counting) {
      ahead = std::make_unique<RowCountAhead>(o.inputs, o.schema, o.valid_ratio);
      res.count_ahead = true;
    }
    // Batches parsed ahead: two for the compacted cache (measured on 16 cores), else one as
    // before (and under a memory budget: less memory in flight).
    const int read_ahead = o.read_ahead > 0
                               ? o.read_ahead
                               : (o.memory_budget_mb == 0 && cache.on && cache.compact ? 2 : 1);
    // Fit batches in flight (Workflow::fit_batches). Several (no barrier per batch: the fit's
    // column strands run on threads of their own while the reader parses on the pool) only
    // where the cores leave room for both: on the 16-core host, 8 threads with 4 in flight did
    // 700-738 MB/s vs 622-628 with one (the fit 1.4-1.6 s vs 1.9), but 16 threads did not gain
    // (815-833 vs 780-923 MB/s): that fit waits for the reader's parse, and the strands' threads
    // take cores from it (docs/ETL.md). One (as before) under a memory budget (less memory in
    // flight) and with one thread (nothing to overlap).
    int window = o.fit_window;
    if (window == 0) {
      const char* env = std::getenv("DLREC_ETL_FIT_WINDOW");
      const unsigned cores = std::thread::hardware_concurrency();
      window = 2 * static_cast<unsigned>(num_threads()) <= cores ? 4 : 1;
      if (env && *env) window = std::atoi(env);
      DLREC_CHECK(window >= 1 && window <= 64, "etl: DLREC_ETL_FIT_WINDOW must be in [1, 64], "
                  "got '", env ? env : "", "'");
      if (o.memory_budget_mb > 0 || num_threads() == 1) window = 1;
    }
    cache.pending.resize(window);
    bool cached = false;          // the transform pass reads the cache
    int64_t read_rows = 0;        // input rows read by this fit pass
    // The reader's batches in flight, one per slot (the source's call number modulo window).
    std::vector<std::vector<io::RawChunk>> ring(window);
    // Kept chunks unpacked for a later fit pass, per slot.
    std::vector<std::vector<io::RawChunk>> unpacked(window);
    bool cache_read_failed = false;   // the reader failed in the first pass, keeping rows
    FitSideWork side;                 // the fit's side tasks: keeping a batch's rows
    auto open_fit_pass = [&]() -> ChunkBatchSource {
      if (progress) progress->finish();
      ++pass;
      progress = std::make_unique<Progress>(
          "etl fit (pass " + std::to_string(pass) + "/" + std::to_string(res.fit_passes) + ")",
          counting ? train_rows_of(expected_rows, o.valid_ratio) : n_train, "rows");
      fit_rows = 0;
      if (cached) {  // a later pass over the kept training chunks
        size_t at = 0;
        int64_t call = 0;
        return [&, at, call](std::vector<const io::RawChunk*>& out) mutable {
          out.clear();
          std::vector<io::RawChunk>& into = unpacked[call++ % window];
          const size_t k = std::min(cache.train_chunks - at, static_cast<size_t>(batch_chunks()));
          if (into.size() < k) into.resize(k);
          parallel_for(0, static_cast<int64_t>(k), 1, [&](int64_t lo, int64_t hi) {
            for (int64_t i = lo; i < hi; ++i)
              if (!cache.chunks[at + i].parsed()) cache.chunks[at + i].unpack(into[i]);
          });
          for (size_t i = 0; i < k; ++i) {
            const KeptChunk& kc = cache.chunks[at + i];
            out.push_back(kc.parsed() ? kc.parsed() : &into[i]);
            fit_rows += kc.rows();
          }
          at += k;
          progress->update(fit_rows);
          return static_cast<int>(out.size());
        };
      }
      io::ReadOptions ro = pass_read_options(o);
      // Keeping the rows: the first pass reads all of them (the validation rows too).
      if (!(pass == 1 && cache.on)) {
        count_known();  // this reader stops at the split
        ro.max_rows = n_train;
      }
      if (batches) res.read_wait_seconds += batches->wait_seconds();
      batches.reset();
      batches = std::make_unique<BatchReader>(io::open_reader(o.inputs, o.schema, ro),
                                              batch_chunks(), read_ahead);
      const bool first = pass == 1;
      if (first && cache.on && !cache.arena) {
        cache.arena = std::make_unique<KeptArena>(
            cache.huge,  // blocks of an eighth of the cap, 2-64 MB
            std::clamp<size_t>(static_cast<size_t>(cache.cap / 8), size_t{2} << 20,
                               KeptArena::kBlockBytes));
      }
      read_rows = 0;
      int64_t call = 0;
      return [&, first, call](std::vector<const io::RawChunk*>& out) mutable {
        out.clear();
        // The slot of the batch given up `window` calls ago: its rows were kept by the fit's
        // side tasks (Workflow::fit_batches calls again only once it is done with them).
        const size_t s = static_cast<size_t>(call++ % window);
        std::vector<io::RawChunk>& batch = ring[s];
        cache.settle(s);
        while (out.empty()) {
          cache.flush(s);  // rows of a batch the fit does not see, before the reader reuses it
          int n = 0;
          try {
            n = batches->next(batch);
          } catch (...) {
            if (first && cache.on) cache_read_failed = true;
            throw;
          }
          if (n == 0) break;
          for (int i = 0; i < n; ++i) {
            io::RawChunk& c = batch[i];
            const int64_t train = std::max<int64_t>(
                0, std::min(c.rows, split_before(read_rows + c.rows) - read_rows));
            read_rows += c.rows;
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
              fit_rows += train;
            }
          }
        }
        // Compact: the fit keeps this batch's rows on its threads (the pending validation
        // rows of earlier batches in this call were kept by flush()).
        side.count = cache.compact ? static_cast<int>(cache.pending[s].size()) : 0;
        progress->update(fit_rows);
        return static_cast<int>(out.size());
      };
    };
    side.task = [&](int64_t b, int i) { cache.keep_one(cache.pending[b % window][i]); };
    try {
      workflow.fit_batches(open_fit_pass, &side, window);
    } catch (const Error&) {
      // A bad row met while keeping the rows may lie past the training rows, where the fit
      // alone would not have read (the transform pass would report it, or an earlier error of
      // its own first). The fit starts again without keeping rows, so errors come as they would
      // without the cache.
      if (!cache_read_failed) throw;
      if (batches) res.read_wait_seconds += batches->wait_seconds();
      batches.reset();
      cache = InputCache{};
      cache.pending.resize(window);
      pass = 0;
      workflow.fit_batches(open_fit_pass, &side, window);
    }
    if (progress) progress->finish();
    count_known();
    if (batches) res.read_wait_seconds += batches->wait_seconds();
    // The batches still in their slots: the fit is done with them (their side tasks ran).
    for (size_t s = 0; s < cache.pending.size(); ++s) cache.settle(s);
    if (cache.arena) cache.arena->finish();
    cached = cache.on;
    res.input_cache_bytes = cached ? cache.bytes : 0;
    res.input_cache_compact = cached && cache.compact;
    res.input_cache_huge_pages = cached && cache.compact && cache.huge;
    // The first pass's reader has seen every row when the transform reads the cache: its
    // statistics (skipped rows) are the transform's.
    AtExit after_reader{[&] { mark("first reader gone"); }};
    std::unique_ptr<BatchReader> fit_reader;
    AtExit before_reader{[&] { mark("transform state gone"); }};
    if (cached) fit_reader = std::move(batches);
    batches.reset();
    if (fit_rows == 0) fail("etl: the input holds no rows to fit on");
    if (o.train_rows >= 0 && fit_rows < n_train)
      fail("etl: train_rows is ", n_train, " but the input holds only ", fit_rows,
           " good rows; no rows would be left for validation");
    res.fit_seconds = fit_timer.seconds();
    res.fit_cpu_seconds = process_cpu_seconds() - fit_cpu0;
    mark("fit done");
    std::tie(res.spill_runs, res.spill_bytes) = workflow.fit_spill_stats();

    // The fitted workflow is final now: it is saved on a helper thread while the transform
    // runs (both only read it). Waited for (and its file listed for clean-up) before the
    // metadata below, or when the transform fails.
    const std::string wf = o.output_dir + "/workflow.json";
    std::future<void> saving = std::async(std::launch::async, [&] { workflow.save(wf); });
    AtExit saved{[&] {
      if (!saving.valid()) return;
      try {
        saving.get();
        created.push_back(wf);
      } catch (...) {
      }
    }};

    // ---- transform every row into train/valid shards
    Timer tr_timer;
    const double tr_cpu0 = process_cpu_seconds();
    const io::ShardLayout layout = workflow.output_layout();
    ShardSetWriter train(o.output_dir, "train", layout, o.shard_rows, o.block_rows, &created);
    ShardSetWriter valid(o.output_dir, "valid", layout, o.shard_rows, o.block_rows, &created);
    // Shuffled and/or per-rank training rows go through a RankWriter (two phases).
    const bool rank_mode = o.shuffle || o.ranks > 1;
    std::unique_ptr<RankWriter> ranked;
    if (rank_mode) {
      const int64_t total = workflow.fit_stats().at("rows").get<int64_t>();
      int64_t file_rows = o.shard_rows;
      if (o.memory_budget_mb > 0) {  // phase 2 holds one file's rows: a quarter of the budget
        const int64_t row_bytes = 8 + 4 * layout.num_dense +
                                  16 * static_cast<int64_t>(layout.cardinalities.size());
        file_rows = std::max<int64_t>(o.block_rows,
                                      std::min(file_rows, (o.memory_budget_mb << 20) / 4 / row_bytes));
      }
      ranked = std::make_unique<RankWriter>(o.output_dir, layout, total, o.ranks, file_rows,
                                            o.shuffle, o.seed, o.block_rows, &created);
    }
    int64_t written_train = 0;  // training rows handed to the writers
    // The rows: from the cache (each batch's chunks leave it, so its memory goes down as the
    // pass goes on), else read again.
    // Batches of at least a shard block of rows: the shard writers then encode most blocks
    // straight from the transformed chunks instead of first copying them into pending rows
    // (with few threads a batch of one chunk per thread is a fraction of a block).
    const int tchunks = static_cast<int>(std::max<int64_t>(
        batch_chunks(), (o.block_rows + o.read.chunk_rows - 1) / std::max<int64_t>(1, o.read.chunk_rows)));
    // Under a memory budget, one chunk per thread as before (less memory in flight).
    const int transform_chunks =
        o.memory_budget_mb > 0 ? batch_chunks() : std::min(tchunks, std::max(batch_chunks(), 64));
    std::unique_ptr<BatchReader> input;
    if (!cached)
      input = std::make_unique<BatchReader>(
          io::open_reader(o.inputs, o.schema, pass_read_options(o)), transform_chunks, read_ahead);
    // From the cache, a batch's kept chunks are unpacked by the transform tasks (into the
    // reused `chunks`); they leave the cache, so its memory goes down as the pass goes on.
    std::vector<KeptChunk> kept_batch;
    auto next_batch = [&](std::vector<io::RawChunk>& out) -> int {
      if (input) return input->next(out);
      const size_t k = std::min(cache.chunks.size(), static_cast<size_t>(transform_chunks));
      if (out.size() < k) out.resize(k);
      if (kept_batch.size() < k) kept_batch.resize(k);
      for (size_t i = 0; i < k; ++i) {
        kept_batch[i] = std::move(cache.chunks.front());
        cache.chunks.pop_front();
      }
      return static_cast<int>(k);
    };
    Progress tp("etl transform", expected_rows, "rows");
    // Each batch of chunks is transformed on all cores (a chunk per task, into its own
    // io::Batch); the writer thread then hands its rows to the shard writers, which encode
    // whole blocks on all cores, while the next batch is read and transformed. The split is
    // by input position: a chunk's first to_train_in[i] input rows train.
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
    // Direct: each transform task encodes its own rows into the shard files' blocks
    // (io::ShardWriter::reserve/write_at) instead of a writer thread encoding the batch after
    // it (one pass less over the rows, no second fork-join per batch). Not with ranks or
    // shuffling, filters (a chunk's rows are placed before it is transformed) or multi-hot
    // features; DLREC_ETL_DIRECT=0 turns it off (A/B runs).
    const char* direct_env = std::getenv("DLREC_ETL_DIRECT");
    const bool direct = !ranked && !workflow.has_filters() &&
                        std::none_of(layout.multi_hot.begin(), layout.multi_hot.end(),
                                     [](bool m) { return m; }) &&
                        !(direct_env && std::string(direct_env) == "0");
    std::vector<std::vector<ShardSetWriter::Piece>> train_pieces, valid_pieces;
    // Direct: transforms a chunk (its first tr.rows rows train) and writes its rows at the
    // places reserved for them (training pieces, then validation pieces).
    auto transform_and_write = [&](const io::RawChunk& chunk, io::Batch& out,
                                   std::vector<int64_t>& kept_rows, const TrainRows& tr,
                                   int64_t rows, const std::vector<ShardSetWriter::Piece>& trp,
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
    };
    if (direct && !input) {
      // From the cache, without a barrier per batch: every thread takes the next kept chunk
      // (its rows reserved in the shard files under the lock), then unpacks, transforms and
      // writes it on its own. The validation chunks go first (in input order), then the
      // training ones: each file still gets its rows in input order, and the validation file's
      // close (fsync) overlaps the training rows instead of ending the pass. On an error no
      // more chunks are taken, and the error of the first failing chunk in input order is
      // reported.
      const int64_t nchunks = static_cast<int64_t>(cache.chunks.size());
      const int64_t nvalid = n_train < 0 ? 0 : nchunks - static_cast<int64_t>(cache.train_chunks);
      std::vector<int64_t> before(nchunks + 1, 0);  // input rows before chunk i
      for (int64_t i = 0; i < nchunks; ++i) before[i + 1] = before[i] + cache.chunks[i].rows();
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
      parallel_tasks(num_threads(), [&](int) {
        io::RawChunk chunk;
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
            kc = std::move(cache.chunks[seq]);
            rows = kc.rows();
            const int64_t at = before[seq];
            tr.first = n_train < 0 ? at : std::min(at, n_train);  // no filters: all rows kept
            tr.rows = n_train < 0 ? rows : std::max<int64_t>(0, std::min(rows, n_train - at));
            seen += rows;
            train_seen += tr.rows;
            written_train += tr.rows;
            try {
              train.close_full(/*written_only=*/true);
              valid.close_full(true);
              train.reserve(tr.rows, trp);
              valid.reserve(rows - tr.rows, vap);
            } catch (...) {
              failed(seq);
              return;
            }
            tp.update(seen);
          }
          try {
            kc.unpack_move(chunk);
            transform_and_write(chunk, out, kept_rows, tr, rows, trp, vap);
          } catch (...) {
            std::lock_guard<std::mutex> g(mu);
            failed(seq);
            return;
          }
        }
      });
      if (error) std::rethrow_exception(error);
      cache.chunks.clear();
    }
    for (int n; direct && (n = next_batch(chunks)) > 0;) {
      std::vector<io::Batch>& out = outs[0];
      if (static_cast<int>(out.size()) < n) out.resize(n);
      kept.resize(std::max<size_t>(kept.size(), n));
      train_pieces.resize(std::max<size_t>(train_pieces.size(), n));
      valid_pieces.resize(std::max<size_t>(valid_pieces.size(), n));
      to_train_in.assign(n, 0);
      first_train.assign(n, 0);
      errors.assign(n, nullptr);
      std::vector<int64_t> in_rows(n);
      for (int i = 0; i < n; ++i) {
        in_rows[i] = input ? chunks[i].rows : kept_batch[i].rows();
        to_train_in[i] =
            n_train < 0 ? in_rows[i] : std::max<int64_t>(0, std::min(in_rows[i], n_train - seen));
        seen += in_rows[i];
        first_train[i] = train_seen;
        train_seen += to_train_in[i];
        written_train += to_train_in[i];
        train.reserve(to_train_in[i], train_pieces[i]);
        valid.reserve(in_rows[i] - to_train_in[i], valid_pieces[i]);
      }
      parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          try {
            if (!input) kept_batch[i].unpack_move(chunks[i]);
            transform_and_write(chunks[i], out[i], kept[i], {first_train[i], to_train_in[i]},
                                in_rows[i], train_pieces[i], valid_pieces[i]);
          } catch (...) {
            errors[i] = std::current_exception();
          }
        }
      });
      for (const auto& e : errors)
        if (e) std::rethrow_exception(e);  // the first failing chunk in input order
      train.close_full();
      valid.close_full();
      tp.update(seen);
    }
    for (int n; !direct && (n = next_batch(chunks)) > 0;) {
      std::vector<io::Batch>& out = outs[cur];
      if (static_cast<int>(out.size()) < n) out.resize(n);
      kept.resize(std::max<size_t>(kept.size(), n));
      to_train_in.assign(n, 0);
      to_train.assign(n, 0);
      first_train.assign(n, 0);
      errors.assign(n, nullptr);
      for (int i = 0; i < n; ++i) {
        const int64_t rows = input ? chunks[i].rows : kept_batch[i].rows();
        to_train_in[i] = n_train < 0 ? rows : std::max<int64_t>(0, std::min(rows, n_train - seen));
        seen += rows;
      }
      auto transform_one = [&](int i) {
        try {
          const TrainRows tr{first_train[i], to_train_in[i]};
          if (!input) kept_batch[i].unpack_move(chunks[i]);
          workflow.transform(chunks[i], out[i], &kept[i], /*append=*/false, &tr);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      };
      if (!workflow.has_filters()) {
        // Every input row is kept: chunk i's training rows start at the sum before it.
        for (int i = 0; i < n; ++i) {
          first_train[i] = train_seen;
          train_seen += to_train_in[i];
          to_train[i] = to_train_in[i];
        }
        parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) transform_one(static_cast<int>(i));
        });
        for (const auto& e : errors)
          if (e) std::rethrow_exception(e);  // the first failing chunk in input order
      } else {
        // Filters: a chunk's first training row depends on the rows kept before it.
        for (int i = 0; i < n; ++i) {
          first_train[i] = train_seen;
          transform_one(i);
          if (errors[i]) std::rethrow_exception(errors[i]);
          to_train[i] = std::lower_bound(kept[i].begin(), kept[i].end(), to_train_in[i]) -
                        kept[i].begin();
          train_seen += to_train[i];
        }
      }
      tp.update(seen);
      if (writing.valid()) writing.get();  // rethrows a write error
      std::vector<io::BatchRows> train_parts, valid_parts;
      std::vector<std::array<int64_t, 3>> ranked_parts;  // (chunk, rows, first training row)
      for (int i = 0; i < n; ++i) {
        if (to_train[i] > 0) {
          if (ranked)
            ranked_parts.push_back({i, to_train[i], written_train});
          else
            train_parts.push_back({&out[i], 0, to_train[i]});
          written_train += to_train[i];
        }
        if (to_train[i] < out[i].rows) valid_parts.push_back({&out[i], to_train[i], out[i].rows});
      }
      RankWriter* rw = ranked.get();
      writing = std::async(std::launch::async, [&, rw, train_parts = std::move(train_parts),
                                                valid_parts = std::move(valid_parts),
                                                ranked_parts = std::move(ranked_parts), cur] {
        Timer t;
        const std::vector<io::Batch>& b = outs[cur];
        for (const auto& [i, rows, first] : ranked_parts) rw->write(b[i], 0, rows, first);
        if (!train_parts.empty()) train.write_parts(train_parts);
        if (!valid_parts.empty()) valid.write_parts(valid_parts);
        write_busy += t.seconds();
      });
      cur ^= 1;
    }
    if (writing.valid()) writing.get();
    mark("rows written");
    res.write_seconds = write_busy;
    if (input) res.read_wait_seconds += input->wait_seconds();
    const io::ChunkReader* reader = input ? &input->reader() : &fit_reader->reader();
    if (ranked) {
      ranked->finish();
      res.rank_shards = ranked->rank_names();
    } else {
      train.close(true);
    }
    valid.close(false);
    train.wait_closed();
    valid.wait_closed();
    res.file_write_seconds = train.times().file_write + valid.times().file_write;
    res.append_wait_seconds = train.times().append_wait + valid.times().append_wait;
    res.skipped_rows = reader->stats().skipped_rows;
    tp.finish(res.skipped_rows ? std::to_string(res.skipped_rows) + " malformed rows skipped"
                               : "");
    res.train_rows = ranked ? written_train : train.rows();
    res.valid_rows = valid.rows();
    res.train_shards = train.names();
    for (const auto& r : res.rank_shards)
      res.train_shards.insert(res.train_shards.end(), r.begin(), r.end());
    res.valid_shards = valid.names();
    res.transform_seconds = tr_timer.seconds();
    res.transform_cpu_seconds = process_cpu_seconds() - tr_cpu0;
    mark("transform done");

    // ---- metadata; dataset.json last
    saving.get();  // rethrows a failed save
    created.push_back(wf);

    json stats = {{"format", "dlrec-stats"},
                  {"version", 1},
                  {"train_rows", res.train_rows},
                  {"valid_rows", res.valid_rows},
                  {"skipped_rows", res.skipped_rows},
                  {"columns", workflow.fit_stats()}};
    if (res.skipped_rows) stats["first_skip_reason"] = reader->stats().first_skip_reason;
    const std::string st = o.output_dir + "/stats.json";
    write_file_atomic(st, stats.dump(2) + "\n");
    created.push_back(st);

    if (ranked) {  // which training shards each rank reads
      json rk = {{"format", "dlrec-ranks"}, {"version", 1}, {"ranks", o.ranks},
                 {"shuffle", o.shuffle}, {"seed", o.seed}};
      json rows = json::array(), shards = json::array();
      for (int r = 0; r < o.ranks; ++r) {
        rows.push_back(ranked->rank_rows(r));
        shards.push_back(res.rank_shards[r]);
      }
      rk["train_rows"] = rows;
      rk["train_shards"] = shards;
      const std::string rp = o.output_dir + "/ranks.json";
      write_file_atomic(rp, rk.dump(2) + "\n");
      created.push_back(rp);
    }

    io::DatasetInfo info;
    info.layout = layout;
    info.train_shards = res.train_shards;
    info.valid_shards = res.valid_shards;
    info.train_rows = res.train_rows;
    info.valid_rows = res.valid_rows;
    info.dense_names = workflow.dense_names();
    info.cat_names = workflow.cat_names();
    info.save(o.output_dir);
    created.push_back(o.output_dir + "/dataset.json");
    mark("metadata written");
  } catch (...) {
    remove_files(created);
    throw;
  }
  mark("run state gone");
  for (const auto& f : created) res.output_bytes += static_cast<int64_t>(file_size(f));
  res.total_seconds = total_timer.seconds();
  return res;
}

}  // namespace dlrec::etl
