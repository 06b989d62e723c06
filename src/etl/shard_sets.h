// The shard files of a run_etl output: ShardSetWriter (train_NNNNN.shard / valid_NNNNN.shard
// in input order) and RankWriter (training rows per rank, shuffled or not, through temporary
// buckets). Internal to src/etl (run.cc, run_transform.cc).
#pragma once

#include <algorithm>
#include <future>
#include <tuple>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/etl/op.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"

namespace dlrec::etl::run_detail {

inline std::string shard_name(const std::string& prefix, int index) {
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
inline void gather_rows(const io::Batch& src, const int64_t* idx, int64_t n, io::Batch& out) {
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

}  // namespace dlrec::etl::run_detail
