#include "dlrec/etl/run.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <tuple>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/progress.h"
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
        cur_ = std::make_unique<io::ShardWriter>(dir_ + "/" + names_.back(), layout_,
                                                 block_rows_);
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

  // Closes the open file; `at_least_one` writes an empty shard when no row came.
  void close(bool at_least_one) {
    if (!cur_ && names_.empty() && at_least_one) {
      names_.push_back(shard_name(prefix_, 0));
      cur_ = std::make_unique<io::ShardWriter>(dir_ + "/" + names_.back(), layout_, block_rows_);
    }
    if (cur_) finish_current();
  }

  const std::vector<std::string>& names() const { return names_; }
  int64_t rows() const { return rows_; }

 private:
  void finish_current() {
    cur_->close();
    created_->push_back(dir_ + "/" + names_.back());
    cur_.reset();
  }

  std::string dir_, prefix_;
  io::ShardLayout layout_;
  int64_t shard_rows_, block_rows_;
  std::vector<std::string>* created_;
  std::unique_ptr<io::ShardWriter> cur_;
  std::vector<std::string> names_;
  io::Batch part_;
  int64_t rows_ = 0;
};

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
}

}  // namespace

int64_t count_rows(const std::vector<std::string>& files, const io::Schema& schema) {
  int64_t total = 0;
  std::vector<char> buf(size_t{16} << 20);
  for (const auto& path : files) {
    if (io::is_parquet_path(path)) {  // the footer has the count
      total += io::parquet_num_rows(path);
      continue;
    }
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

EtlResult run_etl(const EtlOptions& o) {
  Timer total_timer;
  EtlResult res;
  DLREC_CHECK(!o.inputs.empty(), "etl: no input files");
  DLREC_CHECK(!o.output_dir.empty(), "etl: no output directory");
  DLREC_CHECK(o.shard_rows >= 1, "etl: shard_rows must be >= 1, got ", o.shard_rows);
  DLREC_CHECK(o.block_rows >= 1, "etl: block_rows must be >= 1, got ", o.block_rows);
  DLREC_CHECK(o.valid_ratio >= 0 && o.valid_ratio < 1, "etl: valid_ratio must be in [0, 1), got ",
              o.valid_ratio);
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
  if (o.train_rows >= 0) {
    n_train = o.train_rows;
  } else if (o.valid_ratio > 0) {
    Timer t;
    expected_rows = count_rows(o.inputs, o.schema);
    const int64_t n_valid =
        static_cast<int64_t>(std::floor(static_cast<double>(expected_rows) * o.valid_ratio));
    n_train = expected_rows - n_valid;
    res.count_seconds = t.seconds();
  }
  if (n_train == 0) fail("etl: the split leaves no training rows");

  std::vector<std::string> created;
  try {
    // ---- fit, on the training rows only
    Timer fit_timer;
    if (o.memory_budget_mb > 0)
      workflow.set_fit_memory(o.memory_budget_mb << 20,
                              o.spill_dir.empty() ? o.output_dir : o.spill_dir);
    res.fit_passes = workflow.num_fit_passes();
    int pass = 0;
    std::unique_ptr<io::ChunkReader> reader;
    std::unique_ptr<Progress> progress;
    int64_t fit_rows = 0;
    workflow.fit_multipass([&]() -> ChunkSource {
      if (progress) progress->finish();
      io::ReadOptions ro = o.read;
      ro.max_rows = n_train;
      reader = io::open_reader(o.inputs, o.schema, ro);
      ++pass;
      progress = std::make_unique<Progress>(
          "etl fit (pass " + std::to_string(pass) + "/" + std::to_string(res.fit_passes) + ")",
          n_train, "rows");
      fit_rows = 0;
      return [&](io::RawChunk& c) {
        if (!reader->next(c)) return false;
        fit_rows += c.rows;
        progress->update(fit_rows);
        return true;
      };
    });
    if (progress) progress->finish();
    if (fit_rows == 0) fail("etl: the input holds no rows to fit on");
    if (o.train_rows >= 0 && fit_rows < n_train)
      fail("etl: train_rows is ", n_train, " but the input holds only ", fit_rows,
           " good rows; no rows would be left for validation");
    res.fit_seconds = fit_timer.seconds();
    std::tie(res.spill_runs, res.spill_bytes) = workflow.fit_spill_stats();

    // ---- transform every row into train/valid shards
    Timer tr_timer;
    const io::ShardLayout layout = workflow.output_layout();
    ShardSetWriter train(o.output_dir, "train", layout, o.shard_rows, o.block_rows, &created);
    ShardSetWriter valid(o.output_dir, "valid", layout, o.shard_rows, o.block_rows, &created);
    reader = io::open_reader(o.inputs, o.schema, o.read);
    Progress tp("etl transform", expected_rows, "rows");
    // Chunks are transformed into a batch of about block_rows rows (appending), so the shard
    // writer encodes whole blocks straight from it; writing batch i (checksums, file I/O)
    // overlaps reading and transforming batch i + 1.
    io::RawChunk chunk;
    io::Batch batches[2];
    int cur = 0;
    int64_t seen = 0;
    int64_t batch_train = 0;    // rows of batches[cur] that train (a prefix: the split is by position)
    std::vector<int64_t> kept;  // input row of each output row (Filter ops drop rows)
    std::future<void> writing;
    auto flush = [&]() {
      io::Batch& batch = batches[cur];
      if (batch.rows == 0) return;
      if (writing.valid()) writing.get();  // rethrows a write error
      const int64_t to_train = batch_train;
      writing = std::async(std::launch::async, [&train, &valid, &batch, to_train] {
        if (to_train > 0) train.write(batch, 0, to_train);
        if (to_train < batch.rows) valid.write(batch, to_train, batch.rows);
      });
      cur ^= 1;
      batches[cur].rows = 0;
      batch_train = 0;
    };
    int64_t train_seen = 0;  // training rows written so far (after filtering)
    while (reader->next(chunk)) {
      io::Batch& batch = batches[cur];
      const int64_t before = batch.rows;
      // The split is by input position: output rows from the chunk's first to_train_in rows.
      const int64_t to_train_in =
          n_train < 0 ? chunk.rows : std::max<int64_t>(0, std::min(chunk.rows, n_train - seen));
      const TrainRows train_rows{train_seen, to_train_in};
      workflow.transform(chunk, batch, &kept, /*append=*/true, &train_rows);
      const int64_t to_train =
          std::lower_bound(kept.begin(), kept.end(), to_train_in) - kept.begin();
      train_seen += to_train;
      if (batch_train == before) batch_train += to_train;
      seen += chunk.rows;
      tp.update(seen);
      // A batch switching from training to validation rows goes out at once, so the
      // validation shards start on a block boundary of their own.
      if (batch.rows >= o.block_rows || (batch_train > 0 && batch_train < batch.rows)) flush();
    }
    flush();
    if (writing.valid()) writing.get();
    train.close(true);
    valid.close(false);
    res.skipped_rows = reader->stats().skipped_rows;
    tp.finish(res.skipped_rows ? std::to_string(res.skipped_rows) + " malformed rows skipped"
                               : "");
    res.train_rows = train.rows();
    res.valid_rows = valid.rows();
    res.train_shards = train.names();
    res.valid_shards = valid.names();
    res.transform_seconds = tr_timer.seconds();

    // ---- metadata; dataset.json last
    const std::string wf = o.output_dir + "/workflow.json";
    workflow.save(wf);
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
  } catch (...) {
    remove_files(created);
    throw;
  }
  for (const auto& f : created) res.output_bytes += static_cast<int64_t>(file_size(f));
  res.total_seconds = total_timer.seconds();
  return res;
}

}  // namespace dlrec::etl
