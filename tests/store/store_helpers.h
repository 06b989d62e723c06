// Scaffolding shared by the store tests (tests/store): known row values, a complete tier in
// memory, and an encoded inference request of a batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/io/batch.h"
#include "dlrec/store/embedding_store.h"
#ifdef DLREC_WITH_SERVER
#include "dlrec/serve/model_repository.h"
#endif

namespace dlrec::testing {

// Row id of table t: values t * 1000 + id + k / 8 (exact in f32).
inline float value_of(int t, int64_t id, int64_t k) {
  return static_cast<float>(t * 1000 + id) + static_cast<float>(k) / 8;
}

// A complete tier in memory holding value_of rows, for the store's logic without RocksDB.
class ArrayTier final : public store::Tier {
 public:
  explicit ArrayTier(std::vector<store::TableInfo> t) : tables_(std::move(t)) {}
  std::string name() const override { return "array"; }
  bool complete() const override { return true; }
  int64_t memory_bound() const override { return 0; }
  void lookup(int table, const int64_t* ids, int64_t n, float* out, uint8_t* found) override {
    const int64_t dim = tables_[table].dim;
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] == missing_id) continue;
      for (int64_t k = 0; k < dim; ++k) out[i * dim + k] = value_of(table, ids[i], k);
      found[i] = 1;
    }
  }
  int64_t missing_id = -1;  // a row this tier pretends not to hold

 private:
  std::vector<store::TableInfo> tables_;
};

#ifdef DLREC_WITH_SERVER
// An encoded request ("dense", "cat_<t>") of a one-hot batch's rows.
inline serve::InferRequest request_of(const io::Batch& b) {
  serve::InferRequest req;
  req.model = "m";
  auto add = [&](const std::string& name, const std::string& type, std::vector<int64_t> shape,
                 const void* p, size_t bytes) {
    req.storage.emplace_back(static_cast<const char*>(p), bytes);
    req.inputs.push_back({name, type, std::move(shape), req.storage.back()});
  };
  add("dense", "FP32", {b.rows, b.num_dense}, b.dense.data(), b.dense.size() * 4);
  for (int t = 0; t < b.num_cat(); ++t)
    add("cat_" + std::to_string(t), "INT64", {b.rows, 1}, b.cat_indices[t].data(),
        b.cat_indices[t].size() * 8);
  return req;
}
#endif

}  // namespace dlrec::testing
