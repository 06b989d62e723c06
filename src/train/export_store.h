// The predictor's side of the tiered embedding store (include/dlrec/store/embedding_store.h):
// which parameters are tables the store can hold, and the staging of a batch's rows.
//
// With a store, the model is built for a staging layout: every stored feature's cardinality is
// the staging capacity C, so its tables are [C, dim]. Before each forward the batch's distinct
// ids of every stored feature are looked up in the store, written into rows 0..u-1 of the
// model's tables, and the batch's ids are replaced by their positions (in order of first
// occurrence). The model then pools the very same floats in the same order as with the whole
// tables: its predictions are bit for bit those of the all-in-memory model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dlrec/io/batch.h"
#include "dlrec/io/shard.h"
#include "dlrec/model/model.h"
#include "dlrec/store/embedding_store.h"

namespace dlrec::train::detail {

// The model's fixed tables: the parameters whose first dimension is a categorical feature's
// cardinality (found by building the model for two tiny layouts and comparing shapes); hashed
// tables (their rows are keyed by raw ids) are not among them.
std::vector<store::TableInfo> find_store_tables(const model::RunConfig& cfg,
                                                const io::ShardLayout& layout);

class StagedTables {
 public:
  StagedTables(std::unique_ptr<store::EmbeddingStore> store, const io::ShardLayout& layout,
               int64_t capacity);
  // The layout the model is built for: stored features have `capacity()` rows.
  io::ShardLayout staging_layout() const;
  int64_t capacity() const { return capacity_; }
  const io::ShardLayout& layout() const { return layout_; }  // the model's own
  void set_capacity(int64_t c) { capacity_ = c; }
  // Finds the model's table tensors (after each build).
  void bind(model::Model& m);
  // Remaps the batch's ids; returns the most distinct ids of one stored feature (the capacity
  // the model needs for it).
  int64_t prepare(const io::Batch& b);
  // Looks the prepared ids up into the bound model's tables; the batch to run.
  const io::Batch& fill();
  bool is_table(const std::string& name) const;
  store::EmbeddingStore& store() { return *store_; }
  // Bytes the staged tables take in the model (capacity x the tables' widths).
  int64_t staging_bytes() const;

 private:
  std::unique_ptr<store::EmbeddingStore> store_;
  io::ShardLayout layout_;
  int64_t capacity_;
  std::vector<int64_t> features_;           // distinct stored features
  std::vector<std::vector<int64_t>> uniq_;  // per entry of features_: distinct ids
  std::vector<float*> table_data_;          // per store table: the model's [C, dim]
  io::Batch staged_;
};

}  // namespace dlrec::train::detail
