// JoinExternal (internal to src/etl): side tables (CSV, TSV, Parquet) left-joined on a key
// column onto every raw chunk before the pipeline's ops, like NVTabular's JoinExternal.
//
// Workflow config (docs/ETL.md, "JoinExternal"):
//   "join_external": [{"path": "users.csv", "on": "user",
//                      "schema": {"format": "csv", "columns": [...]}, "columns": ["age"]}]
// The side table is read whole into memory when the workflow is built, indexed by its key, and
// embedded in workflow.json, so that everything that reloads the fitted workflow (training,
// `dlrec predict`, the server) applies the same join to raw rows carrying only the key.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "dlrec/core/config.h"
#include "dlrec/io/raw_chunk.h"
#include "dlrec/io/schema.h"

namespace dlrec::etl {

// One side table: its rows (without the key column) and an index from key to row.
class SideTable {
 public:
  // Reads the table described by `spec` (a "join_external" entry; `where` locates it in
  // messages). A relative "path" is resolved against `base_dir` (when not empty). `columns`
  // is the schema the table joins onto (the input, then earlier side tables): its key column
  // must be there, one-hot categorical, and no added column may clash with one of its names.
  static SideTable from_config(const json& spec, const std::string& where,
                               const std::string& base_dir, const io::Schema& columns);
  // Reloads an embedded table (the output of to_json()).
  static SideTable from_json(const json& j, const std::string& where, const io::Schema& columns);
  // {"path", "file_bytes", "crc32c", "on", "schema", "columns", "rows", "keys", "dense",
  //  "categorical"}: the whole table (docs/FORMATS.md, workflow.json).
  json to_json() const;
  // {"path", "on", "rows", "columns", "memory_bytes"} for stats.json and the CLI.
  json summary() const;

  const std::string& on() const { return on_; }
  // The columns it adds, in its schema's order (dense and categorical only).
  const std::vector<io::ColumnSpec>& added() const { return added_; }
  int num_dense() const { return static_cast<int>(dense_cols_.size()); }
  int num_cat() const { return static_cast<int>(cat_cols_.size()); }
  // Bytes held in memory (rows, key index).
  int64_t memory_bytes() const;
  // The row holding `key`, -1 when the table has none.
  int64_t find(uint64_t key) const {
    auto it = index_.find(key);
    return it == index_.end() ? -1 : it->second;
  }
  float dense(int64_t row, int j) const { return dense_[row * num_dense() + j]; }
  // Categorical column j of `row`: values [begin, end).
  const uint64_t* cat_begin(int64_t row, int j) const {
    return cat_values_[j].data() + cat_offsets_[j][row];
  }
  const uint64_t* cat_end(int64_t row, int j) const {
    return cat_values_[j].data() + cat_offsets_[j][row + 1];
  }

 private:
  // Checks the key and the added columns against `columns` (the schema joined onto).
  void check_against(const std::string& where, const io::Schema& columns) const;
  // Builds index_ from keys_; a duplicate key is an error naming both rows (`lines`: their
  // source lines; empty: row numbers).
  void build_index(const std::string& where, const std::vector<int64_t>& lines);

  std::string path_;  // as given in the config
  int64_t file_bytes_ = 0;
  uint32_t crc32c_ = 0;
  std::string on_;
  io::Schema schema_;  // the side file's schema
  std::vector<io::ColumnSpec> added_;
  std::vector<std::string> dense_cols_, cat_cols_;  // added, by kind
  int64_t rows_ = 0;
  std::vector<uint64_t> keys_;  // [rows]
  std::vector<float> dense_;    // [rows * num_dense], NaN = missing
  std::vector<std::vector<uint64_t>> cat_values_;
  std::vector<std::vector<int64_t>> cat_offsets_;  // each [rows + 1]
  std::unordered_map<uint64_t, int64_t> index_;
};

// The joins of a workflow, in order: chunks of the input schema in, chunks of the joined schema
// (input columns, then each table's added columns) out.
class JoinPlan {
 public:
  bool empty() const { return tables_.empty(); }
  // Reads the config's "join_external" list (null: none) and extends `schema` (the input's)
  // with the added columns.
  void from_config(const json& list, const std::string& base_dir, io::Schema& schema);
  // Reloads workflow.json's "join_external" list and extends `schema` likewise.
  void from_json(const json& list, io::Schema& schema);
  json to_json() const;
  json summary() const;  // one SideTable::summary() per table
  int64_t memory_bytes() const;
  // `out` = `in` (num_in_dense / num_in_cat columns) with each table's columns added.
  void apply(const io::RawChunk& in, io::RawChunk& out) const;

 private:
  void add(SideTable t, io::Schema& schema);

  std::vector<SideTable> tables_;
  std::vector<int> key_col_;  // categorical column of the joined chunk holding table t's key
  int in_dense_ = 0, in_cat_ = 0;
};

}  // namespace dlrec::etl
