// Random encoded batches for benchmarks and tests (not the datagen text generator): a fixed
// number of ids per categorical feature (one unless a hotness is given), uniform or
// log-uniform ("zipf": P(id) ~ 1 / (id + 1)), dense values shaped like Criteo's after
// log(1 + x), labels positive with probability 0.25.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dlrec/io/batch.h"
#include "dlrec/io/shard.h"

namespace dlrec::io {

// The 26 categorical cardinalities of the Criteo Kaggle (Display Advertising Challenge) data,
// as used by the MLPerf DLRM v1 benchmark.
const std::vector<int64_t>& criteo_kaggle_cardinalities();

// The MLPerf DLRM v1 model's 26 tables on Criteo 1TB with max_ind_range 40M (187.8M rows).
const std::vector<int64_t>& criteo_1tb_cardinalities();

// The MLPerf DLRM-DCNv2 model's 26 tables (Criteo 1TB multi-hot, max_ind_range 40M: 204M rows)
// and the fixed number of ids per sample of each (its synthetic multi-hot sizes, 214 per row).
const std::vector<int64_t>& mlperf_dcnv2_cardinalities();
const std::vector<int>& mlperf_dcnv2_hotness();

// The layout of a built-in benchmark model's data by name ("kaggle", "criteo_1tb" or
// "mlperf_dcnv2"): 13 dense features and those tables, each capped at `max_rows` rows when
// > 0; `hotness` gets the ids per row of each table (mlperf_dcnv2's; empty: one each).
ShardLayout builtin_layout(const std::string& name, int64_t max_rows, std::vector<int>& hotness);

// Deterministic for a seed, whatever the thread count. `hotness` (empty: one id each) gives
// every row of categorical feature t exactly hotness[t] ids, drawn independently (repeats
// possible); a feature with more than one must be multi_hot in the layout.
Batch random_batch(const ShardLayout& layout, int64_t rows, bool zipf, uint64_t seed,
                   const std::vector<int>& hotness = {});

}  // namespace dlrec::io
