// The output of a job of several processes with a merged fit (include/dlrec/etl/ranks_merge.h):
// the plan of the shard files, their transform and writing, rank 0's metadata.
#include "dlrec/etl/ranks_merge.h"

#include <algorithm>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"
#include "dlrec/core/thread_pool.h"
#include "dlrec/io/shard.h"
#include "etl/output_dir.h"
#include "etl/run_input.h"
#include "etl/shard_sets.h"

namespace dlrec::etl {

std::string RankShard::name() const {
  return run_detail::shard_name(train ? "train" : "valid", index);
}

std::vector<RankShard> plan_rank_shards(const std::vector<int64_t>& rank_first, int64_t n_train,
                                        int64_t shard_rows) {
  DLREC_CHECK(rank_first.size() >= 2 && rank_first.front() == 0, "etl: no rows per rank");
  DLREC_CHECK(shard_rows >= 1, "etl: shard_rows must be >= 1, got ", shard_rows);
  const int ranks = static_cast<int>(rank_first.size()) - 1;
  const int64_t total = rank_first.back();
  DLREC_CHECK(n_train >= 0 && n_train <= total, "etl: ", n_train, " training rows of ", total);
  std::vector<RankShard> out;
  for (const bool train : {true, false}) {
    const int64_t lo = train ? 0 : n_train, hi = train ? n_train : total;
    for (int64_t b = lo, i = 0; b < hi; b += shard_rows, ++i) {
      RankShard s;
      s.train = train;
      s.index = static_cast<int>(i);
      s.begin = b;
      s.end = std::min(hi, b + shard_rows);
      int64_t most = -1;
      for (int p = 0; p < ranks; ++p) {
        const int64_t held = std::max<int64_t>(
            0, std::min(s.end, rank_first[p + 1]) - std::max(s.begin, rank_first[p]));
        if (held > most) most = held, s.owner = p;
      }
      out.push_back(s);
    }
  }
  return out;
}

std::vector<RowSlice> slices_of(const std::vector<io::RawChunk>& chunks, int64_t first_row,
                                int64_t lo, int64_t hi) {
  std::vector<RowSlice> out;
  int64_t at = first_row;
  for (const io::RawChunk& c : chunks) {
    const int64_t b = std::max(lo, at), e = std::min(hi, at + c.rows);
    if (b < e) out.push_back({&c, b - at, e - at});
    at += c.rows;
    if (at >= hi) break;
  }
  return out;
}

io::RawChunk copy_slice(const RowSlice& s) {
  DLREC_CHECK(s.chunk && 0 <= s.begin && s.begin <= s.end && s.end <= s.chunk->rows, "etl: rows [",
              s.begin, ", ", s.end, ") of a chunk of ", s.chunk ? s.chunk->rows : 0, " rows");
  return run_detail::copy_rows(*s.chunk, s.begin, s.end);
}

void write_rank_shard(const Workflow& workflow, const std::vector<RowSlice>& rows,
                      const std::string& path, int64_t block_rows,
                      std::vector<io::Batch>* scratch) {
  io::ShardWriter writer(path, workflow.output_layout(), block_rows);
  // Groups of chunks transformed on all cores, then written in order (write_parts: the bytes of
  // one write() of all the rows).
  const size_t group = static_cast<size_t>(std::max(64, 4 * num_threads()));
  std::vector<io::Batch> own;
  std::vector<io::Batch>& out = scratch ? *scratch : own;
  for (size_t g = 0; g < rows.size(); g += group) {
    const size_t n = std::min(group, rows.size() - g);
    if (out.size() < n) out.resize(n);
    parallel_for(0, static_cast<int64_t>(n), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) workflow.transform(*rows[g + i].chunk, out[i]);
    });
    std::vector<io::BatchRows> parts;
    for (size_t i = 0; i < n; ++i) parts.push_back({&out[i], rows[g + i].begin, rows[g + i].end});
    writer.write_parts(parts);
  }
  writer.close();
}

RankOutput::RankOutput(const EtlOptions& o) : out_(std::make_unique<EtlOutput>(o)) {}
RankOutput::~RankOutput() = default;
const std::string& RankOutput::dir() const { return out_->dir(); }

void RankOutput::finish(const Workflow& workflow, const std::vector<RankShard>& shards,
                        EtlResult& res, const std::string& first_skip_reason) {
  const std::string& dir = out_->dir();
  io::DatasetInfo info;
  for (const RankShard& s : shards) {
    (s.train ? info.train_shards : info.valid_shards).push_back(s.name());
    (s.train ? info.train_rows : info.valid_rows) += s.end - s.begin;
  }
  res.train_rows = info.train_rows;
  res.valid_rows = info.valid_rows;
  workflow.save(dir + "/workflow.json");
  // stats.json and dataset.json as EtlRun::write_metadata writes them (src/etl/run_transform.cc;
  // tests/dist/etl_ranks_test.cc compares the bytes).
  json stats = {{"format", "dlrec-stats"},          {"version", 1},
                {"train_rows", res.train_rows},     {"valid_rows", res.valid_rows},
                {"skipped_rows", res.skipped_rows}, {"columns", workflow.fit_stats()}};
  if (res.skipped_rows) stats["first_skip_reason"] = first_skip_reason;
  write_file_atomic(dir + "/stats.json", stats.dump(2) + "\n");
  info.layout = workflow.output_layout();
  info.dense_names = workflow.dense_names();
  info.cat_names = workflow.cat_names();
  info.save(dir);
  res.train_shards = info.train_shards;
  res.valid_shards = info.valid_shards;
  res.output_bytes = 0;
  for (const auto& n : {"workflow.json", "stats.json", "dataset.json"})
    res.output_bytes += static_cast<int64_t>(file_size(dir + "/" + n));
  for (const RankShard& s : shards)
    res.output_bytes += static_cast<int64_t>(file_size(dir + "/" + s.name()));
  out_->commit();
}

}  // namespace dlrec::etl
