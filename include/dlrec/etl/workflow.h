// Workflow: raw rows (io::RawChunk) -> encoded rows (io::Batch), configured by JSON, fitted by
// streaming over training data, saved as workflow.json and reloaded by training, `dlrec
// predict` and the server so that every consumer encodes raw rows identically.
//
// Config (docs/ETL.md):
//   {"label": "rating",   (optional: a dense column whose value after its ops is the label)
//    "pipeline": [
//      {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "LogOp"}]},
//      {"columns": ["C1", "C2"], "ops": [{"op": "Categorify", "freq_threshold": 15}]}]}
// "columns" is "@dense", "@categorical" or a list of schema column names. A column listed by
// several steps gets their ops in step order. Dense columns without ops pass through; every
// categorical column needs an encoder (Categorify) as its last op.
//
// Output (io::ShardLayout, docs/ETL.md "Output"): dense features = dense schema columns not
// turned categorical (Bucketize), in schema order, then the dense features of feature ops
// (TargetEncoding, JoinGroupby) in pipeline order; categorical features = categorical schema
// columns not dropped (DropLowCardinality) and bucketized dense columns, in schema order, then
// HashedCross features in pipeline order. Rename changes a feature's name. Labels are copied.
// Categorical ids: 0 = missing (an empty field; a multi-hot field that is empty becomes the
// single id 0, so every row has at least one id), 1 = out of vocabulary / rare, 2.. =
// vocabulary by descending training frequency (ties by ascending key).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/etl/op.h"
#include "dlrec/io/batch.h"
#include "dlrec/io/raw_chunk.h"
#include "dlrec/io/schema.h"
#include "dlrec/io/shard.h"

namespace dlrec::etl {

// Fills the chunk with the next rows; false when the pass is over.
using ChunkSource = std::function<bool(io::RawChunk&)>;
// Sets `chunks` to the next chunks of rows, in order, and returns their number; 0 when the
// pass is over. The chunks of a call stay valid until the source has been called `window` more
// times (Workflow::fit_batches' window; 1: until the next call).
using ChunkBatchSource = std::function<int(std::vector<const io::RawChunk*>& chunks)>;
// The caller's own work, run by fit_batches on the fit's threads together with the column tasks
// and claimed after those of the same batch, so that it fills the threads the columns leave
// idle: after call number `batch` of the source (0, 1, ... within a pass), task(batch, i) runs
// once for every i in [0, count) (count as that call just set it), before that call's chunks
// are given up (the source is not called `window` more times before). An exception from a task
// ends the fit.
struct FitSideWork {
  int count = 0;
  std::function<void(int64_t batch, int i)> task;
};

class Workflow {
 public:
  // Builds an unfitted workflow. Unknown keys, ops and columns are errors naming the nearest
  // valid name; ops applied to the wrong column type and categorical columns without an
  // encoder are errors too. The config's side tables ("join_external") are read now, a
  // relative path against `base_dir` (run_etl: the first input's directory; "" = the current
  // directory); `schema` is the raw input's, the side tables' columns come on top of it.
  static Workflow from_config(const json& config, const io::Schema& schema,
                              const std::string& base_dir = "");
  // Reloads a fitted workflow (the output of to_json()).
  static Workflow from_json(const json& j);
  static Workflow load(const std::string& path);  // reads workflow.json

  Workflow(Workflow&&) noexcept;
  Workflow& operator=(Workflow&&) noexcept;
  ~Workflow();

  // Passes over the training data that fit() needs: one per fitted op in the longest column
  // chain (a Normalize after a Categorify-free chain needs 1), and at least 1 (statistics).
  int num_fit_passes() const;
  // Fits in one streaming pass; throws if num_fit_passes() > 1. Memory is bounded by the
  // vocabulary sizes, not by the number of rows.
  void fit(const ChunkSource& next_chunk);
  // Fits in num_fit_passes() passes; `open_pass()` returns a fresh source over the same rows.
  void fit_multipass(const std::function<ChunkSource()>& open_pass);
  // The same fit from batches of chunks (run_etl). Same fitted state as fit_multipass over the
  // same rows: each column (and feature op) is a strand that sees the chunks in input order.
  // window 1: one fork-join per batch (one task per column walks all the chunks of the batch;
  // the next batch starts when the slowest column is done). window W > 1: no barrier between
  // batches: up to W batches are in flight, each column strand goes through them in order on
  // its own, so the columns may be on different batches, and a batch is given up once every
  // strand and side task is done with it (the source's next call may then reuse its chunks).
  // `side` (optional): the caller's work run alongside each batch (FitSideWork).
  void fit_batches(const std::function<ChunkBatchSource()>& open_pass,
                   FitSideWork* side = nullptr, int window = 1);
  bool fitted() const;
  // Bounds the memory of the next fit: the Categorify count tables together grow by at most
  // half of `budget_bytes`; past that they spill sorted (key, count) runs into `spill_dir` and
  // merge them at the end of the pass (exact: the same vocabulary as in memory). 0: no bound.
  void set_fit_memory(int64_t budget_bytes, const std::string& spill_dir);
  // Spill runs and bytes written by the fits since set_fit_memory (0, 0 without a budget).
  std::pair<int64_t, int64_t> fit_spill_stats() const;

  // Encodes `in` into `out` (replacing its contents). Const and thread-safe; parallel over
  // columns and rows. Throws if a dense value is not finite after its ops (naming the column
  // and the line) or a one-hot column holds several values in a row.
  // Filter ops drop rows only when `kept` is given: it then receives, for each output row,
  // its row index in `in` (run_etl uses it to keep the train/valid split by input position).
  // Without it every row is encoded (serving answers every request row).
  // With `append`, the rows are added after those already in `out` (same layout) instead of
  // replacing them; `kept` still indexes `in`.
  // `train` (run_etl): the first train->rows input rows of `in` are training rows, the first
  // kept one being training row train->first (in fit order, after filtering); k-fold
  // TargetEncoding encodes them out of fold. Needs `kept` when the workflow has Filter ops.
  void transform(const io::RawChunk& in, io::Batch& out, std::vector<int64_t>* kept = nullptr,
                 bool append = false, const TrainRows* train = nullptr) const;

  // Whether the workflow has Filter ops (which make a chunk's output rows depend on its input).
  bool has_filters() const;

  io::ShardLayout output_layout() const;  // requires fitted()
  std::vector<std::string> dense_names() const;  // output dense features, in order
  std::vector<std::string> cat_names() const;    // output categorical features, in order
  // The raw input's schema: what readers, `dlrec predict` and the server parse (without the
  // columns side tables add).
  const io::Schema& schema() const;
  const json& config() const;
  // The label's column: the config's "label", else the schema's label column ("" if none).
  std::string label_name() const;
  // The dense column the label is derived from ("label": a column's value after its ops; not a
  // feature then), or "" when the label is the schema's label column, copied as read. Serving
  // does not need it in a request: without labels (an empty RawChunk::label) it is not computed.
  std::string derived_label_column() const;  // the pipeline config it was built from

  // The fitted state: schema, config, per-column ops with parameters and state (vocabularies,
  // mean/std), output layout. from_json(to_json()) transforms bit-identically.
  json to_json() const;
  void save(const std::string& path) const;  // atomic
  // Statistics of the raw training columns seen by the first fit pass (stats.json "columns").
  json fit_stats() const;

 private:
  struct Impl;
  friend class FitParts;  // a fit split across processes (etl/fit_merge.h)
  explicit Workflow(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrec::etl
